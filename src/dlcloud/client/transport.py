"""HTTP transport: signing every request, mapping error bodies back to DlcloudError classes, reading answers into
the read models of ``dlcloud.schemas``. Every sub-API of the SDK (``jobs.py``, ``models.py``, ...) is built on one
``Transport``; ``base.Client`` composes them.

Invariant: a public SDK call returns the read model its route declares (``read``, ``read_list``), never a
dict; a request model the caller gives as a mapping is validated here first (``spec_body``), and a refusal is
the same ``validation_error`` the server would answer.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlencode, urlsplit

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from dlcloud import signing
from dlcloud.client.config import Credentials
from dlcloud.errors import DlcloudError, Unavailable, error_from_body
from dlcloud.schemas.errors import validation_problems

API = "/api/v1"
CHUNK = 1024 * 1024

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


def spec_body(model: type[R], spec: R | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a request model given as the model or as a mapping: what was set, nothing added, so the
    server reads what the caller wrote.

    Raises:
        DlcloudError (code validation_error, as the server's): the mapping is not a valid ``model``.
    """
    if not isinstance(spec, model):
        try:
            spec = model.model_validate(spec)
        except ValidationError as exc:
            raise validation_error(exc) from None
    return spec.model_dump(mode="json", exclude_unset=True)


@functools.cache
def _list_of(model: type[BaseModel]) -> TypeAdapter[list[Any]]:
    """The validator of a list of ``model`` (built once per model: building one costs more than a call)."""
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def validation_error(exc: ValidationError) -> DlcloudError:
    """The error the server answers for a body ``exc`` refuses (code ``validation_error``, status 422)."""
    message, details = validation_problems(exc.errors())
    return error_from_body(422, {"error": {"code": "validation_error", "message": message, "details": details}})


def _query_string(params: dict[str, Any] | None) -> str:
    if not params:
        return ""
    pairs: list[tuple[str, str]] = []
    for k, v in params.items():
        if v is None:
            continue
        values = v if isinstance(v, list | tuple) else [v]
        for item in values:
            if isinstance(item, bool):
                item = "true" if item else "false"
            pairs.append((k, str(item)))
    return urlencode(pairs)


def _url(path: str, query: str) -> str:
    """What to send for the decoded ``path`` (the one signed): percent-encoded, so a '?', '#' or '%' in a
    name stays in the path (docs/api-auth.md)."""
    return signing.url_path(path) + (f"?{query}" if query else "")


class Transport:
    def __init__(self, creds: Credentials, timeout: float = 60.0, client: httpx.Client | None = None):
        self.creds = creds
        self._http = client or httpx.Client(base_url=creds.endpoint, timeout=timeout)
        self._base_path = unquote(urlsplit(creds.endpoint).path.rstrip("/"))  # signed decoded, as any path

    def close(self) -> None:
        self._http.close()

    def _signed(self, method: str, path: str, query: str, body_sha256: str) -> dict[str, str]:
        full_path = self._base_path + path
        return signing.sign_request(
            self.creds.access_key, self.creds.secret_key, method, full_path, query, body_sha256
        ).headers

    def _raise_for(self, resp: httpx.Response) -> None:
        if resp.status_code < 400:
            return
        try:
            body = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = resp.text
        raise error_from_body(resp.status_code, body)

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, json_body: Any = None) -> Any:
        query = _query_string(params)
        content = b"" if json_body is None else json.dumps(json_body).encode()
        headers = self._signed(method, path, query, hashlib.sha256(content).hexdigest())
        if json_body is not None:
            headers["Content-Type"] = "application/json"
        url = _url(path, query)
        try:
            resp = self._http.request(method, url, content=content or None, headers=headers)
        except httpx.TransportError as exc:
            raise Unavailable(f"cannot reach {self.creds.endpoint}: {exc}") from None
        self._raise_for(resp)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def read(
        self,
        model: type[M],
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
    ) -> M:
        """``request``'s answer as the read model ``model``."""
        return model.model_validate(self.request(method, path, params=params, json_body=json_body))

    def read_list(self, model: type[M], path: str, *, params: dict[str, Any] | None = None) -> list[M]:
        """A GET answering a JSON list, as a list of ``model``."""
        answer: list[M] = _list_of(model).validate_python(self.request("GET", path, params=params))
        return answer

    def upload(
        self,
        model: type[M],
        path: str,
        file: Path,
        *,
        params: dict[str, Any] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> M:
        """Stream a file: hash it first (streaming), sign the declared hash, then send it in chunks; the answer
        as the read model ``model``."""
        digest = hashlib.sha256()
        with file.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        query = _query_string(params)
        headers = self._signed("POST", path, query, digest.hexdigest())
        headers["Content-Type"] = "application/octet-stream"
        headers["Content-Length"] = str(file.stat().st_size)

        def body() -> Iterator[bytes]:
            with file.open("rb") as f:
                while chunk := f.read(CHUNK):
                    if progress:
                        progress(len(chunk))
                    yield chunk

        try:
            resp = self._http.post(_url(path, query), content=body(), headers=headers)
        except httpx.TransportError as exc:
            raise Unavailable(f"cannot reach {self.creds.endpoint}: {exc}") from None
        self._raise_for(resp)
        return model.model_validate(resp.json())

    def download(
        self,
        path: str,
        dest: Path,
        *,
        params: dict[str, Any] | None = None,
        progress: Callable[[int], None] | None = None,
        timeout: float | None = None,
    ) -> httpx.Headers:
        """Stream a GET response body into the file ``dest``; returns the response headers."""
        with self._streamed_get(path, params, timeout) as resp, dest.open("wb") as f:
            for chunk in resp.iter_bytes(CHUNK):
                f.write(chunk)
                if progress:
                    progress(len(chunk))
            return resp.headers

    def stream_lines(
        self, path: str, *, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Iterator[str]:
        with self._streamed_get(path, params, timeout) as resp:
            yield from resp.iter_lines()

    @contextlib.contextmanager
    def _streamed_get(
        self, path: str, params: dict[str, Any] | None, timeout: float | None
    ) -> Iterator[httpx.Response]:
        """A signed GET whose body is read while it arrives: an error answer raises its DlcloudError before the body
        is given out, and a connection lost before or while it is read raises Unavailable."""
        query = _query_string(params)
        headers = self._signed("GET", path, query, signing.EMPTY_SHA256)
        try:
            with self._http.stream("GET", _url(path, query), headers=headers, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._raise_for(resp)
                yield resp
        except httpx.TransportError as exc:
            raise Unavailable(f"lost the connection to {self.creds.endpoint}: {exc}") from None
