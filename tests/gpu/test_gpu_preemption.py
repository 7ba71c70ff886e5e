"""GPU tier (``pytest -m gpu``): preemption on a real GPU.

A low-priority job trains on the host's GPU, holding 8 GiB of its memory; a high-priority job for the same GPU
preempts it. The preemptor must find the GPU's memory given back (the victim's process really gone, not only
its job marked), and the victim resumes on the GPU from its checkpoint (CUDA tensors), runs every step once,
and ends with the loss of a run that was never stopped. Runs only on a machine with an NVIDIA GPU and a CUDA
build of torch; ``make test`` deselects it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.integration.test_distributed_training import _explain, _upload_scripts, _wait_end

pytestmark = pytest.mark.gpu

SCRIPTS = Path(__file__).resolve().parent / "scripts"
STEPS = 40
HOLD_GIB = 8


def _outputs(env, job_id: str) -> Path:
    (found,) = wait_for(lambda: list(env.settings.runs_dir.glob(f"*/{job_id}/outputs")), what="the job's outputs")
    return found


def _steps(out: Path) -> list[tuple[int, int]]:
    log = out / "steps.log"
    if not log.exists():
        return []
    return [
        (int(a.removeprefix("attempt=")), int(s.removeprefix("step=")))
        for a, s in (line.split() for line in log.read_text().splitlines())
    ]


def test_a_job_preempted_on_the_gpu_gives_its_memory_back_and_resumes_there_from_its_checkpoint(gpu_env):
    env, gpus = gpu_env
    c = env.admin
    code = _upload_scripts(c, SCRIPTS)
    train = f"python cuda_steps.py --steps {STEPS} --hold-gib {HOLD_GIB}"
    one_gpu = {"gpus": 1, "memory": "6Gi"}  # host memory: a CUDA process holds ~1 GiB of it
    # every GPU but one taken by a job that waits: the low job and the urgent one meet on the last GPU
    for i in range(len(gpus) - 1):
        c.jobs.submit({"name": f"filler-{i}", "command": "sleep 600", "resources": one_gpu})
    low = c.jobs.submit({"name": "low", "code": code, "command": train, "priority_class": "low", "resources": one_gpu})
    out = _outputs(env, low.id)
    wait_for(lambda: len(_steps(out)) >= 3, timeout=180, what="the low job to train a few steps on the GPU")

    probe = (
        'python -c "import torch; f, t = torch.cuda.mem_get_info(); '
        "print('memory', round(f / 2**30, 1), round(t / 2**30, 1), torch.cuda.get_device_name(0))\""
    )
    c.jobs.submit({"name": "urgent", "command": probe, "priority_class": "high", "resources": one_gpu})
    preempting = wait_for(lambda: (j := c.jobs.get("low")).preempt_requested and j, timeout=60, what="preemption")
    assert preempting.preempt_reason.startswith("preempted by urgent (priority)"), preempting

    urgent = _wait_end(c, "urgent", timeout=300)
    assert urgent.state == "SUCCEEDED", _explain(c, "urgent")
    [line] = [x.text for x in c.jobs.logs("urgent") if x.text.startswith("memory ")]
    free_gib, total_gib = (float(v) for v in line.split()[1:3])
    # the victim's 8 GiB (and its CUDA context) are gone before the preemptor starts on the same GPU
    assert free_gib > total_gib - HOLD_GIB / 2, line

    job = _wait_end(c, "low", timeout=300)
    assert job.state == "SUCCEEDED", _explain(c, "low")
    assert job.preemptions == 1 and job.restarts == 0, _explain(c, "low")
    first, second = job.attempts
    assert (first.outcome, second.outcome) == ("preempted", "succeeded")
    assert first.gpus == second.gpus == urgent.attempts[0].gpus
    assert first.finished_at <= urgent.attempts[0].started_at <= second.started_at
    log = _steps(out)
    steps = [s for _, s in log]
    assert steps == list(range(STEPS)), log  # every step once, in order across the two attempts
    before = [s for a, s in log if a == 1]
    assert before and [s for a, s in log if a == 2][0] == before[-1] + 1, log
    resumed = json.loads((out / "result.json").read_text())
    assert resumed["attempt"] == 2 and resumed["start_step"] == before[-1] + 1 and resumed["steps"] == STEPS

    # the same training never stopped: the resumed run restored weights and optimizer state exactly
    whole = c.jobs.submit({"name": "whole", "code": code, "command": train, "resources": one_gpu})
    assert _wait_end(c, "whole", timeout=300).state == "SUCCEEDED", _explain(c, "whole")
    reference = json.loads((_outputs(env, whole.id) / "result.json").read_text())
    assert reference["attempt"] == 1 and reference["start_step"] == 0
    assert resumed["loss"] == pytest.approx(reference["loss"], rel=1e-5), (resumed, reference)
    for i in range(len(gpus) - 1):
        c.jobs.cancel(f"filler-{i}")
