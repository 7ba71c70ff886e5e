"""Hyperparameter search without the luck of a few seeds: every configuration's learning curve, then the
expected trial-epochs to the target of grid (= random) and of pausing ASHA over many orders.

``bench/hpo.py`` runs real studies on the platform, a few seeds each; on its task a third of the configurations
reach the target, so grid's cost is mostly the luck of its first points (one seed: 26 trial-epochs, another:
1,077). This script measures what those studies sample from: it trains each of the 144 configurations of
``hpo.py``'s search space with the template trainer (the same data, seed and hyperparameters a trial gets;
``--workers`` processes, one thread each), records val_accuracy after every epoch, and then replays on the
curves, ``--orders`` times:

* grid / random: the configurations in a uniformly random order (Optuna's GridSampler takes unvisited points at
  random; random sampling with duplicates skipped is the same), each run to ``--epochs`` until one reaches the
  target, counted to its hit epoch; the exact expectation is printed beside the mean of the replays.
* pausing ASHA (``control/asha.py``'s own ``promotion``, one trial at a time as in the benchmark): a free slot
  resumes the paused configuration that earned the next rung, else starts the next one of the order; a resumed
  trial continues its curve (the trainer resumes exactly: tests/unit/templates); stops at the first epoch that
  reaches the target.

The curves are cached in ``--curves`` (JSON) so the replay can be repeated without training again.

Example:

    .venv/bin/python bench/hpo_curves.py --workers 2          # about 30 minutes on 2 cores, then seconds
    .venv/bin/python bench/hpo_curves.py --curves /tmp/c.json # the replay alone, from the cache
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _common import load_average, machine  # bench/ is on sys.path as a script
from hpo import SEARCH_SPACE, make_csv

from dlcloud.control import asha
from dlcloud.schemas.studies import Direction

Curve = list[float]  # val_accuracy after epoch 1, 2, ...


def configurations() -> list[dict[str, Any]]:
    names = list(SEARCH_SPACE)
    values = []
    for spec in SEARCH_SPACE.values():
        if spec["type"] == "categorical":
            values.append(spec["values"])
        else:
            values.append(list(range(spec["low"], spec["high"] + 1)))
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


class _Reached(Exception):
    """The curve reached the target: later epochs are never read (every replay stops at the first hit)."""


def train_curve(job: tuple[str, dict[str, Any], int, int, float]) -> Curve:
    """val_accuracy per epoch of one configuration, as a trial job would train it, up to the epoch that
    reaches ``target`` (or all ``epochs``)."""
    csv, params, epochs, batch, target = job
    import torch

    torch.set_num_threads(1)
    from dlcloud.templates import catalog
    from dlcloud.templates.data import load
    from dlcloud.templates.train import prepare, train

    hparams = catalog.get_template("mlp").resolve({**params, "epochs": epochs, "patience": 0, "batch_size": batch})
    data = prepare(load(Path(csv), "csv", label="y"), "classification", 0.2, 0)
    curve: Curve = []

    def log(line: str) -> None:
        if line.startswith("epoch "):
            fields = dict(f.split("=") for f in line.split(": ", 1)[1].split())
            curve.append(float(fields["val_accuracy"]))
            if curve[-1] >= target:
                raise _Reached

    with tempfile.TemporaryDirectory() as out, contextlib.suppress(_Reached):
        train("mlp", hparams, data, "classification", 0, Path(out), log=log)
    return curve


def hit_epoch(curve: Curve, target: float, upto: int) -> int | None:
    return next((i + 1 for i, v in enumerate(curve[:upto]) if v >= target), None)


def grid_cost(order: list[int], curves: list[Curve], target: float, epochs: int) -> int:
    cost = 0
    for i in order:
        hit = hit_epoch(curves[i], target, epochs)
        if hit is not None:
            return cost + hit
        cost += epochs
    return cost


def asha_cost(order: list[int], curves: list[Curve], target: float, epochs: int, rungs: asha.Rungs) -> int:
    """Pausing ASHA, one trial at a time, on the recorded curves: the trial-epochs until a point reaches the target."""
    cands: dict[int, asha.Candidate] = {}
    config: dict[int, int] = {}
    cost, started = 0, 0

    def run(number: int, start: int, budget: int) -> int | None:
        nonlocal cost
        curve = curves[config[number]]
        points = dict(cands[number].points)
        for step in range(start + 1, budget + 1):
            cost += 1
            points[step] = curve[step - 1]
            if curve[step - 1] >= target:
                return step
        cands[number] = asha.Candidate(number, points, budget, epochs, paused=budget < epochs)
        return None

    while True:
        pick = asha.promotion(list(cands.values()), rungs, Direction.MAXIMIZE, best=True)
        if pick is not None:
            c, budget = pick
            if run(c.number, c.budget or 0, budget) is not None:
                return cost
            continue
        if started >= len(order):
            return cost  # every configuration tried (the benchmark's max_trials is lower: it never gets here)
        number, started = started, started + 1
        config[number] = order[number]
        cands[number] = asha.Candidate(number, {}, None, epochs, paused=False)
        if run(number, 0, rungs.first_budget(epochs)) is not None:
            return cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curves", type=Path, default=Path("/tmp/dlcloud-hpo-curves.json"), help="cache of the curves")
    ap.add_argument("--workers", type=int, default=2, help="training processes (default 2)")
    ap.add_argument("--orders", type=int, default=2000, help="random orders replayed (default 2000)")
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--epochs", type=int, default=81)
    ap.add_argument("--min-resource", type=int, default=3)
    ap.add_argument("--reduction-factor", type=int, default=3)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--turns", type=float, default=3.0)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    configs = configurations()
    key = {
        "rows": args.rows,
        "turns": args.turns,
        "epochs": args.epochs,
        "batch": args.batch_size,
        "target": args.target,
    }
    cached = json.loads(args.curves.read_text()) if args.curves.exists() else {}
    if cached.get("key") == key and len(cached.get("curves", [])) == len(configs):
        curves = cached["curves"]
        print(f"curves from {args.curves}", file=sys.stderr)
    else:
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            csv = Path(tmp) / "train.csv"
            make_csv(csv, args.rows, args.turns)
            jobs = [(str(csv), c, args.epochs, args.batch_size, args.target) for c in configs]
            with ProcessPoolExecutor(args.workers) as pool:
                curves = []
                for i, curve in enumerate(pool.map(train_curve, jobs)):
                    curves.append(curve)
                    print(f"{i + 1}/{len(jobs)} {configs[i]}: best {max(curve):.3f}", file=sys.stderr)
        args.curves.write_text(json.dumps({"key": key, "configs": configs, "curves": curves}))
        print(f"trained {len(configs)} curves in {time.monotonic() - started:.0f} s", file=sys.stderr)

    n = len(curves)
    hits = [hit_epoch(c, args.target, args.epochs) for c in curves]
    good = [h for h in hits if h is not None]
    rungs = asha.Rungs(args.min_resource, args.reduction_factor)
    rng = random.Random(0)
    grid, pausing = [], []
    curves = [c + [c[-1]] * (args.epochs - len(c)) for c in curves]  # past a hit: never read, padded
    for _ in range(args.orders):
        order = list(range(n))
        rng.shuffle(order)
        grid.append(grid_cost(order, curves, args.target, args.epochs))
        pausing.append(asha_cost(order, curves, args.target, args.epochs, rungs))
    exact = (n - len(good)) / (len(good) + 1) * args.epochs + statistics.mean(good) if good else float("nan")
    print()
    print(f"machine: {machine()}; load average {load_average()}")
    print(
        f"{n} configurations of bench/hpo.py's space, {args.epochs} epochs each; target val_accuracy >= "
        f"{args.target:g}: {len(good)} reach it (epoch {min(good, default=0)}-{max(good, default=0)}, median "
        f"{statistics.median(good) if good else 0:.0f}); {args.orders} random orders; asha: rungs "
        f"{', '.join(map(str, [*rungs.below(args.epochs), args.epochs]))}, reduction factor {args.reduction_factor}, "
        "pausing"
    )
    print()
    print(f"{'trial-epochs to target':<28}{'mean':>8}{'median':>8}{'p10':>8}{'p90':>8}")
    for label, xs in (("grid = random (replayed)", grid), ("pausing ASHA (replayed)", pausing)):
        q = statistics.quantiles(xs, n=10)
        print(f"{label:<28}{statistics.mean(xs):>8.0f}{statistics.median(xs):>8.0f}{q[0]:>8.0f}{q[-1]:>8.0f}")
    print(f"{'grid, exact expectation':<28}{exact:>8.0f}")
    ratio = statistics.mean(grid) / statistics.mean(pausing)
    ok = "met" if ratio >= 5 else "MISSED"
    print(f"ratio grid / pausing ASHA, expected trial-epochs: {ratio:.2f} (target >= 5: {ok})")


if __name__ == "__main__":
    main()
