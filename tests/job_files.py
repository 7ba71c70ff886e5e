"""Signals from a test to a running job through the job's own directories.

A sandboxed job with a network namespace of its own sees its directories through overlays that its attempt's
holder mounted (``executors/local/job_view.py``). A file made on the host behind an overlay's back stays unseen by
a job that already looked for it (the overlay keeps the failed lookup), so a test that lets a job go on by making
a file makes it through the holder's mount namespace (``/proc/<pid>/root``), where the job sees it at once; the
file then exists on the host too, as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dlcloud.executors.local import netns_holder


def _holder_views(path: Path) -> list[tuple[int, dict]]:
    """(inside pid, network.json's volumes) of every live holder of an attempt above ``path``."""
    found = []
    for above in path.parents:
        for ready_file in (above / netns_holder.READY_FILE, *above.glob(f"attempt-*/{netns_holder.READY_FILE}")):
            try:
                ready = json.loads(ready_file.read_text())
                config = json.loads((ready_file.parent / netns_holder.CONFIG_FILE).read_text())
            except (OSError, ValueError):
                continue
            pid = ready.get("inside_pid")
            if config.get("volumes") and netns_holder.start_ticks(pid) == ready.get("inside_start_ticks"):
                found.append((pid, config["volumes"]))
    return found


def touch_for_job(path: Path) -> None:
    """Create the file ``path`` in a job's directory so that the job, running or not, sees it."""
    path = Path(os.path.abspath(path))
    for pid, volumes in _holder_views(path):
        for item in volumes["items"]:
            upper = item.get("upper")
            if upper and path.is_relative_to(upper):
                inside = Path(volumes["root"]) / item["name"] / path.relative_to(upper)
                try:
                    (Path(f"/proc/{pid}/root") / inside.relative_to("/")).touch()
                    return
                except OSError:
                    break  # the holder ended meanwhile: its overlays with it
    path.touch()
