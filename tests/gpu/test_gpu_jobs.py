"""GPU tier (``pytest -m gpu``): real GPU detection and exclusive assignment through CUDA_VISIBLE_DEVICES.

Runs only on a machine with an NVIDIA GPU and a CUDA build of torch; ``make test`` deselects it.
"""

from __future__ import annotations

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.gpu


def test_job_sees_exactly_its_gpu_and_computes_on_it(gpu_env):
    env, gpus = gpu_env
    assert [g.index for g in env.platform.inventory.gpus] == [g.index for g in gpus]
    c = env.admin
    script = (
        'python -c "import torch; assert torch.cuda.is_available(); '
        "x = torch.randn(512, 512, device='cuda'); "
        "print('devices', torch.cuda.device_count(), float((x @ x).sum()) != 0)\""
    )
    c.jobs.submit({"name": "on-gpu", "command": script, "resources": {"gpus": 1}})
    job = wait_for(lambda: (j := c.jobs.get("on-gpu")).state in ("SUCCEEDED", "FAILED") and j, timeout=300)
    lines = [x.text for x in c.jobs.logs("on-gpu")]
    assert job.state == "SUCCEEDED", lines
    assert "devices 1 True" in lines
    assert len(job.attempts[0].gpus) == 1


def test_sandboxed_job_holds_only_its_gpu_device_nodes(gpu_env):
    """The sandbox binds /dev/nvidia<N> of the assigned GPUs only: a job without GPUs has none at all."""
    env, gpus = gpu_env
    c = env.admin
    probe = (
        "python -c \"import glob, torch; print('nodes', sorted(glob.glob('/dev/nvidia[0-9]*'))); "
        "print('cuda', torch.cuda.is_available(), torch.cuda.device_count())\""
    )
    c.jobs.submit({"name": "with-gpu", "command": probe, "resources": {"gpus": 1}})
    c.jobs.submit({"name": "without-gpu", "command": probe})
    for name in ("with-gpu", "without-gpu"):
        wait_for(lambda n=name: c.jobs.get(n).state in ("SUCCEEDED", "FAILED"), timeout=300)
    with_gpu = [x.text for x in c.jobs.logs("with-gpu")]
    [assigned] = c.jobs.get("with-gpu").attempts[0].gpus
    assert f"nodes ['/dev/nvidia{assigned}']" in with_gpu, with_gpu
    assert "cuda True 1" in with_gpu, with_gpu
    without = [x.text for x in c.jobs.logs("without-gpu")]
    assert "nodes []" in without and "cuda False 0" in without, without
