"""What this host offers: GPUs (NVML, then nvidia-smi, else none), CPUs and memory."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mb: int = 0
    node: str = ""  # the machine it is in: a process's GPUs are all on one node (one host: all the same)


@dataclass(frozen=True)
class Inventory:
    host: str
    gpus: tuple[Gpu, ...]
    cpus: float
    memory: int

    def gpus_matching(self, gpu_type: str | None) -> list[Gpu]:
        if not gpu_type:
            return list(self.gpus)
        want = gpu_type.lower()
        return [g for g in self.gpus if want in g.name.lower()]


def _detect_nvml() -> list[Gpu] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            gpus.append(Gpu(i, name, int(mem)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _detect_nvidia_smi() -> list[Gpu] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return None
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            gpus.append(
                Gpu(int(parts[0]), parts[1], int(float(parts[2])) if parts[2].replace(".", "").isdigit() else 0)
            )
    return gpus


def detect_gpus() -> list[Gpu]:
    for detect in (_detect_nvml, _detect_nvidia_smi):
        found = detect()
        if found is not None:
            return found
    return []


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024**3


def build_inventory(
    declared_gpus: list[tuple[int, str, int]] | None,
    cpus: float | None,
    memory: int | None,
    host: str | None,
) -> Inventory:
    """The inventory from settings, detecting what was not declared."""
    if declared_gpus is not None:
        gpus = [Gpu(i, n, m) for i, n, m in declared_gpus]
    else:
        gpus = detect_gpus()
    inv = Inventory(
        host=host or socket.gethostname(),
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        cpus=float(cpus if cpus is not None else (os.cpu_count() or 1)),
        memory=int(memory if memory is not None else physical_memory()),
    )
    log.info(
        "inventory: %d GPU(s) %s, %.1f CPUs, %d bytes memory",
        len(inv.gpus),
        [g.name for g in inv.gpus],
        inv.cpus,
        inv.memory,
    )
    return inv
