"""The template trainer: ``python -m dlcloud.templates.train --template mlp --data DIR_OR_FILE [...]``.

Runs inside a template job (its command is built by ``catalog.command_for``), and anywhere else with torch.
Hyperparameters come from ``--hparams JSON``, else ``$DLCLOUD_HPARAMS``. Each epoch it reports ``loss``,
``val_loss`` and (classification) ``accuracy``/``val_accuracy`` with ``dlcloud.report``, and at the last step
the best epoch's values as ``best_loss``, ``best_val_loss``, ..., ``best_epoch`` (the model it exports is the
best epoch's: early stopping restores it); at the end it exports
``model.pt`` (TorchScript), ``signature.json`` and ``classes.json`` into ``<output>/model``.

Exit codes: 0 trained and exported; 2 the data or the hyperparameters are unusable (the message on stderr
names the line or the hyperparameter); anything else is a crash.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import dlcloud
from dlcloud.templates import catalog
from dlcloud.templates.data import DataError, Table, find_file, load

EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Prepared:
    """Examples split and encoded: targets are class indices (classification) or floats (regression)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    classes: list[str]


def _class_order(labels: list[str]) -> list[str]:
    """Distinct labels, numerically sorted when every one is a number (``-1`` before ``1``, ``9`` before ``10``)."""
    distinct = sorted(set(labels))
    try:
        return sorted(distinct, key=float)
    except ValueError:
        return distinct


def prepare(table: Table, task: str, validation_split: float, seed: int) -> Prepared:
    """Encode the labels and split off ``validation_split`` of the examples (shuffled with ``seed``)."""
    n = len(table.labels)
    if task == "classification":
        classes = _class_order(table.labels)
        if len(classes) < 2:
            raise DataError(f"every example has label {classes[0]!r}; classification needs at least 2 classes")
        index = {c: i for i, c in enumerate(classes)}
        y = np.asarray([index[v] for v in table.labels], dtype=np.int64)
    else:
        classes = []
        values = []
        for label, line in zip(table.labels, table.lines, strict=True):
            try:
                values.append(float(label))
            except ValueError:
                raise DataError(f"line {line}: label {label!r} is not a number (task regression)") from None
        y = np.asarray(values, dtype=np.float32)
    order = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * validation_split))
    if validation_split > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    val, train = order[:n_val], order[n_val:]
    return Prepared(table.features[train], y[train], table.features[val], y[val], classes)


def signature(inputs: int, classes: list[str]) -> dict[str, Any]:
    """The export's signature (docs/models.md): one FP32 row per example in; probabilities and class out."""
    spec: dict[str, Any] = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, inputs]}]}
    if classes:
        spec["outputs"] = [
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(classes)]},
            {"name": "class", "datatype": "INT64", "shape": [-1]},
        ]
    else:
        spec["outputs"] = [{"name": "prediction", "datatype": "FP32", "shape": [-1]}]
    return spec


def train(
    template: str,
    hparams: dict[str, Any],
    data: Prepared,
    task: str,
    seed: int,
    output: Path,
    log: Any = print,
) -> dict[str, float]:
    """Train, report each epoch, export into ``output/model``; returns the final metrics."""
    import torch

    from dlcloud.templates import networks

    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x_train = torch.from_numpy(data.x_train)
    mean = x_train.mean(dim=0)
    std = x_train.std(dim=0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    inputs = data.x_train.shape[1]
    outputs = len(data.classes) if task == "classification" else 1
    net = networks.build(template, inputs, outputs, hparams)
    y_train = torch.from_numpy(data.y_train)
    y_mean = float(y_train.float().mean()) if task == "regression" else 0.0
    y_std = float(y_train.float().std(unbiased=False)) if task == "regression" and len(y_train) > 1 else 1.0
    y_std = y_std or 1.0

    def scaled(x: np.ndarray) -> torch.Tensor:
        return ((torch.from_numpy(x) - mean) / std).to(device)

    def target(y: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(y)
        return (t if task == "classification" else (t - y_mean) / y_std).to(device)

    xt, yt = scaled(data.x_train), target(data.y_train)
    xv, yv = scaled(data.x_val), target(data.y_val)
    net.to(device)
    optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    optimizer = optimizers[hparams["optimizer"]](
        net.parameters(), lr=hparams["lr"], weight_decay=hparams["weight_decay"]
    )

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if task == "classification":
            return torch.nn.functional.cross_entropy(out, y)
        return torch.nn.functional.mse_loss(out[:, 0], y)

    def evaluate(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float | None]:
        net.eval()
        with torch.no_grad():
            out = net(x)
            loss = float(loss_fn(out, y))
            acc = float((out.argmax(dim=1) == y).float().mean()) if task == "classification" else None
        return loss, acc

    generator = torch.Generator().manual_seed(seed)
    batch = hparams["batch_size"]
    patience = hparams["patience"]
    best_loss, best_state, stale = math.inf, None, 0
    metrics: dict[str, float] = {}
    best_metrics: dict[str, float] = {}
    for epoch in range(1, hparams["epochs"] + 1):
        net.train()
        order = torch.randperm(len(xt), generator=generator).to(device)
        for start in range(0, len(xt), batch):
            idx = order[start : start + batch]
            optimizer.zero_grad()
            loss_fn(net(xt[idx]), yt[idx]).backward()
            optimizer.step()
        loss, acc = evaluate(xt, yt)
        metrics = {"loss": loss}
        if acc is not None:
            metrics["accuracy"] = acc
        watched = loss
        if len(xv):
            val_loss, val_acc = evaluate(xv, yv)
            metrics["val_loss"] = watched = val_loss
            if val_acc is not None:
                metrics["val_accuracy"] = val_acc
        dlcloud.report(step=epoch, **metrics)
        dlcloud.flush(timeout=0)  # send the epoch's point now, not with the next batch: a pruner decides on it
        log(f"epoch {epoch}: " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        if watched < best_loss - 1e-6:
            best_loss, stale = watched, 0
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            metrics["epoch"] = epoch
            best_metrics = dict(metrics)
        else:
            stale += 1
            if patience and stale >= patience:
                log(f"early stopping: val_loss has not improved for {patience} epoch(s)")
                break
    if best_state is not None:  # the exported model is the best epoch's: say so under best_* names
        net.load_state_dict(best_state)
        metrics = best_metrics
        dlcloud.report(step=epoch, **{f"best_{k}": v for k, v in best_metrics.items()})
    export(net.cpu().eval(), mean, std, data, task, y_mean, y_std, output)
    return metrics


def export(net: Any, mean: Any, std: Any, data: Prepared, task: str, y_mean: float, y_std: float, output: Path) -> Path:
    """``output/model``: ``model.pt`` (TorchScript, standardisation included), ``signature.json``, ``classes.json``."""
    import torch

    from dlcloud.templates.networks import Classifier, Regressor

    wrapped = Classifier(net, mean, std) if task == "classification" else Regressor(net, mean, std, y_mean, y_std)
    wrapped.eval()
    for parameter in wrapped.parameters():  # an inference model: its outputs need no gradient
        parameter.requires_grad_(False)
    example = torch.from_numpy(data.x_train[: min(len(data.x_train), 4)])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shapes are taken per batch: the trace is general
        scripted = torch.jit.trace(wrapped, example, check_trace=False)
    target = output / catalog.EXPORT_DIR
    target.mkdir(parents=True, exist_ok=True)
    scripted.save(str(target / "model.pt"))
    (target / "signature.json").write_text(json.dumps(signature(data.x_train.shape[1], data.classes), indent=2))
    (target / "classes.json").write_text(json.dumps(data.classes))
    return target


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dlcloud.templates.train",
        description="Train a no-code template on a CSV or LibSVM file and export it to TorchScript. Example: "
        "python -m dlcloud.templates.train --template mlp --data train.csv --label y --hparams '{\"layers\": 3}'",
    )
    p.add_argument("--template", required=True, help=f"one of {', '.join(catalog.TEMPLATES)}")
    p.add_argument("--data", required=True, type=Path, help="the data file, or a directory holding it")
    p.add_argument("--path", help="the file inside --data when it is a directory of several")
    p.add_argument("--label", help="CSV: the label column (default: the last one)")
    p.add_argument("--data-format", choices=catalog.DATA_FORMATS, help="default: from the file name (.libsvm/.svm)")
    p.add_argument("--num-features", type=int, help="LibSVM: the number of features (default: the highest index)")
    p.add_argument("--validation-split", type=float, default=0.2, help="share of examples held out (0..0.9)")
    p.add_argument("--task", choices=catalog.TASKS, default="classification")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hparams", help="hyperparameters as a JSON object (default: $DLCLOUD_HPARAMS)")
    p.add_argument("--output", type=Path, help="where the model directory goes (default: $DLCLOUD_OUTPUT_DIR or .)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    raw = args.hparams if args.hparams is not None else os.environ.get("DLCLOUD_HPARAMS") or "{}"
    try:
        given = json.loads(raw)
        if not isinstance(given, dict):
            raise ValueError("hyperparameters must be a JSON object")
        template = catalog.get_template(args.template)
        hparams = template.resolve(given)
        if not 0 <= args.validation_split <= 0.9:
            raise ValueError(f"validation split must be between 0 and 0.9, got {args.validation_split:g}")
        path = find_file(args.data, args.path)
        fmt = catalog.detect_format(path.name, args.data_format)
        table = load(path, fmt, label=args.label, num_features=args.num_features)
        data = prepare(table, args.task, args.validation_split, args.seed)
    except (ValueError, OSError) as exc:  # DataError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    output = args.output or Path(os.environ.get("DLCLOUD_OUTPUT_DIR") or ".")
    print(
        f"{args.template}: {len(data.x_train)} training and {len(data.x_val)} validation examples, "
        f"{data.x_train.shape[1]} features, {fmt} {path.name}"
        + (f", {len(data.classes)} classes" if data.classes else "")
    )
    print("hparams: " + json.dumps(hparams, sort_keys=True))
    started = time.monotonic()
    try:
        metrics = train(args.template, hparams, data, args.task, args.seed, output, log=lambda m: print(m, flush=True))
    except ValueError as exc:  # shapes that do not fit the template (e.g. cnn2d height*width)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    dlcloud.flush(timeout=10)
    shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
    print(f"exported {output / catalog.EXPORT_DIR} in {time.monotonic() - started:.1f} s: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
