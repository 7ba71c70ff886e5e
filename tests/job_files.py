"""Signals from a test to a running job through the job's own directories.

A sandboxed job with a network namespace of its own sees its directories through overlays that its attempt's
holder mounted (``executors/local/job_view.py``). A file made on the host behind an overlay's back stays unseen by
a job that already looked for it (the overlay keeps the failed lookup), so a test that lets a job go on by making
a file makes it through the holder's mount namespace (``/proc/<pid>/root``), where the job sees it at once; the
file then exists on the host too, as before. Where the attempt has no such holder (no sandbox, the host's
network), the file is made on the host.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dlcloud.executors.base import REPLICAS_DIR
from dlcloud.executors.local import launcher, netns_holder

WAIT_SECONDS = 120.0


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _attempt_dir(path: Path) -> Path | None:
    """The attempt whose directory ``path`` is in: an attempt directory above it, or the newest attempt of the
    job whose directory (checkpoints, outputs) holds it."""
    for above in path.parents:
        if (above / launcher.WORKLOAD_FILE).exists() or (above / netns_holder.CONFIG_FILE).exists():
            return above
        attempts = [a for a in above.glob("attempt-*") if a.name.removeprefix("attempt-").isdigit()]
        if attempts:
            return max(attempts, key=lambda a: int(a.name.removeprefix("attempt-")))
    return None


def _launched(attempt: Path) -> bool:
    return (attempt / launcher.WORKLOAD_FILE).exists() or any(
        (attempt / REPLICAS_DIR).glob(f"*/{launcher.WORKLOAD_FILE}")
    )


def _wait(what: str, check: Any) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_SECONDS:g} s waiting for {what}")
        time.sleep(0.02)
    return value


def touch_for_job(path: Path) -> None:
    """Create the file ``path`` in a directory of a job that is being started or runs, so that the job sees it.
    Waits for the attempt's launcher (and, where it has one, its holder), so that the choice between the holder's
    view and the host's is never made too early."""
    path = Path(os.path.abspath(path))
    attempt = _wait(f"the attempt of {path}", lambda: _attempt_dir(path))
    _wait(f"the launcher of {attempt}", lambda: _launched(attempt))
    config = _read(attempt / netns_holder.CONFIG_FILE) or {}
    volumes = config.get("volumes")
    if volumes:
        ready = _wait(
            f"the holder of {attempt}",
            lambda: _read(attempt / netns_holder.READY_FILE) or (attempt / netns_holder.FAILED_FILE).exists(),
        )
        if isinstance(ready, dict):
            for item in volumes["items"]:
                upper = item.get("upper")
                if upper and path.is_relative_to(upper):
                    inside = Path(volumes["root"]) / item["name"] / path.relative_to(upper)
                    try:
                        (Path(f"/proc/{ready['inside_pid']}/root") / inside.relative_to("/")).touch()
                        return
                    except OSError:
                        break  # the holder ended meanwhile, and its overlays with it
    path.touch()
