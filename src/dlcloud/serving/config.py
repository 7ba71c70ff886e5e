"""The model server's configuration: models, their batching and version policy, pipelines.

Built from ``dlcloud serve`` flags (``--model NAME=PATH[:FORMAT]``) or a YAML/JSON file (``--config``);
both end up as one validated ``ServerConfig``. Durations accept ``5ms``/``2s`` or seconds, sizes ``256Mi`` or
bytes.

Invariant: a server that listens on anything but a loopback address has an admin token, so its repository
endpoints (load, unload, index) are never open to the network.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dlcloud.schemas.common import parse_duration, parse_memory
from dlcloud.serving.types import Signature

FORMATS = ("torchscript", "onnx", "sklearn", "xgboost", "savedmodel", "python")
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

_ZERO_DURATION = re.compile(r"0+(\.0*)?(ms|s|m|h|d)?")


def _duration_or_zero(value: Any) -> Any:
    """A duration where 0 (``0``, ``"0"``, ``"0s"``, ``"0ms"``) is allowed: it means "off" for these settings."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and _ZERO_DURATION.fullmatch(value.strip().lower()):
        return 0.0
    return parse_duration(value)


Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=3600)]
SecondsOrZero = Annotated[float, BeforeValidator(_duration_or_zero), Field(ge=0, le=3600)]
Bytes = Annotated[int, BeforeValidator(parse_memory)]


def _check_signature(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A declared signature as given, once ``Signature.from_dict`` has accepted it."""
    if value is not None:
        Signature.from_dict(value)
    return value


SignatureDict = Annotated[dict[str, Any] | None, AfterValidator(_check_signature)]
MIN_ADMIN_TOKEN = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address: 127.0.0.0/8, ::1 (also IPv4-mapped) or ``localhost``."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # any other name may resolve to anything
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingSpec(_Strict):
    """Dynamic batching of one model (every version gets its own queue)."""

    max_batch_size: int = Field(default=32, ge=0, le=65536, description="rows per batch; 0 disables batching")
    max_queue_delay: SecondsOrZero = Field(
        default=0.0, description="wait this long for a batch to fill; 0 = run at once"
    )
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = Field(default=1024, ge=1, le=1_000_000)
    max_queue_bytes: Bytes = Field(
        default=1024**3, ge=1024, le=1024**4, description="bytes of queued input tensors beyond which: 429"
    )
    timeout: Seconds | None = Field(default=None, description="default time a request may wait in the queue")
    instances: int = Field(default=1, ge=1, le=64, description="batches of one version that may run at once")


class VersionPolicy(_Strict):
    """Which versions of a versioned model directory are served (TF Serving's policies)."""

    policy: Literal["latest", "specific", "all"] = "latest"
    num_versions: int = Field(default=1, ge=1, le=100, description="for 'latest': how many of the newest versions")
    versions: tuple[int, ...] = Field(default=(), description="for 'specific'")

    @model_validator(mode="after")
    def _specific_needs_versions(self) -> VersionPolicy:
        if self.policy == "specific" and not self.versions:
            raise ValueError("version policy 'specific' needs a list of versions")
        return self

    def select(self, available: list[int]) -> list[int]:
        ordered = sorted(available)
        if self.policy == "all":
            return ordered
        if self.policy == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :]


def _parse_policy(value: Any) -> Any:
    """'latest' / 'latest:2' / 'all' / [1, 3] / '1,3' / a mapping."""
    if isinstance(value, str):
        text = value.strip()
        if text == "all":
            return {"policy": "all"}
        if text.startswith("latest"):
            n = text.partition(":")[2]
            return {"policy": "latest", "num_versions": int(n) if n.isdigit() else 1}
        if re.fullmatch(r"\d+(,\d+)*", text):
            return {"policy": "specific", "versions": [int(v) for v in text.split(",")]}
        raise ValueError(f"version policy {value!r} is not understood; use latest, latest:N, all or 1,3")
    if isinstance(value, list | tuple):
        return {"policy": "specific", "versions": list(value)}
    return value


class ModelSpec(_Strict):
    """One served model. ``path`` is an artifact (file or directory) or a directory of numbered versions."""

    name: str
    path: Path
    format: Literal["torchscript", "onnx", "sklearn", "xgboost", "savedmodel", "python"] | None = None
    signature: SignatureDict = Field(default=None, description="declared inputs/outputs (overrides inference)")
    batching: BatchingSpec = BatchingSpec()
    versions: Annotated[VersionPolicy, BeforeValidator(_parse_policy)] = VersionPolicy()
    labels: dict[str, int] = Field(default_factory=dict, description="label -> version, e.g. {stable: 1}")
    warmup: Path | None = Field(default=None, description="JSON file: a list of V2 infer requests replayed after load")
    options: dict[str, Any] = Field(default_factory=dict, description="loader options (e.g. threads)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not MODEL_NAME_RE.match(value):
            raise ValueError(
                f"model name {value!r} is invalid: use 1-128 letters, digits, '_', '.', '-', starting with a "
                "letter or digit"
            )
        return value

    def declared_signature(self) -> Signature | None:
        return Signature.from_dict(self.signature) if self.signature is not None else None


class PipelineStep(_Strict):
    model: str
    version: int | None = None
    #: model input name -> name of a preprocessed tensor; default: the preprocessed tensors as they are
    inputs: dict[str, str] = Field(default_factory=dict)


class PipelineSpec(_Strict):
    """Several models behind one name: ``preprocess`` once, every step in parallel, ``combine``.

    ``preprocess`` and ``combine`` are ``file.py:function`` references (relative to the config file);
    ``combine`` may also be ``concat`` (outputs side by side, named ``<model>.<output>``) or
    ``mean:<output>`` (element-wise mean of one output over the steps).
    """

    name: str
    steps: tuple[PipelineStep, ...] = Field(min_length=1)
    preprocess: str | None = None
    combine: str = "concat"
    signature: SignatureDict = None

    @field_validator("steps", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"model": v} if isinstance(v, str) else v for v in value]
        return value


class ServerConfig(_Strict):
    name: str = "dlcloud"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    root_path: str = Field(default="", description="serve under this URL prefix as well, e.g. /serving")
    models: tuple[ModelSpec, ...] = ()
    pipelines: tuple[PipelineSpec, ...] = ()
    watch_interval: SecondsOrZero = Field(default=2.0, description="rescan model directories this often; 0 = never")
    max_body_bytes: int = Field(64 * 1024**2, ge=1024)
    access_log: bool = True
    admin_token: str | None = Field(default=None, description="required as a Bearer token by the repository endpoints")
    base_dir: Path = Field(default=Path("."), description="relative paths in the config are resolved against this")

    @field_validator("admin_token")
    @classmethod
    def _admin_token(cls, value: str | None) -> str | None:
        if value is not None and (len(value) < MIN_ADMIN_TOKEN or value != value.strip()):
            raise ValueError(
                f"the admin token must be at least {MIN_ADMIN_TOKEN} characters without surrounding spaces "
                "(e.g. the output of 'openssl rand -hex 16')"
            )
        return value

    @model_validator(mode="after")
    def _no_open_repository(self) -> ServerConfig:
        if self.admin_token is None and not is_loopback(self.host):
            raise ValueError(
                f"listening on {self.host!r}, which is not a loopback address, would let anyone who can reach it "
                "load and unload models: give --admin-token TOKEN (or DLCLOUD_SERVE_ADMIN_TOKEN, or admin_token "
                "in the config file), or listen on 127.0.0.1"
            )
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> ServerConfig:
        names = [m.name for m in self.models] + [p.name for p in self.pipelines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model and pipeline names must be unique; repeated: {', '.join(dupes)}")
        known = {m.name for m in self.models}
        for p in self.pipelines:
            missing = [s.model for s in p.steps if s.model not in known]
            if missing:
                raise ValueError(f"pipeline {p.name!r} uses models that are not served: {', '.join(missing)}")
        return self

    def resolve(self, path: Path) -> Path:
        return path if path.is_absolute() else (self.base_dir / path).resolve()


class ConfigError(ValueError):
    """A configuration that cannot be served; the message lists every problem."""


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        lines.append(f"{where}: {e['msg']}")
    return "; ".join(lines)


def parse_model_flag(value: str) -> dict[str, Any]:
    """``NAME=PATH[:FORMAT]`` -> a ModelSpec mapping."""
    name, sep, rest = value.partition("=")
    if not sep or not name or not rest:
        raise ConfigError(f"--model {value!r} must look like NAME=PATH or NAME=PATH:FORMAT")
    path, fmt = rest, None
    head, colon, tail = rest.rpartition(":")
    if colon and tail in FORMATS:
        path, fmt = head, tail
    return {"name": name, "path": path, "format": fmt}


def build_config(
    *,
    config_file: Path | None = None,
    model_flags: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    batching: dict[str, Any] | None = None,
    versions: str | None = None,
    extra_models: list[dict[str, Any]] | None = None,
) -> ServerConfig:
    """Merge a config file, ``--model`` flags and CLI overrides into one validated ServerConfig."""
    data: dict[str, Any] = {}
    base_dir = Path.cwd()
    if config_file is not None:
        try:
            loaded = yaml.safe_load(config_file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {config_file} must hold a mapping with 'models' (and 'pipelines')")
        data = loaded
        base_dir = config_file.resolve().parent
    models = list(data.get("models") or [])
    for flag in model_flags or []:
        spec = parse_model_flag(flag)
        if batching:
            spec["batching"] = batching
        if versions:
            spec["versions"] = versions
        models.append(spec)
    for extra in extra_models or []:
        models.append({**extra, "batching": batching} if batching else extra)
    data["models"] = models
    data.setdefault("base_dir", str(base_dir))
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation(err)) from err
