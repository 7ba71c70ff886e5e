"""The GPU tier's platform: the in-process API and control loop on the local executor, with the host's GPUs as
detected (NVML, else nvidia-smi) instead of a declared inventory."""

from __future__ import annotations

import threading

import pytest

from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.scheduler.inventory import detect_gpus
from dlcloud.store.db import migrate
from tests.conftest import build_env, make_settings


@pytest.fixture
def gpu_env(tmp_path):
    """(the environment, the detected GPUs); a stop's grace period long enough for a CUDA job to save and exit."""
    gpus = detect_gpus()
    if not gpus:
        pytest.fail("the GPU tier was asked for but no NVIDIA GPU was detected (NVML / nvidia-smi)")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate(url)
    settings = make_settings(tmp_path, url, gpu_inventory=None, cpu_capacity=None, stop_grace_seconds=30.0)
    env = build_env(settings, LocalExecutor())
    stop = threading.Event()
    t = threading.Thread(target=env.control.run, args=(stop,), daemon=True)
    t.start()
    with env.http:
        yield env, gpus
    stop.set()
    env.control.wake()
    t.join(timeout=10)
