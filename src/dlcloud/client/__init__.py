"""The Python SDK: signed HTTP calls with typed errors. The CLI does everything through it.

from dlcloud.client import Client
c = Client.from_env()            # DLCLOUD_* variables, else ~/.config/dlcloud/config.toml
job = c.jobs.submit({"name": "hello", "command": "echo hi"})
for line in c.jobs.logs("hello", follow=True):
    print(line.text)
"""

from dlcloud.client.base import Client
from dlcloud.client.config import Credentials, load_credentials

__all__ = ["Client", "Credentials", "load_credentials"]
