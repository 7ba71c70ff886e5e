"""The GPU tier's platform: the in-process API and control loop on the local executor, with the host's GPUs as
detected (NVML, else nvidia-smi) instead of a declared inventory."""

from __future__ import annotations

import pytest

from dlcloud.scheduler.inventory import detect_gpus
from dlcloud.store.db import migrate
from tests.integration.test_distributed_training import _platform


@pytest.fixture
def gpu_env(tmp_path):
    """(the environment, the detected GPUs); a stop's grace period long enough for a CUDA job to save and exit."""
    gpus = detect_gpus()
    if not gpus:
        pytest.fail("the GPU tier was asked for but no NVIDIA GPU was detected (NVML / nvidia-smi)")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate(url)
    with _platform(tmp_path, url, gpu_inventory=None, cpu_capacity=None, stop_grace_seconds=30.0) as env:
        yield env, gpus
