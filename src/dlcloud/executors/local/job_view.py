"""Where a sandboxed job sees its directories, and what its mounts say of the host.

A sandboxed job sees the same neutral paths on every host, whatever the data directory's layout:

    /job/code         its code, unpacked (the working directory of every phase)
    /job/packages     its package, installed by pip (on PYTHONPATH)
    /job/files        read-only files the executor wrote for it (a gang replica's MPI hostfile, its package)
    /job/checkpoints  DLCLOUD_CHECKPOINT_DIR, kept across its attempts
    /job/outputs      DLCLOUD_OUTPUT_DIR
    /job/tensorboard  DLCLOUD_TENSORBOARD_DIR (a gang replica's is /job/tensorboard/<replica>)
    /tmp              its own temporary directory
    /datasets/<name>  each dataset it named, read-only

Each of these is a *volume*: a directory on the host bound at its neutral path. With a network namespace of its
own (``job_network=private``, the default) the attempt's holder (``netns_holder.py``) also makes a mount namespace
where each volume is an overlay whose layers are named ``/proc/self/fd/N`` and whose root is ``/``, and the sandbox
binds those: a job's ``/proc/self/mountinfo`` then names neither the data directory nor a job or tenant id, and
the files it writes land in the host directory as they always did (the overlay's only writable layer; its lower
layer is empty). Without a namespace of its own the sandbox binds the host directories themselves, at the same
neutral paths (mountinfo then shows their host paths as the source).

The replicas of a gang share the holder, so they share one overlay per shared volume (checkpoints, outputs,
TensorBoard, datasets): what one replica writes, the others see at once. Their own volumes are prefixed with the
replica's name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlcloud.executors.base import REPLICAS_DIR, Replica

JOB_ROOT = "/job"
CODE_AT, PACKAGES_AT, FILES_AT = f"{JOB_ROOT}/code", f"{JOB_ROOT}/packages", f"{JOB_ROOT}/files"
DATASETS_AT = "/datasets"  # each dataset at /datasets/<name>
# the job's own directories (kept across attempts), by their name under the job's directory on the host
JOB_DIRS = ("checkpoints", "outputs", "tensorboard")
# the attempt's own ones (a gang replica's: under its directory), by their name there
ATTEMPT_DIRS = {"code": CODE_AT, "packages": PACKAGES_AT, "files": FILES_AT, "tmp": "/tmp"}
FILES = "files"

VOLUMES_DIR = "volumes"  # the holder's tmpfs, in the attempt's (the gang's) directory
WORK_DIR = "volumes-work"  # the overlays' work directories (the kernel's scratch space, same filesystem)
EMPTY_DIR = "volumes-empty"  # every overlay's empty lower layer


def job_dir_at(name: str) -> str:
    """Where a sandboxed job sees its directory ``name`` (one of JOB_DIRS)."""
    return f"{JOB_ROOT}/{name}"


@dataclass(frozen=True)
class Volume:
    name: str  # unique in the attempt (a gang replica's own are "<replica>.<dir>")
    host: Path  # the directory on the host
    dest: str  # where the job sees it
    writable: bool


def launcher_dirs(attempt_dir: Path, replicas: Sequence[Replica]) -> list[Path]:
    """The directory of each launcher of the attempt: a gang replica's own below it, else the attempt's."""
    return [attempt_dir / REPLICAS_DIR / r.name for r in replicas] or [attempt_dir]


def attempt_volumes(
    attempt_dir: Path, data_dirs: tuple[Path, ...], mounts: tuple[tuple[Path, str], ...], replica: str = ""
) -> list[Volume]:
    """The volumes of one launcher's sandbox: the attempt's (or, with ``replica``, that replica's) own
    directories, the job's directories among ``data_dirs`` (those nested in another are inside it), and the
    read-only ``mounts`` (datasets)."""
    prefix = f"{replica}." if replica else ""
    out = [
        Volume(f"{prefix}{name}", attempt_dir / name, dest, writable=name != FILES)
        for name, dest in ATTEMPT_DIRS.items()
    ]
    for d in data_dirs:
        if d.name in JOB_DIRS and not any(p in data_dirs for p in d.parents):
            out.append(Volume(d.name, d, job_dir_at(d.name), writable=True))
    out += [Volume(f"dataset-{i}", Path(src), dest, writable=False) for i, (src, dest) in enumerate(mounts)]
    return out


def holder_volumes(net_dir: Path, volumes: list[Volume], files: dict[str, str]) -> dict[str, object]:
    """network.json's ``volumes``: what the holder mounts in its tmpfs (``netns_holder.mount_volumes``). Makes the
    overlays' empty lower layer and their work directories (each writable volume's own, in the attempt's
    directory: on the filesystem of the job's directories, as the kernel requires)."""
    empty = net_dir / EMPTY_DIR
    root = net_dir / VOLUMES_DIR
    for d in (root, empty, net_dir / WORK_DIR):
        d.mkdir(mode=0o700, exist_ok=True)
    items: list[dict[str, object]] = []
    seen: set[str] = set()
    for v in volumes:
        if v.name in seen:
            continue
        seen.add(v.name)
        item: dict[str, object] = {"name": v.name, "lowers": [str(empty)] if v.writable else [str(v.host), str(empty)]}
        if v.writable:
            work = net_dir / WORK_DIR / v.name
            work.mkdir(mode=0o700, exist_ok=True)
            item.update(upper=str(v.host), work=str(work))
        items.append(item)
    return {"root": str(root), "items": items, "files": files}


def source(v: Volume, net_dir: Path | None) -> Path:
    """What the sandbox binds at ``v.dest``: the holder's overlay (with a network namespace), else the host
    directory."""
    return net_dir / VOLUMES_DIR / v.name if net_dir is not None else v.host


def remove_work_dirs(net_dir: Path) -> None:
    """The overlays' work directories, once the attempt is over: the kernel leaves a ``work`` directory of mode
    000 in each, which would stop a plain ``rmtree`` of the attempt's directory."""
    base = net_dir / WORK_DIR
    if not base.is_dir():
        return
    for inner in base.glob("*/work"):
        with contextlib.suppress(OSError):
            if stat.S_IMODE(inner.lstat().st_mode) != 0o700 and not inner.is_symlink():
                os.chmod(inner, 0o700)
    shutil.rmtree(base, ignore_errors=True)
