"""Hyperparameter search: trial-epochs to reach a target validation accuracy with grid, random, TPE and ASHA
studies on one no-code template task, and the platform's overhead per trial next to a bare trainer.

Starts ``dlcloud up`` on a free port (``--sandbox auto`` by default), makes a synthetic classification task
(two interleaved spirals in 2 features plus 6 noise features, ``--rows`` rows, ``--turns`` turns each) as a
CSV and pushes it as dataset ``hpo-spirals`` (version 1). Then, for each seed and each algorithm (the order
rotated per seed), one study through the SDK, run alone, each trial a no-code template job:

    trial: {template: {name: mlp, data: hpo-spirals@1, label: y},
            hparams: {epochs: 81, patience: 0, batch_size: 32}, resources: {cpu: 1, memory: 1Gi}}
    search_space: lr (categorical, 8 values 1e-4..0.3, log-spaced), units {4, 16, 64}, layers {1, 2, 3},
                  optimizer {sgd, adam}: 144 configurations, the same for every algorithm (grid needs
                  categorical or int parameters, so lr is a categorical list for all four)
    objective: val_accuracy, maximize, its best step; asha: reduction factor 3, rungs at epochs 1, 3, 9, 27,
               81, pausing (the platform's default for template trials: a trial trains to its rung and waits;
               the best third of each rung is resumed from its checkpoint as a new job); asha-prune
               (optional): Optuna's pruner, which cannot pause, with rungs at 3, 9, 27, 81

A few configurations (Adam, lr 3e-3..1e-2, 3 layers) reach 0.95 (the default target) within 8-30 epochs; most
stay near 0.59 for all 81 (too small or too large a learning rate, SGD, 4 units). After one epoch every
configuration, good or not, sits at 0.57-0.60; after three the good ones stand out (0.61-0.84). A pruner's
first rung is therefore epoch 3 (rung 1 ranks by noise and prunes the good ones for good: the 2026-11-25 run
with Optuna's pruner and rungs 1, 3, 9, 27 measured grid/ASHA 1.7). Pausing ASHA starts at epoch 1: a trial
that ranks low there only waits, and is promoted once the rung has seen enough trials (the curve replay of
``bench/hpo_curves.py`` expected 5.4x at min_resource 1 against 4.0x at 3, decided before the real runs).
The budget per trial (``--epochs``) is what grid and random spend on every bad configuration and ASHA on a
third of them at most, so the ratio grows with it; the README gives both settings.

The study is watched while it runs; once a trial reports
``val_accuracy >= --target`` it is stopped (the rest would only cost time). From the trials' jobs afterwards:

* trial-epochs to target: the epochs the hitting trial needed to reach the target plus every epoch run by
  every other trial created before that moment (pruned trials included, with the epochs they ran after the
  pruning decision until their SIGTERM landed; a pausing trial's epochs over all its jobs). Epochs run are
  counted from the trainer's ``epoch N:`` log lines (a trial killed mid-way reports its last points only up
  to the reporter's last flush); "as decided"
  counts a pruned trial only up to the step it was pruned at (what the algorithm asked for). A study that
  never reaches the target counts all its epochs (a lower bound, marked >=).
* per-trial overhead: job created (by the study driver) -> the ``time`` of its first ``val_accuracy`` point
  (taken by ``dlcloud.report`` in the trainer at the end of epoch 1), next to the peer: a bare ``python -m
  dlcloud.templates.train`` of the same data and the same trial's hyperparameters, started by ``Popen``, to
  its ``epoch 1:`` line (``--peer-runs`` per study, after it, with the first trials' hyperparameters; the
  same ``OMP_NUM_THREADS=1`` the job gets from ``cpu: 1``). Overhead = trial - its peer run, paired.

Example:

    .venv/bin/python bench/hpo.py                            # 3 seeds, about 15 minutes on 2 cores
    .venv/bin/python bench/hpo.py --seeds 1 --epochs 9 --max-trials 12  # a quick look

The server's jobs import dlcloud the way the server's own Python does: with an editable install, run the bench
without ``PYTHONPATH`` pointing at another ``src`` (the sandbox binds only the directory the server imports
dlcloud from, and the job's Python would look in the other one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import DlcloudServer, load_average, machine, percentile  # bench/ is on sys.path as a script

from dlcloud.client import Client, Credentials

ALGORITHMS = ("grid", "random", "tpe", "asha")
# asha: the platform's default for a template trial (pausing: a trial stops at its rung and is resumed from its
# checkpoint when it earns the next); asha-prune: Optuna's pruner, which cannot pause (early_stopping.pause: false)
KNOWN = (*ALGORITHMS, "asha-prune")
TARGET_RATIO = 5.0  # grid's trial-epochs over ASHA's
TARGET_OVERHEAD_S = 1.0
DATASET = "hpo-spirals"
SEARCH_SPACE: dict[str, dict[str, Any]] = {
    "lr": {"type": "categorical", "values": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3]},
    "units": {"type": "categorical", "values": [4, 16, 64]},
    "layers": {"type": "int", "low": 1, "high": 3},
    "optimizer": {"type": "categorical", "values": ["sgd", "adam"]},
}
TERMINAL_STUDY = {"COMPLETED", "STOPPED", "FAILED"}
ALIVE_TRIAL = {"RUNNING", "PRUNING", "PAUSING", "STOPPING"}
EPOCH_LINE = re.compile(r"^epoch (\d+):")
PRUNED_AT = re.compile(r"pruned at step (\d+)")


# -- the task --------------------------------------------------------------------------------------
def make_csv(path: Path, rows: int, turns: float, seed: int = 1) -> None:
    """Two interleaved spirals (``turns`` turns each, a little noise) in x1, x2, six noise features, label y."""
    import numpy as np

    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, rows)
    t = np.sqrt(rng.uniform(0, 1, rows)) * 2 * turns * math.pi
    r = t / (2 * turns * math.pi)
    x1 = r * np.cos(t + label * math.pi) + rng.normal(0, 0.02, rows)
    x2 = r * np.sin(t + label * math.pi) + rng.normal(0, 0.02, rows)
    noise = rng.normal(0, 1, (rows, 6))
    with path.open("w") as f:
        f.write("x1,x2," + ",".join(f"n{i}" for i in range(6)) + ",y\n")
        for i in range(rows):
            f.write(f"{x1[i]:.5f},{x2[i]:.5f}," + ",".join(f"{v:.4f}" for v in noise[i]) + f",{label[i]}\n")


def study_spec(name: str, algorithm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "algorithm": "asha" if algorithm == "asha-prune" else algorithm,
        "objective": {"metric": "val_accuracy", "direction": "maximize", "step": "best"},
        "max_trials": args.max_trials,
        "parallel_trials": args.parallel,
        "seed": seed,
        "trial": {
            "template": {"name": "mlp", "data": f"{DATASET}@1", "label": "y"},
            "hparams": {"epochs": args.epochs, "patience": 0, "batch_size": args.batch_size},
            "resources": {"cpu": 1, "memory": "1Gi"},
        },
        "search_space": SEARCH_SPACE,
    }
    if algorithm == "asha-prune":
        spec["early_stopping"] = {"min_resource": args.prune_min_resource, "reduction_factor": 3, "pause": False}
    if algorithm == "asha":
        spec["early_stopping"] = {"min_resource": args.min_resource, "reduction_factor": 3}
    return spec


# -- one study -------------------------------------------------------------------------------------
def _iso(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _val_points(client: Client, job: str) -> list[tuple[int, float, float]]:
    """(step, value, time) of the job's val_accuracy in its last attempt."""
    series = client.jobs.metrics(job, metrics=["val_accuracy"], max_points=10_000).series
    if not series:
        return []
    last = max(s.attempt for s in series)
    points = [p for s in series if s.attempt == last for p in s.points]
    return sorted((p.step, p.value, p.time.timestamp()) for p in points)


def run_study(client: Client, spec: dict[str, Any], target: float, poll: float, timeout: float) -> float:
    """Submit, watch, stop once a trial reaches ``target``; returns the wall seconds to that point (or to the
    study's end)."""
    name = spec["name"]
    t0 = time.monotonic()
    client.studies.submit(spec)
    deadline = t0 + timeout
    hit_at: float | None = None
    while True:
        study = client.studies.get(name)
        if study.state in TERMINAL_STUDY:
            break
        if time.monotonic() > deadline:
            client.studies.stop(name)
            raise RuntimeError(f"study {name} did not end in {timeout:g} s")
        if hit_at is None and study.state == "RUNNING":
            for t in client.studies.trials(name):
                # a pausing trial may reach the target in the job that took it to its rung: PAUSED by now
                if (
                    t.job
                    and t.state in (*ALIVE_TRIAL, "PAUSED")
                    and any(v >= target for _, v, _ in _val_points(client, t.job))
                ):
                    hit_at = time.monotonic()
                    client.studies.stop(name)
                    break
        time.sleep(poll)
    if study.state == "FAILED":
        raise RuntimeError(f"study {name} failed: {study.reason}")
    return (hit_at or time.monotonic()) - t0


@dataclass
class TrialRun:
    number: int
    job: str
    state: str
    params: dict[str, Any]
    created: float
    ended: float | None
    epochs_run: int
    pruned_at: int | None
    points: list[tuple[int, float, float]]
    placed: float | None = None
    command: float | None = None


@dataclass
class Outcome:
    algorithm: str
    seed: int
    wall_s: float
    trials: list[TrialRun]
    reached: bool = False
    epochs: int = 0  # trial-epochs to target (run)
    decided: int = 0  # the same, pruned trials counted to the step they were pruned at
    counted: int = 0  # trials that count (created before the hit)
    pruned: int = 0
    overrun: list[int] = field(default_factory=list)  # epochs a pruned trial ran past its pruning step


def collect(client: Client, name: str) -> list[TrialRun]:
    """Each trial with a job: a pausing ASHA trial ran one job per rung it earned, each resumed from the one
    before's checkpoint; its epochs are every ``epoch N:`` line of all its jobs (an epoch run twice counts twice)."""
    out = []
    for t in client.studies.trials(name):
        if not t.jobs:
            continue  # a duplicate: no job
        first = client.jobs.get(t.jobs[0])
        last = client.jobs.get(t.jobs[-1]) if len(t.jobs) > 1 else first
        epochs_run, points, command = 0, [], None
        for job in t.jobs:
            lines = list(client.jobs.logs(job))
            epochs = [int(m.group(1)) for x in lines if x.stream == "stdout" and (m := EPOCH_LINE.match(x.text))]
            job_points = _val_points(client, job)
            epochs_run += len(epochs) if epochs else len(job_points)
            points += job_points
            if command is None:
                command = next((_iso(x.time) for x in lines if x.text.startswith("starting: ")), None)
        pruned = PRUNED_AT.search(t.reason) if t.state == "PRUNED" else None
        placed = next((e.time.timestamp() for e in first.events if e.to_state == "STARTING"), None)
        out.append(
            TrialRun(
                number=t.number,
                job=t.jobs[0],
                state=t.state,
                params=t.params,
                created=first.created_at.timestamp(),
                ended=last.finished_at.timestamp() if last.finished_at else None,
                epochs_run=epochs_run,
                pruned_at=int(pruned.group(1)) if pruned else None,
                points=sorted(points),
                placed=placed,
                command=command,
            )
        )
    return out


def score(algorithm: str, seed: int, wall_s: float, trials: list[TrialRun], target: float) -> Outcome:
    o = Outcome(algorithm, seed, wall_s, trials)
    hits = [(p[2], t, p[0]) for t in trials for p in t.points if p[1] >= target]
    if hits:
        hit_time, hit_trial, hit_step = min(hits, key=lambda h: h[0])
        o.reached = True
        others = [t for t in trials if t is not hit_trial and t.created < hit_time]
        o.counted = len(others) + 1
        o.epochs = hit_step + sum(t.epochs_run for t in others)
        o.decided = hit_step + sum(t.pruned_at if t.pruned_at is not None else t.epochs_run for t in others)
        counted = [*others, hit_trial]
    else:
        counted = trials
        o.counted = len(trials)
        o.epochs = sum(t.epochs_run for t in trials)
        o.decided = sum(t.pruned_at if t.pruned_at is not None else t.epochs_run for t in trials)
    for t in counted:
        if t.pruned_at is not None:
            o.pruned += 1
            o.overrun.append(t.epochs_run - t.pruned_at)
    return o


# -- the peer --------------------------------------------------------------------------------------
def run_peer(csv: Path, params: dict[str, Any], args: argparse.Namespace, out: Path) -> float:
    """Seconds from Popen of the bare trainer to its ``epoch 1:`` line; the process is then killed."""
    hparams = {**params, "epochs": args.epochs, "patience": 0, "batch_size": args.batch_size}
    argv = [sys.executable, "-m", "dlcloud.templates.train", "--template", "mlp", "--data", str(csv)]
    argv += ["--label", "y", "--hparams", json.dumps(hparams), "--output", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.time()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("epoch 1:"):
                return time.time() - t0
        raise RuntimeError(f"the bare trainer ended without an epoch line (exit {proc.wait()})")
    finally:
        proc.kill()
        proc.wait()


# -- report ----------------------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    return percentile(values, 50)


def print_report(args: argparse.Namespace, outcomes: list[Outcome], peer: list[tuple[str, float]]) -> None:
    print()
    print(f"machine: {machine()}; load average {load_average()}")
    print(
        f"task: mlp template, {args.rows} rows of 2 spirals ({args.turns:g} turns) + 6 noise features, "
        "20 % validation; "
        f"{args.epochs} epochs per trial, batch {args.batch_size}, patience 0; 144 configurations; "
        f"target val_accuracy >= {args.target:g}; seeds {args.first_seed}..{args.seeds}; max_trials {args.max_trials}, "
        f"parallel_trials {args.parallel}; asha: min_resource {args.min_resource}, asha-prune: min_resource "
        f"{args.prune_min_resource}; reduction factor 3"
    )
    print()
    header = (
        f"{'':<10}{'total':>8}{'median trial-epochs':>20}{'as decided':>12}{'reached':>9}{'trials':>8}"
        f"{'pruned':>8}{'overrun':>9}{'wall s':>8}   per seed (trial-epochs)"
    )
    print(header)
    print("-" * len(header))
    medians: dict[str, float] = {}
    totals: dict[str, float] = {}
    for algo in KNOWN:
        rows = [o for o in outcomes if o.algorithm == algo]
        if not rows:
            continue
        med = _median([float(o.epochs) for o in rows])
        medians[algo] = med
        totals[algo] = sum(float(o.epochs) for o in rows)
        lower = any(not o.reached for o in rows)
        dec = _median([float(o.decided) for o in rows])
        reached = sum(o.reached for o in rows)
        trials = _median([float(o.counted) for o in rows])
        pruned = _median([float(o.pruned) for o in rows])
        overrun = [x for o in rows for x in o.overrun]
        over = f"{_median([float(x) for x in overrun]):.0f}" if overrun else "-"
        wall = _median([o.wall_s for o in rows])
        seeds = ", ".join(f"{'' if o.reached else '>='}{o.epochs}" for o in sorted(rows, key=lambda o: o.seed))
        mark = ">=" if lower else ""
        print(
            f"{algo:<10}{mark + format(totals[algo], '.0f'):>8}{mark + format(med, '.0f'):>20}{dec:>12.0f}"
            f"{f'{reached}/{len(rows)}':>9}{trials:>8.0f}{pruned:>8.0f}{over:>9}{wall:>8.0f}   {seeds}"
        )
    print(
        "(total: trial-epochs summed over the seeds; trials: those created before the target was reached; overrun: "
        "median epochs a pruned trial ran past its pruning step; wall: submit -> target reached)"
    )
    if "grid" in medians and "asha" in medians and medians["asha"] > 0:
        # the issue's measure: total trial-epochs (compute) over the seeds; the median beside it, and the ratio
        # per seed (grid's cost is mostly the luck of its order: a few seeds swing the median)
        ratio = totals["grid"] / totals["asha"]
        ok = "met" if ratio >= TARGET_RATIO else "MISSED"
        by_seed = {o.seed: o.epochs for o in outcomes if o.algorithm == "asha"}
        per_seed = [
            f"{o.epochs / by_seed[o.seed]:.1f}"
            for o in sorted(outcomes, key=lambda o: o.seed)
            if o.algorithm == "grid" and by_seed.get(o.seed)
        ]
        dec_g = _median([float(o.decided) for o in outcomes if o.algorithm == "grid"])
        dec_a = _median([float(o.decided) for o in outcomes if o.algorithm == "asha"])
        print(
            f"ratio grid / asha, total trial-epochs: {ratio:.2f}; median: {medians['grid'] / medians['asha']:.2f} "
            f"(as decided: {dec_g / max(dec_a, 1):.2f}); per seed: {', '.join(per_seed)}"
        )
        print(f"target: asha >= {TARGET_RATIO:g}x fewer total trial-epochs than grid ({ok})")

    trials = [t for o in outcomes for t in o.trials if t.points]
    first = [t.points[0][2] - t.created for t in trials if t.points[0][0] == 1]
    placed = [t.placed - t.created for t in trials if t.placed is not None]
    spawned = [t.command - t.placed for t in trials if t.command is not None and t.placed is not None]
    to_epoch = [t.points[0][2] - t.command for t in trials if t.command is not None and t.points[0][0] == 1]
    by_job = {t.job: t for t in trials}
    gaps = []
    for o in outcomes:
        ordered = sorted(o.trials, key=lambda t: t.created)
        for a, b in zip(ordered, ordered[1:], strict=False):
            if a.ended is not None and args.parallel == 1:
                gaps.append(b.created - a.ended)
    peer_s = [p for _, p in peer]
    paired = [by_job[j].points[0][2] - by_job[j].created - p for j, p in peer if j in by_job]
    print()
    print(f"per trial: job created -> first val_accuracy point (epoch 1), s; peer: {len(peer)} bare trainer runs")
    header = f"{'':<58}{'p50':>8}{'p95':>8}{'max':>8}{'n':>6}"
    print(header)
    print("-" * len(header))
    rows_ = [
        ("dlcloud trial: created -> epoch 1 reported", first),
        ("peer: Popen(python -m dlcloud.templates.train) -> epoch 1", peer_s),
        ("overhead: trial - its peer run (same hparams), paired", paired),
        ("  created -> scheduled (STARTING)", placed),
        ("  scheduled -> command spawned", spawned),
        ("  command spawned -> epoch 1 reported (the trainer itself)", to_epoch),
        ("previous trial's job ended -> next trial job created", gaps),
    ]
    for label, xs in rows_:
        if xs:
            print(f"{label:<58}{percentile(xs, 50):>8.2f}{percentile(xs, 95):>8.2f}{max(xs):>8.2f}{len(xs):>6}")
    if paired:
        p50 = percentile(paired, 50)
        ok = "met" if p50 <= TARGET_OVERHEAD_S else "MISSED"
        print(f"target: the platform's overhead per trial <= {TARGET_OVERHEAD_S:g} s ({ok} at p50: {p50:.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="studies per algorithm, seeds 1..N (default 3)")
    ap.add_argument("--first-seed", type=int, default=1, help="start at this seed instead of 1 (more seeds later)")
    ap.add_argument("--max-trials", type=int, default=40, help="max_trials of each study (default 40)")
    ap.add_argument("--target", type=float, default=0.95, help="validation accuracy to reach (default 0.95)")
    ap.add_argument("--epochs", type=int, default=81, help="epochs per trial (default 81)")
    ap.add_argument(
        "--min-resource",
        type=int,
        default=1,
        help="pausing ASHA's first rung, in epochs (default 1: rungs 1, 3, 9, 27, 81)",
    )
    ap.add_argument(
        "--prune-min-resource",
        type=int,
        default=3,
        help="asha-prune's first rung, in epochs (default 3: a pruner's rung 1 prunes by epoch 1's noise)",
    )
    ap.add_argument("--rows", type=int, default=20_000, help="rows of the task (default 20000)")
    ap.add_argument("--turns", type=float, default=3.0, help="turns of each spiral: harder with more (default 3)")
    ap.add_argument("--batch-size", type=int, default=32, help="the trials' batch_size (default 32)")
    ap.add_argument("--parallel", type=int, default=1, help="parallel_trials (default 1)")
    ap.add_argument(
        "--algorithms",
        default=",".join(ALGORITHMS),
        help=f"comma-separated, of {', '.join(KNOWN)} (default the first four; asha-prune: ASHA without pausing)",
    )
    ap.add_argument("--peer-runs", type=int, default=2, help="bare trainer runs after each study (default 2)")
    ap.add_argument("--sandbox", choices=["auto", "off"], default="auto", help="the server's --sandbox")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between checks while a study runs")
    ap.add_argument("--study-timeout", type=float, default=1800.0, help="fail if one study takes longer (s)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data dir (for the server log)")
    args = ap.parse_args()
    algorithms = [a for a in args.algorithms.split(",") if a]
    if bad := set(algorithms) - set(KNOWN):
        ap.error(f"unknown algorithms {sorted(bad)}; choose from {', '.join(KNOWN)}")
    if args.seeds < 1 or args.max_trials < 1 or args.epochs < 1 or args.rows < 10:
        ap.error("--seeds, --max-trials and --epochs must be at least 1, --rows at least 10")
    if not 1 <= args.first_seed <= args.seeds:
        ap.error(f"--first-seed must be between 1 and --seeds ({args.seeds})")

    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-hpo-"))
    server = DlcloudServer(root, "dlcloud")
    outcomes: list[Outcome] = []
    peer: list[tuple[str, float]] = []
    started = time.monotonic()
    try:
        csv = root / "train.csv"
        make_csv(csv, args.rows, args.turns)
        creds = Credentials(server.endpoint, *server.start("warning", args.sandbox))
        print(f"sandbox: {server.isolation}", file=sys.stderr)
        with Client(creds) as client:
            client.datasets.push(DATASET, path=csv)
            for seed in range(args.first_seed, args.seeds + 1):
                order = algorithms[seed - 1 :] + algorithms[: seed - 1]  # rotated: no algorithm always first
                for algo in order:
                    name = f"hpo-{algo}-s{seed}"
                    spec = study_spec(name, algo, seed, args)
                    wall = run_study(client, spec, args.target, args.poll, args.study_timeout)
                    trials = collect(client, name)
                    if trials and all(t.state == "FAILED" for t in trials):
                        first = client.studies.trials(name)[0]
                        raise RuntimeError(f"every trial of {name} failed; trial 0: {first.reason}")
                    o = score(algo, seed, wall, trials, args.target)
                    outcomes.append(o)
                    print(
                        f"seed {seed} {algo}: {'reached' if o.reached else 'NOT reached'}, {o.epochs} trial-epochs "
                        f"({o.decided} as decided), {o.counted} trials, {o.pruned} pruned, {wall:.0f} s "
                        f"[{time.monotonic() - started:.0f} s in]",
                        file=sys.stderr,
                    )
                    for t in sorted(trials, key=lambda t: t.number)[: args.peer_runs]:
                        peer.append((t.job, run_peer(csv, t.params, args, root / "peer-out")))
    finally:
        server.stop()
        if args.keep:
            print(f"data dir kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"bench took {time.monotonic() - started:.0f} s", file=sys.stderr)
    print_report(args, outcomes, peer)


if __name__ == "__main__":
    main()
