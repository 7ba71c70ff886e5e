"""The Python SDK: signed HTTP calls with typed errors, answers read into the read models of
``dlcloud.schemas`` (``Job``, ``ModelVersion``, ...). The CLI does everything through it.

from dlcloud.client import Client
c = Client.from_env()            # DLCLOUD_* variables, else ~/.config/dlcloud/config.toml
job = c.jobs.submit({"name": "hello", "command": "echo hi"})   # a Job; job.state, job.id
for line in c.jobs.logs("hello", follow=True):
    print(line.text)
"""

from dlcloud.client.base import Client
from dlcloud.client.config import Credentials, load_credentials

__all__ = ["Client", "Credentials", "load_credentials"]
