"""Schemathesis hooks for ``tests/fuzz/run.py``: sign every request, tame the ones that would do real work,
and log each status.

Loaded by the Schemathesis CLI through ``SCHEMATHESIS_HOOKS``; the run script passes, in the environment,
``DLCLOUD_FUZZ_ACCESS_KEY`` / ``DLCLOUD_FUZZ_SECRET_KEY`` (whom to sign as), ``DLCLOUD_FUZZ_WHO`` (a label)
and ``DLCLOUD_FUZZ_LOG`` (a file that gets one ``who method path status`` line per response).

Taming: a job that the server would accept runs ``true`` (and its pre/post commands ``true``); an
environment that it would accept installs nothing and reads no package index (it would otherwise download
whatever package names Hypothesis made up). Bodies the server refuses are sent as generated.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any
from urllib.parse import unquote, urlsplit

import requests
import schemathesis
from pydantic import ValidationError

from dlcloud import signing
from dlcloud.schemas.environments import EnvironmentCreate
from dlcloud.schemas.jobs import JobSpec


class Signed(requests.auth.AuthBase):
    """Signs the request as it is sent (the body as serialised), as docs/api-auth.md describes."""

    def __init__(self, access_key: str, secret_key: str):
        self.access_key = access_key
        self.secret_key = secret_key

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        url = urlsplit(r.url or "")
        body = r.body or b""
        if isinstance(body, str):
            body = body.encode()
        headers = signing.sign_request(
            self.access_key,
            self.secret_key,
            r.method or "GET",
            unquote(url.path),
            url.query,
            hashlib.sha256(body).hexdigest(),
        ).headers
        r.headers.update(headers)
        return r


AUTH = Signed(os.environ["DLCLOUD_FUZZ_ACCESS_KEY"], os.environ["DLCLOUD_FUZZ_SECRET_KEY"])
WHO = os.environ.get("DLCLOUD_FUZZ_WHO", "caller")
LOG = os.environ.get("DLCLOUD_FUZZ_LOG")


def _tame(case: schemathesis.Case) -> None:
    if case.method != "POST" or not isinstance(case.body, dict):
        return
    if case.path == "/api/v1/jobs":
        try:
            JobSpec.model_validate(case.body)
        except ValidationError:
            return
        if case.body.get("command") is not None:
            case.body["command"] = "true"
        for phase in ("pre_command", "post_command"):
            if case.body.get(phase) is not None:
                case.body[phase] = "true"
    elif case.path == "/api/v1/environments":
        try:
            EnvironmentCreate.model_validate(case.body)
        except ValidationError:
            return
        for field in ("requirements", "wheels", "index_url", "extra_index_urls"):
            case.body.pop(field, None)
        case.body["no_index"] = True


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]) -> None:
    _tame(case)
    kwargs["auth"] = AUTH


@schemathesis.hook
def after_call(context: schemathesis.HookContext, case: schemathesis.Case, response: schemathesis.Response) -> None:
    if LOG:
        with open(LOG, "a") as out:
            out.write(f"{WHO} {case.method} {case.operation.path} {response.status_code}\n")
