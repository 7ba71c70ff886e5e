"""The templates and their hyperparameters: one table, read by the API at submit and by the trainer in the job.

No ML library is imported here (the API server imports this module).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlcloud.schemas.datasets import dataset_env_name

TRAINER_MODULE = "dlcloud.templates.train"
DATA_FORMATS = ("csv", "libsvm")
LIBSVM_SUFFIXES = (".libsvm", ".svm")
TASKS = ("classification", "regression")
EXPORT_DIR = "model"  # the trainer's export, relative to $DLCLOUD_OUTPUT_DIR; what --register-model registers
EXPORT_FORMAT = "torchscript"


@dataclass(frozen=True)
class HParam:
    """One hyperparameter: its type, default and bounds. ``default`` None with ``required``: no default."""

    name: str
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is not allowed (lr > 0)
    high_open: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False

    def allowed(self) -> str:
        """``int 1..16``, ``number > 0, ≤ 10``, ``relu | tanh``: what values are allowed."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        what = {int: "int", float: "number", bool: "true or false", str: "text"}[self.kind]
        if self.low is None and self.high is None:
            return what
        if self.low is not None and self.high is not None and not self.low_open and not self.high_open:
            return f"{what} {self.low:g}..{self.high:g}"
        lo = "" if self.low is None else f"{'>' if self.low_open else '≥'} {self.low:g}"
        hi = "" if self.high is None else f"{'<' if self.high_open else '≤'} {self.high:g}"
        return f"{what} " + ", ".join(p for p in (lo, hi) if p)

    def describe(self) -> str:
        """``int 1..16, default 2`` and the like, for messages and docs."""
        return self.allowed() + (", required" if self.required else f", default {_show(self.default)}")

    def check(self, value: Any) -> Any:
        """The value as its type, within its bounds; ValueError saying what is allowed otherwise."""
        v = _coerce(self, value)
        if self.choices and v not in self.choices:
            raise ValueError(f"hparam {self.name} must be {self.allowed()}, got {_show(value)}")
        if isinstance(v, int | float) and not isinstance(v, bool):
            too_low = self.low is not None and (v <= self.low if self.low_open else v < self.low)
            too_high = self.high is not None and (v >= self.high if self.high_open else v > self.high)
            if too_low or too_high:
                raise ValueError(f"hparam {self.name} must be {self.allowed()}, got {_show(value)}")
        return v


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def _coerce(p: HParam, value: Any) -> Any:
    """Numbers and booleans may come as text (``--hparam layers=3``); anything else of the wrong type is refused."""
    bad = ValueError(f"hparam {p.name} must be {p.allowed()}, got {_show(value)}")
    if p.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad
    if p.kind is str:
        if isinstance(value, str):
            return value
        raise bad
    if isinstance(value, bool):
        raise bad
    if p.kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise bad from None
        raise bad
    if isinstance(value, int | float):
        out = float(value)
    elif isinstance(value, str):
        try:
            out = float(value)
        except ValueError:
            raise bad from None
    else:
        raise bad
    if out != out or out in (float("inf"), float("-inf")):
        raise bad
    return out


def _common() -> tuple[HParam, ...]:
    return (
        HParam("lr", float, 0.01, "learning rate", low=0, high=10, low_open=True),
        HParam("epochs", int, 20, "passes over the training data", low=1, high=1000),
        HParam("batch_size", int, 64, "examples per step", low=1, high=65536),
        HParam("patience", int, 5, "epochs without a better val_loss before stopping; 0: never", low=0, high=1000),
        HParam("optimizer", str, "adam", "the optimizer", choices=("adam", "adamw", "sgd")),
        HParam("weight_decay", float, 0.0, "L2 penalty", low=0, high=1),
    )


def _net() -> tuple[HParam, ...]:
    return (
        HParam("dropout", float, 0.0, "dropout probability after each hidden layer", low=0, high=1, high_open=True),
        HParam("activation", str, "relu", "hidden activation", choices=("relu", "tanh", "gelu", "sigmoid")),
    )


def _dense(layers: int = 2) -> tuple[HParam, ...]:
    return (
        HParam("layers", int, layers, "hidden layers", low=1, high=16),
        HParam("units", int, 64, "units per hidden layer", low=1, high=4096),
    )


def _conv(max_layers: int, max_kernel: int) -> tuple[HParam, ...]:
    return (
        HParam("layers", int, 2, "convolution layers", low=1, high=max_layers),
        HParam("filters", int, 32, "filters per convolution layer", low=1, high=1024),
        HParam("kernel_size", int, 3, "convolution kernel size", low=1, high=max_kernel),
        HParam("units", int, 64, "units of the dense layer after the convolutions", low=1, high=4096),
    )


def _recurrent() -> tuple[HParam, ...]:
    return (
        HParam("features", int, 1, "values per time step: a row of T*features values is T steps", low=1, high=4096),
        HParam("layers", int, 1, "stacked recurrent layers", low=1, high=16),
        HParam("units", int, 64, "hidden units per recurrent layer", low=1, high=4096),
        HParam("bidirectional", bool, False, "read the sequence both ways"),
        HParam(
            "dropout",
            float,
            0.0,
            "dropout between recurrent layers and before the output",
            low=0,
            high=1,
            high_open=True,
        ),
    )


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    hparams: tuple[HParam, ...]

    def hparam(self, name: str) -> HParam | None:
        return next((p for p in self.hparams if p.name == name), None)

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every hyperparameter of the template: the given ones checked, the others at their defaults.

        Raises:
            ValueError: an unknown name (the message lists the allowed ones), a bad value, a required one missing.
        """
        unknown = sorted(set(given) - {p.name for p in self.hparams})
        if unknown:
            allowed = ", ".join(p.name for p in self.hparams)
            raise ValueError(f"template {self.name} has no hparam {', '.join(unknown)}; its hparams are: {allowed}")
        out: dict[str, Any] = {}
        for p in self.hparams:
            if p.name in given:
                out[p.name] = p.check(given[p.name])
            elif p.required:
                raise ValueError(f"template {self.name} needs hparam {p.name} ({p.help}: {p.describe()})")
            else:
                out[p.name] = p.default
        return out


_HW = (
    HParam("height", int, None, "image height in pixels", low=1, high=4096, required=True),
    HParam("width", int, None, "image width in pixels", low=1, high=4096, required=True),
    HParam(
        "channels",
        int,
        1,
        "channels per pixel: a row holds channels*height*width values (C, H, W order)",
        low=1,
        high=16,
    ),
)

TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("mlp", "multi-layer perceptron over the feature vector", (*_dense(), *_net(), *_common())),
        Template("logreg", "logistic regression (linear regression for task regression)", _common()),
        Template(
            "wide-deep",
            "wide & deep: a linear model and an MLP over the same features, their outputs summed",
            (*_dense(), *_net(), *_common()),
        ),
        Template(
            "cnn1d",
            "1-D convolutions over a sequence given as a row (T*channels values, time-major)",
            (
                HParam("channels", int, 1, "values per time step", low=1, high=1024),
                *_conv(16, 63),
                *_net(),
                *_common(),
            ),
        ),
        Template(
            "cnn2d",
            "2-D convolutions (each followed by 2x2 max pooling) over fixed-size images given as rows",
            (*_HW, *_conv(8, 15), *_net(), *_common()),
        ),
        Template("rnn", "a recurrent network (tanh) over a sequence given as a row", (*_recurrent(), *_common())),
        Template("lstm", "an LSTM over a sequence given as a row", (*_recurrent(), *_common())),
    )
}


def get_template(name: str) -> Template:
    """The template called ``name``; ValueError listing the templates otherwise."""
    template = TEMPLATES.get(name)
    if template is None:
        raise ValueError(f"unknown template {name!r}; templates: {', '.join(TEMPLATES)}")
    return template


def detect_format(path: str | None, given: str | None) -> str:
    """``given``, else libsvm for a ``.libsvm``/``.svm`` file, else csv."""
    if given:
        return given
    return "libsvm" if path and path.lower().endswith(LIBSVM_SUFFIXES) else "csv"


def dataset_name(ref: str) -> str:
    """The dataset's own name in a reference ``OWNER/NAME@REF``."""
    return ref.split("@", 1)[0].rsplit("/", 1)[-1]


def command_for(template: Mapping[str, Any]) -> str:
    """The job's command for a spec's ``template`` section (a dict as ``schemas.jobs.TemplateSpec`` dumps it).

    The data path is ``$DLCLOUD_DATASET_<NAME>`` (expanded by the job's shell) and ``path`` inside it; the
    hyperparameters reach the trainer as ``DLCLOUD_HPARAMS``."""
    variable = dataset_env_name(dataset_name(str(template["data"])))
    argv = ["python", "-m", TRAINER_MODULE, "--template", str(template["name"])]
    data = f'--data="${{{variable}}}"'
    rest: list[str] = []
    if template.get("path"):
        rest += ["--path", str(template["path"])]
    if template.get("label") is not None:
        rest += ["--label", str(template["label"])]
    if template.get("data_format"):
        rest += ["--data-format", str(template["data_format"])]
    if template.get("num_features"):
        rest += ["--num-features", str(template["num_features"])]
    rest += ["--validation-split", f"{float(template.get('validation_split', 0.2)):g}"]
    rest += ["--task", str(template.get("task") or "classification"), "--seed", str(int(template.get("seed") or 0))]
    return f"{shlex.join(argv)} {data} {shlex.join(rest)}"
