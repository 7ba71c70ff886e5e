"""Runtime environments: create one from a Python version, requirements and wheels; list, describe, wait, delete.

from dlcloud.client import Client
c = Client.from_env()
c.environments.create("nlp", requirements=["transformers==4.46.0"], inherit=True)
env = c.environments.wait("nlp")            # READY or FAILED, with the error
c.jobs.submit({"name": "train", "command": "python train.py", "environment": "nlp"})
"""

from __future__ import annotations

import builtins
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlcloud.client.jobs import CodeAPI, LogLine
from dlcloud.client.transport import API, Transport
from dlcloud.errors import InvalidArgument, Unavailable
from dlcloud.schemas.environments import Environment, EnvironmentDetail

CODE_ID_RE = re.compile(r"^c-[a-z0-9]{16}$")
FINAL_STATES = ("READY", "FAILED", "UNAVAILABLE", "NOT_BUILT")


class EnvironmentsAPI:
    def __init__(self, t: Transport):
        self._t = t

    def upload_wheel(self, path: Path) -> str:
        """Upload a local ``.whl`` file; returns its code id (for ``create(wheels=...)``)."""
        path = Path(path)
        if not path.name.endswith(".whl") or not path.is_file():
            raise InvalidArgument(f"{path} is not a wheel file (.whl)")
        return CodeAPI(self._t).upload(path, kind="wheel", filename=path.name).id

    def create(
        self,
        name: str,
        *,
        python: str | None = None,
        requirements: Iterable[str] = (),
        wheels: Iterable[Path | str] = (),
        inherit: bool = False,
        index_url: str | None = None,
        extra_index_urls: Iterable[str] = (),
        no_index: bool = False,
        description: str = "",
        image: str | None = None,
    ) -> Environment:
        """Create an environment; it is built in the background (see ``wait``).

        Args:
            name: DNS-1123 label, unique in your tenant; not a built-in's name.
            python: major.minor of an interpreter installed on the server; default the server's own.
            requirements: pip requirement strings (``numpy==2.1``, ``pkg[extra]>=1``, ``pkg @ https://...``).
            wheels: local ``.whl`` files (uploaded first) or code ids of uploaded wheels, installed with the
                requirements.
            inherit: see the server's packages (torch, ...) instead of installing them again.
            index_url, extra_index_urls, no_index: pip's package index options.
            description: free text.
            image: recorded for the Kubernetes executor (bring your own image).

        Returns:
            The environment: ``state`` is BUILDING, or READY when the same spec was built before.

        Raises:
            InvalidArgument: a built-in or bad name, a Python version the server lacks, an unknown wheel.
            AlreadyExists: the name is taken in your tenant.
        """
        wheel_ids = [str(w) if CODE_ID_RE.match(str(w)) else self.upload_wheel(Path(w)) for w in wheels]
        body: dict[str, Any] = {
            "name": name,
            "python": python,
            "requirements": list(requirements),
            "wheels": wheel_ids,
            "inherit": inherit,
            "index_url": index_url,
            "extra_index_urls": list(extra_index_urls),
            "no_index": no_index,
            "description": description,
            "image": image,
        }
        return self._t.read(Environment, "POST", f"{API}/environments", json_body=body)

    def list(self) -> builtins.list[Environment]:
        """The built-ins (``builtin`` true), then your tenant's environments."""
        return self._t.read_list(Environment, f"{API}/environments")

    def get(self, name: str) -> EnvironmentDetail:
        """The environment with its wheels, index options, inherited packages, jobs using it and log tail."""
        return self._t.read(EnvironmentDetail, "GET", f"{API}/environments/{name}")

    def delete(self, name: str) -> None:
        """Delete an environment (refused with InvalidState while a job uses it or while it builds)."""
        self._t.request("DELETE", f"{API}/environments/{name}")

    def logs(self, name: str, *, follow: bool = False, tail: int | None = None) -> Iterator[LogLine]:
        """The latest build's log; ``follow`` streams it until the build ends."""
        params = {"follow": follow or None, "tail": tail}
        url = f"{API}/environments/{name}/logs"
        for raw in self._t.stream_lines(url, params=params, timeout=None if follow else 60):
            if raw:
                yield LogLine.parse(raw)

    def wait(self, name: str, timeout: float | None = None, interval: float = 1.0) -> EnvironmentDetail:
        """Poll until the environment is no longer BUILDING; returns it (check ``state`` and ``error``).

        Raises:
            Unavailable: still building after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            env = self.get(name)
            if env.state in FINAL_STATES:
                return env
            if deadline is not None and time.monotonic() > deadline:
                raise Unavailable(f"environment {name!r} is still building after {timeout:g} s")
            time.sleep(interval)


@dataclass
class RequirementsFile:
    """What a pip requirements file holds, in the terms of ``EnvironmentsAPI.create``."""

    requirements: list[str] = field(default_factory=list)
    wheels: list[Path] = field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    no_index: bool = False


_COMMENT_RE = re.compile(r"(^|\s+)#.*$")
SUPPORTED_OPTIONS = "-r/--requirement, -i/--index-url, --extra-index-url, --no-index"


def read_requirements(
    path: Path, into: RequirementsFile | None = None, _seen: set[Path] | None = None
) -> RequirementsFile:
    """Read a pip requirements file: requirements, local ``.whl`` paths (relative to the file), nested
    ``-r`` files and the index options. Other pip options (``-e``, ``-c``, ``--find-links``, ...) are refused.

    Raises:
        InvalidArgument: the file cannot be read, or holds an option environments do not support.
    """
    out = into if into is not None else RequirementsFile()
    seen = _seen if _seen is not None else set()
    path = Path(path).resolve()
    if path in seen:
        return out
    seen.add(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument(f"cannot read requirements file {path}: {exc.strerror}") from None
    for number, line in _logical_lines(text):
        where = f"{path}:{number}"
        line = _COMMENT_RE.sub("", line).strip()
        if not line:
            continue
        if line.startswith("-"):
            option = re.split(r"[=\s]", line, maxsplit=1)[0]
            value = line[len(option) :].lstrip("= \t")
            if option in ("-r", "--requirement") and value:
                read_requirements(path.parent / value, out, seen)
            elif option in ("-i", "--index-url") and value:
                out.index_url = value
            elif option == "--extra-index-url" and value:
                out.extra_index_urls.append(value)
            elif option == "--no-index":
                out.no_index = True
            else:
                raise InvalidArgument(
                    f"{where}: pip option {option} is not supported in environments (supported: {SUPPORTED_OPTIONS}); "
                    "give local wheels as paths to .whl files or with --wheel"
                )
        elif line.endswith(".whl") and "@" not in line and "://" not in line:
            wheel = (path.parent / line).resolve()
            if not wheel.is_file():
                raise InvalidArgument(f"{where}: wheel {line} not found (looked for {wheel})")
            out.wheels.append(wheel)
        else:
            out.requirements.append(line)
    return out


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Lines with backslash continuations joined, numbered by their first physical line."""
    buf, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not buf:
            start = number
        if raw.endswith("\\"):
            buf += raw[:-1] + " "
            continue
        yield start, buf + raw
        buf = ""
    if buf:
        yield start, buf
