"""dlcloud datasets ..."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dlcloud.cli import registry
from dlcloud.cli.common import client
from dlcloud.cli.output import Output, OutputOption, err_console, render, short_time, size_text, transfer
from dlcloud.client.datasets import is_bucket_source, pack_data, split_name
from dlcloud.errors import DlcloudError, InvalidArgument
from dlcloud.schemas.datasets import DatasetDetail, DatasetVersion

app = typer.Typer(
    help="Push, version, label, share and download datasets: trees of files in numbered immutable versions "
    "(NAME, or OWNER/NAME for a shared dataset).",
    no_args_is_help=True,
)
WORDS = registry.Words("dataset", "datasets", "clicks", "acme/clicks")
# the version of ``files`` and ``download``: NAME@REF, or NAME with --version REF
NAME_REF = typer.Argument(..., help="Dataset name (OWNER/NAME for a shared one), or NAME@REF.")
VERSION = typer.Option(None, "--version", help="A version number, a label or latest [default: latest].")


def _name_ref(name: str, version: str | None) -> tuple[str, str | None]:
    """``NAME@REF`` or ``NAME`` with ``--version REF`` -> (NAME, REF); REF None when neither gives one."""
    base, sep, ref = name.partition("@")
    if not sep:
        return name, version
    if not base or not ref:
        raise InvalidArgument(f"{name!r}: write NAME@REF, REF a version number, a label or latest")
    if version is not None and version != ref:
        raise InvalidArgument(f"{name!r} names version {ref!r} but --version says {version!r}; give one of them")
    return base, ref


def _state(v: DatasetVersion) -> str:
    return str(v.state)


VERSION_COLUMNS: list[tuple[str, Any]] = [
    ("VERSION", "version"),
    ("STATE", _state),
    ("FILES", "file_count"),
    ("SIZE", lambda v: size_text(v.size_bytes)),
    ("SHA256", lambda v: v.sha256[:12] or "-"),
    ("LABELS", lambda v: ",".join(v.labels) or "-"),
    ("IN USE BY", lambda v: ",".join(v.in_use_by) or "-"),
    ("BY", "created_by"),
    ("CREATED", lambda v: short_time(v.created_at)),
    ("DESCRIPTION", lambda v: v.description or "-"),
]


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Dataset name (DNS-1123 label); creating it again adds a version."),
    source: str = typer.Option(
        ...,
        "--from",
        help="Local directory (its contents are pushed, paths relative to it), a single file, or "
        "s3://BUCKET/PREFIX: objects already in a bucket the server allows, registered in place without a copy.",
    ),
    description: str = typer.Option("", "--description", help="Free text kept with the version."),
    wait: bool = typer.Option(
        False, "--wait", help="With s3://...: wait until the server has read every object and the version is ready."
    ),
    output: Output = OutputOption,
) -> None:
    """Create a dataset with version 1, or add the next version, from a local directory or file, or register
    objects already in a bucket in place.

    Versions are numbered 1, 2, ... and immutable; a directory's contents are pushed whole, hidden files too.
    Links and special files are refused.

    From s3://BUCKET/PREFIX nothing is copied: the version is pending until the server has read every object
    under the prefix for its manifest (path, size, SHA-256), then ready; jobs read the objects from the
    bucket, verified against that manifest. The server must allow the location (dataset_source_urls).

    Examples:

      dlcloud datasets create clicks --from ./data/clicks --description "week 47"

      dlcloud datasets create vocab --from vocab.txt

      dlcloud datasets create clicks --from ./data/clicks -o json

      dlcloud datasets create images --from s3://ml-data/images/2026-11 --wait
    """

    split_name(name)  # a malformed OWNER/NAME fails before the upload
    if is_bucket_source(source):
        _register(ctx, name, source, description, wait, output)
        return
    packed = pack_data(source)
    c = client(ctx)
    upload = registry.upload_archive(c.datasets.upload, packed.archive, Path(source).name)
    version = c.datasets.push(name, upload=upload, description=description)
    shown = f"{version.file_count} files, {version.size_bytes} bytes"
    registry.show_made(
        version, output, f"dataset [bold]{version.dataset}[/bold] version {version.version} created ({shown})"
    )


app.command(
    "push",
    help="Add the next version of a dataset (creating it with version 1): the same as 'create'.\n\n"
    "Examples:\n\n  dlcloud datasets push clicks --from ./data/clicks\n\n"
    "  dlcloud datasets push images --from s3://ml-data/images/2026-12 --wait -o json",
)(create)


def _register(ctx: typer.Context, name: str, source: str, description: str, wait: bool, output: Output) -> None:
    c = client(ctx)
    version = c.datasets.push(name, source=source, description=description)
    shown = f"{version.dataset}@{version.version}"
    if wait:
        with err_console.status(f"reading the objects under {source} for the manifest of {shown}"):
            version = c.datasets.wait_ready(name, version.version)
    if output == Output.json:
        render(version, output, [])
    elif version.state == "ready":
        err_console.print(
            f"dataset [bold]{version.dataset}[/bold] version {version.version} registered in place from "
            f"{source} ({version.file_count} files, {version.size_bytes} bytes)"
        )
    elif version.state == "pending":
        err_console.print(
            f"dataset [bold]{version.dataset}[/bold] version {version.version} registered from {source}: "
            f"pending while the server reads every object for its manifest; 'dlcloud datasets describe {shown}' "
            "shows when it is ready"
        )
    if version.state == "failed":
        raise DlcloudError(
            f"dataset {version.dataset} version {version.version} could not be registered from {source}: "
            f"{version.state_reason}",
            code="dataset_version_not_ready",
        )


@app.command("list")
def list_datasets(ctx: typer.Context, output: Output = OutputOption) -> None:
    """List your tenant's datasets, then those other tenants share with it (OWNER/NAME, read-only).

    Examples:

      dlcloud datasets list

      dlcloud datasets list -o json
    """
    size = ("SIZE", lambda d: size_text(d.size_bytes))
    render(client(ctx).datasets.list(), output, registry.list_columns([size]))


def _describe_version(v: DatasetVersion, output: Output) -> None:
    head = [
        ("State", _state(v) + (f" ({v.state_reason})" if v.state_reason else "")),
        ("Source", v.source or "-"),
        ("Files", v.file_count),
        ("Size", f"{size_text(v.size_bytes)} ({v.size_bytes} bytes)"),
        ("SHA256", v.sha256 or "-"),
    ]
    in_use = ("In use by", ", ".join(v.in_use_by) or "-")
    registry.show_version(v, output, ("Dataset", v.dataset), head, [], [in_use])


def _describe(d: DatasetDetail, output: Output) -> None:
    size = f"{size_text(d.size_bytes)} in {d.version_count} version(s)"
    registry.show_entry(d, output, [("Size", size)], VERSION_COLUMNS)


registry.describe_command(
    app,
    WORDS,
    (
        "Show a dataset with its versions, labels and shares, or one version.",
        "Dataset name, OWNER/NAME for one shared with your tenant; NAME@REF shows one version.",
        "describe acme/clicks@3",
    ),
    _describe,
    _describe_version,
    _name_ref,
)
registry.versions_command(app, WORDS, VERSION_COLUMNS)


@app.command("files")
def files(
    ctx: typer.Context,
    name: str = NAME_REF,
    version: str | None = VERSION,
    output: Output = OutputOption,
) -> None:
    """List the files of a version with their sizes and SHA-256, sorted by path.

    Examples:

      dlcloud datasets files clicks

      dlcloud datasets files clicks --version production -o json

      dlcloud datasets files acme/clicks@2
    """
    name, ref = _name_ref(name, version)
    render(
        client(ctx).datasets.files(name, ref or "latest"),
        output,
        [("PATH", "path"), ("SIZE", "size"), ("SHA256", "sha256")],
    )


@app.command("download")
def download(
    ctx: typer.Context,
    name: str = NAME_REF,
    version: str | None = VERSION,
    dest: Path | None = typer.Option(None, "--dest", help="A new or empty directory for the files [default: ./NAME]."),
) -> None:
    """Download a version's files into a new or empty directory and verify its checksum.

    Nothing is left behind when the transfer or the checksum fails. Prints the directory on stdout.

    Examples:

      dlcloud datasets download clicks --version production --dest ./clicks

      dlcloud datasets download acme/clicks@3
    """
    name, ref = _name_ref(name, version)
    target = dest if dest is not None else Path(name.rpartition("/")[2])
    c = client(ctx)
    meta = c.datasets.version(name, ref or "latest")
    shown = f"{name} version {meta.version}"
    transfer(f"downloading {shown}", lambda advance: c.datasets.download(name, meta.version, target, advance))
    err_console.print(
        f"downloaded {name} version {meta.version} to {target} ({meta.file_count} files, checksum verified)"
    )
    typer.echo(str(target))


registry.label_commands(app, WORDS, "production or clean", "production", "staging")
registry.share_commands(app, WORDS, "it reads it as OWNER/NAME, in jobs too")
registry.delete_command(app, WORDS, "a job that has not ended reads it", "Its files are")
