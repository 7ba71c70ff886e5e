"""A preemptible DDP trainer that checkpoints after every step and stops cleanly on SIGTERM (gloo, CPU).

    torchrun --nproc_per_node 2 preemptible_steps.py --steps 30 --out /tmp/out --checkpoint-dir /tmp/ckpt

Each step: a forward/backward pass of a small linear model on a fixed batch, DDP's allreduce, an optimizer step,
``--step-sleep`` seconds of "work"; then rank 0 writes the checkpoint (weights, optimizer, next step), renamed
into place, and every rank appends ``attempt=A step=S`` to ``steps-rank<R>.log`` once the checkpoint holding
step S is in place. A step is in the log only when it is saved, so a run that resumes never runs it again.

``--hold-first-attempt-after K``: the first attempt waits after K saved steps until it is stopped (a test's
preemption then always finds it running).

SIGTERM (the platform preempting or cancelling the job) only sets a flag: after the step in progress is saved,
the ranks agree (allreduce MAX of the flag) and all exit with code 143 at the same step, losing nothing. A run
that finds a checkpoint resumes after its step. At the end each rank writes ``result-rank<R>.json``.
Nothing here imports dlcloud.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STOPPED_EXIT_CODE = 143


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--step-sleep", type=float, default=0.2)
    # a test's preemption must come while the first attempt runs, however slow the machine: after this many saved
    # steps the first attempt waits (its ranks polling the stop flag together) until it is stopped
    ap.add_argument("--hold-first-attempt-after", type=int, default=None)
    ap.add_argument("--checkpoint-dir", default=os.environ.get("DLCLOUD_CHECKPOINT_DIR") or "ckpt")
    ap.add_argument("--out", default=os.environ.get("DLCLOUD_OUTPUT_DIR") or "out")
    args = ap.parse_args()

    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("DLCLOUD_ATTEMPT", "1"))
    out, ckpt_dir = Path(args.out), Path(args.checkpoint_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / "steps.pt"

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["next_step"])
    ddp = DistributedDataParallel(model)
    g = torch.Generator().manual_seed(1 + rank)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    log = out / f"steps-rank{rank}.log"
    print(f"rank {rank}/{world} attempt {attempt} starts at step {start}", flush=True)

    step = start
    while step < args.steps:
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        time.sleep(args.step_sleep)
        if rank == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "next_step": step + 1}, tmp)
            os.replace(tmp, ckpt)
        dist.barrier()  # the checkpoint of this step is in place for every rank
        with log.open("a") as f:
            f.write(f"attempt={attempt} step={step}\n")
        step += 1
        hold = attempt == 1 and args.hold_first_attempt_after is not None and step >= args.hold_first_attempt_after
        while True:
            flag = torch.tensor([1 if stop["asked"] else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() or not hold:
                break
            time.sleep(0.1)
        if flag.item():
            print(f"rank {rank}: stopping after step {step - 1} (saved)", flush=True)
            dist.barrier()
            dist.destroy_process_group()
            return STOPPED_EXIT_CODE
    result = {"rank": rank, "world": world, "attempt": attempt, "start_step": start, "steps": step}
    (out / f"result-rank{rank}.json").write_text(json.dumps(result))
    print(f"rank {rank} done: {step} steps", flush=True)
    # every rank past its last collective before any tears gloo down: a rank destroying its group while the other
    # still talks to it aborts ("terminate called without an active exception") under load
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
