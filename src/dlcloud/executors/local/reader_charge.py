"""The event-file reader's CPU charged to the job whose files it reads (docs/metrics.md), on this host.

Each run of the reader (``executors/event_files.py``) gets a cgroup of its own with the job's CPU quota: cgroup v2
where ours is delegated (``cpu.max`` in ``<own cgroup>/<name>``), else v1 as root (``<root>/cpu/<name>``), made
with ``launch_limits`` as a job's own are, and removed once the reader is gone. So reading a job's files
may use at most as much CPU as the job itself may (``cpus``), never less than ``READER_MIN_CPUS``: the reader's
start alone costs most of a CPU-second, which a job of 0.01 CPU would stretch past the reader's wall-time limit.
Where neither cgroup version is usable, the reader runs under ``nice``, its weight scaled to the job's CPUs
(each nice step is about 1.25 times less CPU under contention: nice 10 for a tenth of a CPU, 19 at most).

The reader joins its cgroup through ``/bin/sh`` before it execs the rest of its argv (the sandbox, then Python),
so everything it starts is in it: no function runs between fork and exec in the (threaded) control plane.
Names are random, as a job's are: nothing in ``/sys/fs/cgroup`` says whose reader it is.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Iterator

from dlcloud.executors.local import launch_limits

READER_MIN_CPUS = 0.25
MAX_NICE = 19
# join the cgroup named by $1 (best effort: the reader runs anyway, as it would where none can be made), then exec
JOIN = '{ echo $$ > "$1/cgroup.procs"; } 2>/dev/null; shift; exec "$@"'


def reader_cpus(cpus: float) -> float:
    """The CPU quota of a reader of a job of ``cpus`` CPUs (one thread: at most one CPU)."""
    return min(1.0, max(READER_MIN_CPUS, cpus))


def nice_for(cpus: float) -> int:
    """The niceness that gives a process about ``cpus`` of a CPU next to one at nice 0 (no more than 19)."""
    if cpus >= 1.0:
        return 0
    return min(MAX_NICE, round(math.log(1.0 / max(cpus, 1e-6), 1.25)))


def _cgroup(cpus: float) -> str | None:
    """A new cgroup with a quota of ``cpus`` (its CPU controller's directory), or None where none can be made."""
    name = f"dlcloud-{os.urandom(8).hex()}"
    path = launch_limits.create_cgroup(name, cpus, 0)
    if path is not None:
        return path
    if os.geteuid() != 0:
        return None
    dirs = launch_limits.create_cgroups_v1(name, cpus, 0) or []
    cpu = next((d for d in dirs if os.path.basename(os.path.dirname(d)) == "cpu"), None)
    for d in dirs:
        if d != cpu:
            launch_limits.remove_cgroup(d)
    return cpu


@contextlib.contextmanager
def charged(cpus: float) -> Iterator[list[str]]:
    """The argv prefix of one reader run charged to a job of ``cpus`` CPUs; its cgroup goes when it is left."""
    path = _cgroup(reader_cpus(cpus))
    if path is None:
        nice = shutil.which("nice")
        yield [nice, "-n", str(nice_for(cpus))] if nice is not None and nice_for(cpus) else []
        return
    try:
        yield ["/bin/sh", "-c", JOIN, "sh", path]
    finally:
        launch_limits.remove_cgroup(path)  # the reader's processes are gone: their session was killed
