"""A preemptible trainer on the GPU that holds a block of GPU memory and checkpoints after every step.

    python cuda_steps.py --steps 20 --hold-gib 8

Each step: a forward/backward pass of a small MLP on a fixed CUDA batch, an optimizer step, ``--step-sleep``
seconds of "work"; then the checkpoint (weights and optimizer state as CUDA tensors, the next step) is written
to ``$DLCLOUD_CHECKPOINT_DIR`` and renamed into place, and ``attempt=A step=S`` appended to ``steps.log`` in
``$DLCLOUD_OUTPUT_DIR``. ``--hold-gib`` GiB of GPU memory stay allocated for the whole run, so that whoever gets
the GPU next can see whether it was given back.

SIGTERM only sets a flag: the step in progress is saved, then the process exits 143. A run that finds a
checkpoint loads it onto the GPU and resumes after its step. At the end ``result.json`` holds the attempt, the
first step, the step count and the final loss. Nothing here imports dlcloud.
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
from torch import nn

STOPPED_EXIT_CODE = 143


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-sleep", type=float, default=0.25)
    ap.add_argument("--hold-gib", type=float, default=8.0)
    args = ap.parse_args()

    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    assert torch.cuda.is_available(), "no CUDA device visible"
    dev = torch.device("cuda")
    attempt = int(os.environ.get("DLCLOUD_ATTEMPT", "1"))
    out = Path(os.environ["DLCLOUD_OUTPUT_DIR"])
    ckpt = Path(os.environ["DLCLOUD_CHECKPOINT_DIR"]) / "cuda_steps.pt"
    held = torch.ones(int(args.hold_gib * (1 << 30)), dtype=torch.uint8, device=dev)  # touched: really resident

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=dev, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["next_step"])
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(512, 64, generator=g, device=dev)
    y = torch.randn(512, 1, generator=g, device=dev)
    print(f"attempt {attempt} on {torch.cuda.get_device_name(0)} starts at step {start}", flush=True)

    step, loss = start, None
    while step < args.steps:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        time.sleep(args.step_sleep)
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "next_step": step + 1}, tmp)
        os.replace(tmp, ckpt)
        with (out / "steps.log").open("a") as f:
            f.write(f"attempt={attempt} step={step}\n")
        step += 1
        if stop["asked"]:
            print(f"stopping after step {step - 1} (saved), {held.numel() >> 30} GiB held until exit", flush=True)
            return STOPPED_EXIT_CODE
    result = {"attempt": attempt, "start_step": start, "steps": step, "loss": None if loss is None else loss.item()}
    (out / "result.json").write_text(json.dumps(result))
    print(f"done: {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
