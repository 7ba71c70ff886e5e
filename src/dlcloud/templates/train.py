"""The template trainer: ``python -m dlcloud.templates.train --template mlp --data DIR_OR_FILE [...]``.

Runs inside a template job (its command is built by ``catalog.command_for``), and anywhere else with torch.
Hyperparameters come from ``--hparams JSON``, else ``$DLCLOUD_HPARAMS``. Each epoch it reports ``loss``,
``val_loss`` and (classification) ``accuracy``/``val_accuracy`` with ``dlcloud.report``, and at the last step
the best epoch's values as ``best_loss``, ``best_val_loss``, ..., ``best_epoch`` (the model it exports is the
best epoch's: early stopping restores it); at the end it exports
``model.pt`` (TorchScript), ``signature.json`` and ``classes.json`` into ``<output>/model``.

Checkpoints (docs/templates.md): with ``$DLCLOUD_CHECKPOINT_DIR`` set, after each epoch's report the whole
training state is written atomically to ``<dir>/template-checkpoint.pt``; a later attempt resumes after the
checkpoint's epoch with the same random streams, so an interrupted run reports the metrics of an uninterrupted
one. ``$DLCLOUD_STOP_AT_STEP=N`` (a step is an epoch) ends this run after epoch N: it checkpoints, exports the
best model so far and exits 0; ``best_*`` are reported only when training is over (the last epoch, or early
stopping).

Invariants:
- A checkpoint is resumed only by the run that wrote it: same template, task, hyperparameters (``epochs``
  aside: more epochs continue a finished run), seed and data (shape and content); anything else exits 2
  naming what differs, and so does a checkpoint that cannot be read. It is loaded with
  ``torch.load(weights_only=True)``: plain containers of tensors and numbers, no code runs.
- A checkpointed epoch is never trained again: the checkpoint of epoch k is written before epoch k+1 starts, and
  a finished checkpoint (early stopping, or ``epochs`` done) is exported without training.

Exit codes: 0 trained and exported (or stopped at the step budget and exported); 2 the data, the
hyperparameters, ``$DLCLOUD_STOP_AT_STEP`` or the checkpoint are unusable (the message on stderr names the line,
the hyperparameter or what differs); anything else is a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import pickle
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import dlcloud
from dlcloud.templates import catalog
from dlcloud.templates.data import DataError, Table, find_file, load

EXIT_BAD_INPUT = 2
CHECKPOINT_FILE = "template-checkpoint.pt"
CHECKPOINT_FORMAT = 1  # bump when the checkpoint's fields change meaning
STOP_AT_STEP_ENV = "DLCLOUD_STOP_AT_STEP"


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


class CheckpointError(ValueError):
    """The checkpoint cannot be resumed by this run: unreadable, or written for another model or data."""


def identity(template: str, task: str, hparams: dict[str, Any], data: Prepared, seed: int) -> dict[str, Any]:
    """What a checkpoint must have been written for to be resumed: all but ``epochs``, which may grow."""
    digest = hashlib.sha256()
    for array in (data.x_train, data.y_train, data.x_val, data.y_val):
        digest.update(np.ascontiguousarray(array).tobytes())
    return {
        "template": template,
        "task": task,
        "hparams": {k: v for k, v in sorted(hparams.items()) if k != "epochs"},
        "seed": seed,
        "n_train": len(data.x_train),
        "n_val": len(data.x_val),
        "features": int(data.x_train.shape[1]),
        "classes": list(data.classes),
        "data_sha256": digest.hexdigest(),
    }


def _clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, for a one-line message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(value: Any) -> str:
    return _clip(repr(value), 60)


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``hparam lr: 0.01 in the checkpoint, 0.05 now`` for each identity field that differs."""
    out = []
    for key in current:
        if key == "hparams":
            kept = saved.get(key)
            old: dict[str, Any] = kept if isinstance(kept, dict) else {}
            new = current[key]
            for name in sorted(set(old) | set(new)):
                if old.get(name) != new.get(name):
                    out.append(f"hparam {name}: {_short(old.get(name))} in the checkpoint, {_short(new.get(name))} now")
        elif key == "data_sha256":
            if saved.get(key) != current[key]:
                out.append("the data: same shape, other values")
        elif saved.get(key) != current[key]:
            out.append(f"{key}: {_short(saved.get(key))} in the checkpoint, {_short(current[key])} now")
    return out


def _load_error(exc: BaseException) -> str:
    """torch.load's reason in a line: its weights-only refusals bury it in advice to load unsafely."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError):
        _, _, detail = text.partition("WeightsUnpickler error:")
        reason = next((line.strip() for line in detail.splitlines() if line.strip()), "").split(". ")[0]
        return "not a torch file of tensors and plain values" + (f": {_clip(reason)}" if reason else "")
    if isinstance(exc, EOFError):
        return "empty or cut short"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return _clip(first)


# the fields of a checkpoint and their types (``None`` allowed where the tuple says so)
_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (int,),
    "identity": (dict,),
    "epoch": (int,),
    "finished": (bool,),  # for readers: a resume decides from stopped_early and the run's own epochs
    "stopped_early": (bool,),
    "net": (dict,),
    "optimizer": (dict,),
    "generator": (object,),  # a uint8 tensor; checked when it is set
    "torch_rng": (object,),
    "cuda_rng": (list,),
    "best_loss": (float,),
    "best_state": (dict, type(None)),
    "stale": (int,),
    "best_metrics": (dict,),
    "metrics": (dict,),
}


@dataclass(frozen=True)
class Checkpoint:
    """``<directory>/template-checkpoint.pt``: one ``torch.save``d dict of the fields above, for one identity."""

    directory: Path
    identity: dict[str, Any]

    @property
    def path(self) -> Path:
        return self.directory / CHECKPOINT_FILE

    def read(self) -> dict[str, Any] | None:
        """The saved state, None when there is none; CheckpointError when unreadable or another run's."""
        import torch  # torch is heavy: loaded only when training

        if not self.path.exists():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"checkpoint {self.path} cannot be read ({_load_error(exc)}); delete it to start over"
            ) from None
        if not isinstance(state, dict):
            raise CheckpointError(f"checkpoint {self.path} is not a template checkpoint (a {type(state).__name__})")
        if state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"checkpoint {self.path} has format {_short(state.get('format'))}; this trainer reads format "
                f"{CHECKPOINT_FORMAT}"
            )
        bad = sorted(k for k, kinds in _FIELDS.items() if k not in state or not isinstance(state[k], kinds))
        if bad:
            missing = ", ".join(bad)
            raise CheckpointError(f"checkpoint {self.path} is not a template checkpoint: bad or missing {missing}")
        differ = _differences(state["identity"], self.identity)
        if differ:
            raise CheckpointError(
                f"checkpoint {self.path} was written for another run ({'; '.join(differ)}); give this run another "
                "checkpoint directory or delete the file"
            )
        return state

    def write(self, state: dict[str, Any]) -> None:
        """Replace the checkpoint atomically: a temporary file in the same directory, fsync, rename."""
        import torch  # torch is heavy: loaded only when training

        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(CHECKPOINT_FILE + ".tmp")  # one writer per directory: a fixed name
        try:
            with open(temporary, "wb") as f:
                torch.save({"format": CHECKPOINT_FORMAT, "identity": self.identity, **state}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        with contextlib.suppress(OSError):  # the rename itself survives a crash once the directory is synced
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def stop_at_step(raw: str | None) -> int | None:
    """``$DLCLOUD_STOP_AT_STEP``: the last epoch this run may train; None when unset or empty."""
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"{STOP_AT_STEP_ENV} must be a positive integer (the last epoch to train), got {raw!r}")
    return int(text)


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


@dataclass
class _Progress:
    """Where training stands: the last epoch trained (in this run or before it) and why it ended, the best epoch."""

    done: int = 0
    stopped_early: bool = False
    stale: int = 0  # epochs since the watched loss last improved
    best_loss: float = math.inf
    best_state: dict[str, Any] | None = None
    best_metrics: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # the last epoch's


class _Training:
    """The network, its optimizer and random streams, and the standardised data of one training run."""

    def __init__(self, template: str, hparams: dict[str, Any], data: Prepared, task: str, seed: int) -> None:
        import torch  # torch is heavy: loaded only when training

        from dlcloud.templates import networks  # networks imports torch: loaded only when training

        torch.manual_seed(seed)
        self.torch: Any = torch
        self.task = task
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        x_train = torch.from_numpy(data.x_train)
        self.mean = x_train.mean(dim=0)
        std = x_train.std(dim=0, unbiased=False)
        self.std = torch.where(std > 0, std, torch.ones_like(std))
        inputs = data.x_train.shape[1]
        outputs = len(data.classes) if task == "classification" else 1
        self.net = networks.build(template, inputs, outputs, hparams)
        y_train = torch.from_numpy(data.y_train)
        self.y_mean = float(y_train.float().mean()) if task == "regression" else 0.0
        y_std = float(y_train.float().std(unbiased=False)) if task == "regression" and len(y_train) > 1 else 1.0
        self.y_std = y_std or 1.0
        self.xt, self.yt = self._scaled(data.x_train), self._target(data.y_train)
        self.xv, self.yv = self._scaled(data.x_val), self._target(data.y_val)
        self.net.to(self.device)
        optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
        self.optimizer = optimizers[hparams["optimizer"]](
            self.net.parameters(), lr=hparams["lr"], weight_decay=hparams["weight_decay"]
        )
        self.generator = torch.Generator().manual_seed(seed)
        self.batch = hparams["batch_size"]
        self.patience = hparams["patience"]

    def _scaled(self, x: np.ndarray) -> Any:
        return ((self.torch.from_numpy(x) - self.mean) / self.std).to(self.device)

    def _target(self, y: np.ndarray) -> Any:
        t = self.torch.from_numpy(y)
        return (t if self.task == "classification" else (t - self.y_mean) / self.y_std).to(self.device)

    def _loss(self, out: Any, y: Any) -> Any:
        if self.task == "classification":
            return self.torch.nn.functional.cross_entropy(out, y)
        return self.torch.nn.functional.mse_loss(out[:, 0], y)

    def _evaluate(self, x: Any, y: Any) -> tuple[float, float | None]:
        self.net.eval()
        with self.torch.no_grad():
            out = self.net(x)
            loss = float(self._loss(out, y))
            acc = float((out.argmax(dim=1) == y).float().mean()) if self.task == "classification" else None
        return loss, acc

    def resume(self, saved: dict[str, Any], checkpoint: Checkpoint) -> _Progress:
        """Load a checkpoint's states (``Checkpoint.read``); where it left training."""
        torch = self.torch
        try:
            self.net.load_state_dict(saved["net"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.generator.set_state(saved["generator"])
            torch.set_rng_state(saved["torch_rng"])  # dropout draws from the global stream
            if self.device.type == "cuda" and len(saved["cuda_rng"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(saved["cuda_rng"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {checkpoint.path} cannot be resumed: {_clip(str(exc))}") from None
        return _Progress(
            done=saved["epoch"],
            stopped_early=saved["stopped_early"],
            stale=saved["stale"],
            best_loss=saved["best_loss"],
            best_state=saved["best_state"],
            best_metrics=saved["best_metrics"],
            metrics=saved["metrics"],
        )

    def epoch(self, epoch: int, p: _Progress, log: Any) -> None:
        """Train one epoch, report its metrics, keep the best epoch's state, count towards early stopping."""
        self.net.train()
        order = self.torch.randperm(len(self.xt), generator=self.generator).to(self.device)
        for start in range(0, len(self.xt), self.batch):
            idx = order[start : start + self.batch]
            self.optimizer.zero_grad()
            self._loss(self.net(self.xt[idx]), self.yt[idx]).backward()
            self.optimizer.step()
        loss, acc = self._evaluate(self.xt, self.yt)
        metrics = {"loss": loss}
        if acc is not None:
            metrics["accuracy"] = acc
        watched = loss
        if len(self.xv):
            val_loss, val_acc = self._evaluate(self.xv, self.yv)
            metrics["val_loss"] = watched = val_loss
            if val_acc is not None:
                metrics["val_accuracy"] = val_acc
        dlcloud.report(step=epoch, **metrics)
        dlcloud.flush(timeout=0)  # send the epoch's point now, not with the next batch: a pruner decides on it
        log(f"epoch {epoch}: " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        if watched < p.best_loss - 1e-6:
            p.best_loss, p.stale = watched, 0
            p.best_state = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
            metrics["epoch"] = epoch
            p.best_metrics = dict(metrics)
        else:
            p.stale += 1
            p.stopped_early = bool(self.patience) and p.stale >= self.patience
        p.done, p.metrics = epoch, metrics

    def state(self, p: _Progress, over: bool) -> dict[str, Any]:
        """What a checkpoint holds after epoch ``p.done`` (``over``: training is finished)."""
        torch = self.torch
        return {
            "epoch": p.done,
            "finished": over,
            "stopped_early": p.stopped_early,
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else [],
            "best_loss": float(p.best_loss),
            "best_state": p.best_state,
            "stale": p.stale,
            "best_metrics": p.best_metrics,
            "metrics": p.metrics,
        }


def _resume_message(p: _Progress, over: bool, last: int, epochs: int, checkpoints: Path, stop_at: int | None) -> str:
    if over:
        why = "early stopping" if p.stopped_early else f"{epochs} epochs"
        return f"training finished at epoch {p.done} ({why}; checkpoint in {checkpoints}): exporting, not training"
    if last <= p.done:
        return f"nothing to train: the checkpoint in {checkpoints} is at epoch {p.done}, {STOP_AT_STEP_ENV}={stop_at}"
    return f"resuming from epoch {p.done} (checkpoint in {checkpoints}): epochs {p.done + 1}..{last} of {epochs}"


def train(
    template: str,
    hparams: dict[str, Any],
    data: Prepared,
    task: str,
    seed: int,
    output: Path,
    log: Any = print,
    checkpoints: Path | None = None,
    stop_at: int | None = None,
) -> dict[str, float]:
    """Train, report each epoch, export into ``output/model``; returns the exported (best) epoch's metrics.

    Args:
        checkpoints: the directory of the checkpoint to resume from and to write after each epoch; None: none.
        stop_at: train at most up to this epoch in this run (a step budget), then export the best model so far.

    Raises:
        CheckpointError: the checkpoint is unreadable or was written for another template, hparams, seed or data.
        ValueError: the data's shape does not fit the template.
    """
    run = _Training(template, hparams, data, task, seed)
    epochs = hparams["epochs"]
    checkpoint = Checkpoint(checkpoints, identity(template, task, hparams, data, seed)) if checkpoints else None
    saved = checkpoint.read() if checkpoint else None
    p = run.resume(saved, checkpoint) if checkpoint and saved else _Progress()
    over = p.stopped_early or p.done >= epochs
    last = p.done if over else epochs if stop_at is None else min(stop_at, epochs)
    if checkpoints and saved:
        log(_resume_message(p, over, last, epochs, checkpoints, stop_at))
    for epoch in range(p.done + 1, last + 1):
        run.epoch(epoch, p, log)
        over = p.stopped_early or p.done >= epochs
        if p.stopped_early:
            log(f"early stopping: val_loss has not improved for {run.patience} epoch(s)")
        if checkpoint:
            checkpoint.write(run.state(p, over))
        if p.stopped_early:
            break
    metrics = p.metrics
    if p.best_state is not None:  # the exported model is the best epoch's: say so under best_* names
        run.net.load_state_dict(p.best_state)
        metrics = p.best_metrics
        if over:  # a budget stop is not the end: the best may still change
            dlcloud.report(step=p.done, **{f"best_{k}": v for k, v in p.best_metrics.items()})
    if not over:
        log(
            f"step budget reached: stopped after epoch {p.done} of {epochs} ({STOP_AT_STEP_ENV}={stop_at}); "
            + (f"the checkpoint in {checkpoints} continues it" if checkpoint else "no checkpoint directory to resume")
        )
    export(run.net.cpu().eval(), run.mean, run.std, data, task, run.y_mean, run.y_std, output)
    return metrics


def export(net: Any, mean: Any, std: Any, data: Prepared, task: str, y_mean: float, y_std: float, output: Path) -> Path:
    """``output/model``: ``model.pt`` (TorchScript, standardisation included), ``signature.json``, ``classes.json``."""
    import torch  # torch is heavy: loaded only when training

    from dlcloud.templates.networks import Classifier, Regressor  # networks imports torch: loaded only when training

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
        stop_at = stop_at_step(os.environ.get(STOP_AT_STEP_ENV))
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
    checkpoints = os.environ.get("DLCLOUD_CHECKPOINT_DIR")
    print(
        f"{args.template}: {len(data.x_train)} training and {len(data.x_val)} validation examples, "
        f"{data.x_train.shape[1]} features, {fmt} {path.name}"
        + (f", {len(data.classes)} classes" if data.classes else "")
    )
    print("hparams: " + json.dumps(hparams, sort_keys=True))
    started = time.monotonic()
    try:
        metrics = train(
            args.template,
            hparams,
            data,
            args.task,
            args.seed,
            output,
            log=lambda m: print(m, flush=True),
            checkpoints=Path(checkpoints) if checkpoints else None,
            stop_at=stop_at,
        )
    except ValueError as exc:  # shapes that do not fit the template (e.g. cnn2d height*width); the checkpoint
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    dlcloud.flush(timeout=10)
    shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
    print(f"exported {output / catalog.EXPORT_DIR} in {time.monotonic() - started:.1f} s: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
