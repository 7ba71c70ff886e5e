"""dlcloud models ..."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
import yaml

from dlcloud.cli import registry
from dlcloud.cli.common import client
from dlcloud.cli.output import Output, OutputOption, console, err_console, render, short_time, size_text, transfer
from dlcloud.client.models import infer_format, pack_artifact, split_name, unknown_format_error
from dlcloud.errors import InvalidArgument, InvalidSignature, UnknownFormat
from dlcloud.schemas.models import FORMATS, ModelDetail, ModelVersion

app = typer.Typer(
    help="Register, version, label, share and download models (NAME, or OWNER/NAME for a shared model).",
    no_args_is_help=True,
)
WORDS = registry.Words("model", "models", "mnist", "vision/mnist")
FORMATS_HELP = "torchscript, onnx, sklearn, xgboost, savedmodel or python"


def _parse_metrics(pairs: list[str]) -> dict[str, float]:
    metrics = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not key or not math.isfinite(number):
            raise InvalidArgument(f"--metric takes NAME=NUMBER, got {pair!r}")
        metrics[key] = number
    return metrics


def _load_signature(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidSignature(f"cannot read signature file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidSignature(f"{path} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidSignature(f"{path} must hold a mapping with 'inputs' and 'outputs' lists")
    return data


def _source(v: ModelVersion) -> str:
    if v.source_job:
        return f"job {v.source_job}:{v.source_path}"
    return "upload"


def _deployments(v: ModelVersion) -> str:
    leases = [f"{d.name} ({d.endpoint}, {d.tenant}{'/' + d.holder if d.holder else ''})" for d in v.deployments]
    if leases:
        return ", ".join(leases)
    return "yes (by another tenant)" if v.deployed else "no"


def _tensors(specs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{t['name']} {t['datatype']} {t['shape']}" for t in specs) or "-"


VERSION_COLUMNS: list[tuple[str, Any]] = [
    ("VERSION", "version"),
    ("FORMAT", "format"),
    ("CODE", lambda v: "yes" if v.executes_code else "no"),
    ("ARTIFACT", "artifact"),
    ("SIZE", lambda v: size_text(v.size_bytes)),
    ("SHA256", lambda v: v.sha256[:12]),
    ("LABELS", lambda v: ",".join(v.labels) or "-"),
    ("DEPLOYED", lambda v: "yes" if v.deployed else "no"),
    ("SOURCE", _source),
    ("BY", "created_by"),
    ("CREATED", lambda v: short_time(v.created_at)),
]


@app.command("register")
def register(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name (DNS-1123 label); registering again adds a version."),
    file: Path | None = typer.Option(None, "--file", help="File or directory to register (packed and uploaded)."),
    from_job: str | None = typer.Option(None, "--from-job", help="Job (name or id) whose output to register."),
    path: str | None = typer.Option(None, "--path", help="File or directory in the job's outputs (with --from-job)."),
    fmt: str | None = typer.Option(
        None, "--format", help=f"{FORMATS_HELP}; recognised from the file name when left out."
    ),
    signature: Path | None = typer.Option(
        None, "--signature", help="JSON/YAML file: inputs and outputs of {name, datatype, shape}."
    ),
    metric: list[str] = typer.Option([], "--metric", help="A metric NAME=NUMBER (repeatable)."),
    description: str = typer.Option("", "--description", help="Free text kept with the version."),
    output: Output = OutputOption,
) -> None:
    """Register a new version of a model from a local file or directory, or from a job's outputs.

    Versions are numbered 1, 2, ... and immutable; a directory is packed whole, hidden files included.

    Without --format: .pt/.pth/.torchscript, .onnx, .joblib/.pkl, .json/.ubj, saved_model.pb or predictor.py.

    Without --signature the signature is inferred where the format allows.

    Examples:

      dlcloud models register mnist --file model.pt --metric accuracy=0.98

      dlcloud models register mnist --from-job train-1 --path model.onnx --format onnx

      dlcloud models register churn --file ./export --format python --signature signature.yaml
    """

    if (file is None) == (from_job is None):
        raise InvalidArgument("give either --file FILE|DIR or --from-job JOB --path PATH")
    if (from_job is None) != (path is None):
        raise InvalidArgument("--from-job and --path go together")
    if fmt is None:
        fmt = infer_format(file) if file is not None else infer_format(str(path), local=False)
        if fmt is None:
            raise unknown_format_error(str(file if file is not None else path))
    elif fmt not in FORMATS:
        raise UnknownFormat(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    sig = _load_signature(signature) if signature is not None else None
    metrics = _parse_metrics(metric)
    c = client(ctx)
    kwargs: dict[str, Any] = {"signature": sig, "metrics": metrics, "description": description}
    if file is not None:
        split_name(name)  # a malformed OWNER/NAME fails before the upload
        upload = registry.upload_archive(c.models.upload, pack_artifact(file), file.name)
        version = c.models.register(name, fmt, upload=upload, **kwargs)
    else:
        version = c.models.register(name, fmt, from_job=from_job, path=path, **kwargs)
    summary = (
        f"model [bold]{version.model}[/bold] version {version.version} registered "
        f"({version.format}, {size_text(version.size_bytes)}, sha256 {version.sha256[:12]})"
    )
    if registry.show_made(version, output, summary):
        return
    if version.signature is None:
        err_console.print("signature: not declared (could not be inferred; give --signature FILE to declare it)")
    if version.executes_code:
        err_console.print(
            f"format {version.format} runs its author's code when loaded: a tenant you share it with serves it "
            f"only with --trust-code {version.owner}/{version.model.rpartition('/')[2]}"
        )


@app.command("list")
def list_models(ctx: typer.Context, output: Output = OutputOption) -> None:
    """List your tenant's models, then the models other tenants share with it (OWNER/NAME, read-only).

    Examples:

      dlcloud models list

      dlcloud models list -o json
    """
    render(client(ctx).models.list(), output, registry.list_columns([]))


def _describe_version(v: ModelVersion, output: Output) -> None:
    sig = v.signature
    head = [
        ("Format", v.format),
        ("Executes code", "yes: loading it runs its author's code" if v.executes_code else "no"),
        ("Artifact", v.artifact),
        ("Size", size_text(v.size_bytes)),
        ("SHA256", v.sha256),
    ]
    middle = [("Signature", "not declared" if sig is None else "")]
    if sig is not None:
        middle += [("  inputs", _tensors(sig["inputs"])), ("  outputs", _tensors(sig["outputs"]))]
    middle += [("Metrics", ", ".join(f"{k}={val:g}" for k, val in v.metrics.items()) or "-"), ("Source", _source(v))]
    registry.show_version(v, output, ("Model", v.model), head, middle, [("Deployed", _deployments(v))])


def _describe(m: ModelDetail, output: Output) -> None:
    registry.show_entry(m, output, [], VERSION_COLUMNS)
    if output == Output.json:
        return
    unsigned = [str(v.version) for v in m.versions if v.signature is None]
    if unsigned:
        console.print(f"signature: not declared for version(s) {', '.join(unsigned)}")


registry.describe_command(
    app,
    WORDS,
    (
        "Show a model with its versions, labels and shares, or one version with its signature and metrics.",
        "Model name, or OWNER/NAME for a model shared with your tenant.",
        "describe vision/mnist --version 3",
    ),
    _describe,
    _describe_version,
)
registry.versions_command(app, WORDS, VERSION_COLUMNS)
registry.label_commands(app, WORDS, "staging or production", "production", "staging")
registry.share_commands(app, WORDS, "it can list, describe and download it as OWNER/NAME")
registry.delete_command(app, WORDS, "it is deployed", "Artifacts are")


@app.command("download")
def download(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name, or OWNER/NAME for a shared model."),
    version: str = typer.Argument("latest", help="Version number, label, or latest."),
    dest: Path = typer.Option(Path("."), "--dest", help="Directory to put the artifact in."),
) -> None:
    """Download a version's artifact (file or directory) and verify its checksum.

    Examples:

      dlcloud models download mnist production --dest ./serving

      dlcloud models download vision/mnist 3
    """
    models = client(ctx).models
    shown = f"{name}:{version}"
    target = transfer(f"downloading {shown}", lambda advance: models.download(name, version, dest, advance))
    err_console.print(f"downloaded {name}:{version} to {target} (checksum verified)")
    typer.echo(str(target))
