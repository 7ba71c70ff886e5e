"""Data-parallel training of a small MLP on synthetic regression data: DDP over gloo on CPU.

A plain torchrun script (nothing in it knows dlcloud beyond the DLCLOUD_* defaults of two flags):

    torchrun --nproc_per_node 2 ddp_train.py --epochs 3 --out /tmp/out --checkpoint-dir /tmp/ckpt
    python ddp_train.py --single --epochs 3 --out /tmp/single    # the same training in one process

Equivalence with ``--single``: the data is generated from ``--seed`` and the model is initialised from it
on every rank. ``--global-batch G`` is split as G / WORLD_SIZE samples per rank; the ranks' samplers are
``DistributedSampler`` and the single process uses the same sampler with one replica and batch G, so
global batch k is the same set of samples in both (DistributedSampler deals index i of its permutation
to rank i mod WORLD_SIZE). Each rank's loss is a mean over its G / WORLD_SIZE samples and DDP averages
gradients over ranks, so the averaged gradient is the single process's mean over G samples: the same SGD
trajectory up to float32 rounding (a different summation order), about 1e-7 relative per step.

Checkpoints (model, optimizer, epoch, step) go to ``--checkpoint-dir`` (default $DLCLOUD_CHECKPOINT_DIR)
at the end of each epoch, written by rank 0 and renamed into place; a run that finds one resumes after
its epoch. ``--crash-rank R --crash-epoch E`` makes rank R exit with code 3 halfway through epoch E,
once: a marker file in the checkpoint dir says it has crashed, so the restarted run trains through.

Outputs in ``--out`` (default $DLCLOUD_OUTPUT_DIR): ``result-rank<R>.json`` per rank (final loss on the
full data, weights and their SHA-256, steps, steps/s, MASTER_ADDR/PORT, attempt) and
``epochs-rank<R>.log``, one line per epoch started and finished (``attempt=A epoch=E start|end``),
appended across attempts.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CRASH_EXIT_CODE = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=512, help="dataset size (default 512)")
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--global-batch", type=int, default=0, help="samples per step over all ranks (0: all)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--shuffle", action="store_true", help="reshuffle every epoch (DistributedSampler.set_epoch)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--single", action="store_true", help="one process on the full data, no process group")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("DLCLOUD_CHECKPOINT_DIR") or "")
    ap.add_argument("--out", default=os.environ.get("DLCLOUD_OUTPUT_DIR") or "out")
    ap.add_argument("--crash-rank", type=int, default=-1, help="this rank exits with code 3 ...")
    ap.add_argument("--crash-epoch", type=int, default=-1, help="... halfway through this epoch, once")
    ap.add_argument("--epoch-sleep", type=float, default=0.0, help="seconds to sleep per epoch (a slow epoch)")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.samples < 1:
        ap.error("--epochs and --samples must be at least 1")
    if args.crash_rank >= 0 and not args.checkpoint_dir:
        ap.error("--crash-rank needs a checkpoint dir (--checkpoint-dir or DLCLOUD_CHECKPOINT_DIR)")
    return args


def attempt_number() -> int:
    """dlcloud's attempt, else torchrun's restart count + 1, else 1."""
    if "DLCLOUD_ATTEMPT" in os.environ:
        return int(os.environ["DLCLOUD_ATTEMPT"])
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1


def make_data(args: argparse.Namespace) -> TensorDataset:
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, args.features, generator=g)
    w = torch.randn(args.features, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(args.samples, 1, generator=g)
    return TensorDataset(x, y)


def make_model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(args.seed + 1)
    return nn.Sequential(nn.Linear(args.features, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))


def flat_weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def log_epoch(out: Path, rank: int, attempt: int, epoch: int, what: str) -> None:
    with (out / f"epochs-rank{rank}.log").open("a") as f:
        f.write(f"attempt={attempt} epoch={epoch} {what}\n")


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, epoch: int, step: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch, "step": step}, tmp)
    os.replace(tmp, path)  # a reader sees the old checkpoint or the new one, never half of one


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed = not args.single
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    global_batch = args.global_batch or args.samples
    if global_batch % world or args.samples % global_batch:
        raise SystemExit(
            f"--global-batch {global_batch} must divide --samples {args.samples} and be a multiple of the "
            f"world size {world}"
        )
    attempt = attempt_number()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if ckpt_dir is not None:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / "checkpoint.pt" if ckpt_dir is not None else None
    master = f"{os.environ.get('MASTER_ADDR', '-')}:{os.environ.get('MASTER_PORT', '-')}"
    print(f"rank {rank}/{world} attempt {attempt} master {master} batch/rank {global_batch // world}", flush=True)

    data = make_data(args)
    model = make_model(args)
    if distributed:
        # DistributedSampler deals its permutation round-robin: global batch k is the same samples as
        # batch k of the single process's one-replica sampler with batch = global_batch
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=args.shuffle, seed=args.seed)
        model = DistributedDataParallel(model)
    else:
        sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=args.shuffle, seed=args.seed)
    loader = DataLoader(data, batch_size=global_batch // world, sampler=sampler, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.MSELoss()
    inner = model.module if distributed else model

    start_epoch, step = 0, 0
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        inner.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch, step = state["epoch"] + 1, state["step"]
        print(f"rank {rank} resumed from {ckpt} after epoch {state['epoch']} (step {step})", flush=True)

    steps_per_epoch = len(loader)
    crash_marker = ckpt_dir / f"crashed-rank{rank}" if ckpt_dir is not None else None
    epoch_losses: list[float] = []
    steps_run = 0
    started = time.time()
    t_train = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        log_epoch(out, rank, attempt, epoch, "start")
        sampler.set_epoch(epoch)
        total = torch.zeros(1)
        for i, (x, y) in enumerate(loader):
            if (
                rank == args.crash_rank
                and epoch == args.crash_epoch
                and i == steps_per_epoch // 2
                and crash_marker is not None
                and not crash_marker.exists()
            ):
                crash_marker.write_text(f"attempt {attempt}\n")
                print(f"rank {rank} crashing on purpose in epoch {epoch} step {i}", flush=True)
                os._exit(CRASH_EXIT_CODE)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.detach()
            step += 1
            steps_run += 1
        if distributed:
            dist.all_reduce(total)  # sum over ranks of per-rank mean losses
        epoch_loss = total.item() / (steps_per_epoch * world)
        epoch_losses.append(epoch_loss)
        if args.epoch_sleep:
            time.sleep(args.epoch_sleep)
        if ckpt is not None:
            if rank == 0:
                save_checkpoint(ckpt, inner, opt, epoch, step)
            if distributed:
                dist.barrier()  # no rank runs ahead of a checkpoint it may have to resume from
        log_epoch(out, rank, attempt, epoch, "end")
        print(f"rank {rank} epoch {epoch} loss {epoch_loss:.6f}", flush=True)
    elapsed = time.perf_counter() - t_train

    x_all, y_all = data.tensors
    with torch.no_grad():
        final_loss = loss_fn(inner(x_all), y_all).item()
    weights = flat_weights(inner)
    result = {
        "rank": rank,
        "world_size": world,
        "attempt": attempt,
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
        "start_epoch": start_epoch,
        "epochs": args.epochs,
        "steps": step,
        "steps_this_run": steps_run,
        "steps_per_epoch": steps_per_epoch,
        "steps_per_sec": steps_run / elapsed if steps_run and elapsed > 0 else None,
        "train_seconds": elapsed,
        "epoch_losses": epoch_losses,
        "final_loss": final_loss,
        "weights_sha256": hashlib.sha256(weights.numpy().tobytes()).hexdigest(),
        "weights": weights.tolist(),
        "started_at": started,
        "finished_at": time.time(),
    }
    tmp = out / f".result-rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out / f"result-rank{rank}.json")
    rate = f"{result['steps_per_sec']:.2f}" if result["steps_per_sec"] else "-"
    print(
        f"rank {rank} done: {step} steps, {rate} steps/s, final loss {final_loss:.8f}, "
        f"weights {result['weights_sha256'][:16]}",
        flush=True,
    )
    if distributed:
        # the DDP wrapper goes before the process group: left to interpreter exit, its teardown sometimes
        # aborts the process ("terminate called without an active exception", about 4% of runs here)
        del model
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
