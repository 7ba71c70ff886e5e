"""The commands every versioned registry (``dlcloud models``, ``dlcloud datasets``) has alike: versions, label,
unlabel, share, unshare and delete, written once and added to each group with its own words and examples; the
columns of ``list``, the entry and the version that ``describe`` shows, and transfers under a progress bar."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from dlcloud.cli.common import client
from dlcloud.cli.output import Output, OutputOption, console, err_console, render, render_fields, short_time, transfer
from dlcloud.client.registry import RegistryAPI
from dlcloud.schemas.datasets import DatasetDetail, DatasetUpload, DatasetVersion
from dlcloud.schemas.models import ModelDetail, ModelUpload, ModelVersion

Columns = list[tuple[str, Any]]
Show = Callable[[Any, Output], None]  # shows a read model (an entry, a version) as ``-o`` says


@dataclass(frozen=True)
class Words:
    """How a registry's commands speak: ``noun`` "model", ``plural`` "models" (the command group and the SDK's
    attribute), an example entry ``example`` and its shared form ``shared_example`` (OWNER/NAME)."""

    noun: str
    plural: str
    example: str
    shared_example: str

    def sdk(self, ctx: typer.Context) -> RegistryAPI[Any, Any, Any, Any, Any]:
        api: RegistryAPI[Any, Any, Any, Any, Any] = getattr(client(ctx), self.plural)
        return api

    def examples(self, summary: str, *lines: str) -> str:
        """A command's help: ``summary``, then each example line as ``dlcloud PLURAL LINE``."""
        head = "Example:" if len(lines) == 1 else "Examples:"
        shown = "\n\n".join(f"  dlcloud {self.plural} {line}" for line in lines)
        return f"{summary}\n\n{head}\n\n{shown}"


def list_columns(extra: Columns) -> Columns:
    """The columns of ``list``: name, latest version, versions, the registry's ``extra``, labels, shares, author."""
    return [
        ("NAME", "name"),
        ("LATEST", "latest_version"),
        ("VERSIONS", "version_count"),
        *extra,
        ("LABELS", lambda d: ",".join(f"{k}={v}" for k, v in d.labels.items()) or "-"),
        ("SHARED", lambda d: "from " + d.owner if d.shared else (",".join(d.shared_with) or "-")),
        ("BY", "created_by"),
        ("CREATED", lambda d: short_time(d.created_at)),
    ]


def show_entry(d: ModelDetail | DatasetDetail, output: Output, extra: Columns, version_columns: Columns) -> None:
    """``describe NAME``: the entry's fields (the registry's ``extra`` after its latest version), then its
    versions in ``version_columns``; with ``-o json`` the entry as the API gives it."""
    if output == Output.json:
        render(d, output, [])
        return
    fields: Columns = [
        ("Name", d.name),
        ("Owner", d.owner + (" (shared with you, read-only)" if d.shared else "")),
        ("Description", d.description or "-"),
        ("Created by", d.created_by),
        ("Created", short_time(d.created_at)),
        ("Latest version", d.latest_version),
        *extra,
        ("Labels", ", ".join(f"{k} -> {v}" for k, v in d.labels.items()) or "-"),
    ]
    if not d.shared:
        fields.append(("Shared with", ", ".join(d.shared_with) or "-"))
    render_fields(d, output, fields)
    console.print()
    render(d.versions, Output.table, version_columns, title="Versions")


def show_made(made: Any, output: Output, summary: str) -> bool:
    """What a command made (a version, a label): with ``-o json`` as the API answered it, else ``summary`` on
    stderr. Whether it was the JSON (a command then prints nothing more)."""
    if output == Output.json:
        render(made, output, [])
        return True
    err_console.print(summary)
    return False


def show_version(
    v: ModelVersion | DatasetVersion,
    output: Output,
    entry: tuple[str, str],
    head: Columns,
    middle: Columns,
    tail: Columns,
) -> None:
    """``describe NAME --version REF``: the version's fields: its ``entry`` ("Model", its name) and number, the
    registry's ``head``, its labels, the registry's ``middle``, who made it and when, the registry's ``tail``."""
    fields: Columns = [
        entry,
        ("Version", v.version),
        *head,
        ("Labels", ", ".join(v.labels) or "-"),
        *middle,
        ("Description", v.description or "-"),
        ("Created by", v.created_by),
        ("Created", short_time(v.created_at)),
        *tail,
    ]
    render_fields(v, output, fields)


def upload_archive(upload: Callable[..., ModelUpload | DatasetUpload], archive: Path, shown: str) -> str:
    """Upload the temporary ``archive`` (deleted afterwards) under a progress bar ``uploading SHOWN``; the upload's
    id."""
    try:
        size = archive.stat().st_size
        return transfer(f"uploading {shown}", lambda advance: upload(archive, progress=advance).id, size)
    finally:
        archive.unlink(missing_ok=True)


def _as_given(name: str, version: str | None) -> tuple[str, str | None]:
    return name, version


def describe_command(
    app: typer.Typer,
    w: Words,
    texts: tuple[str, str, str],
    show: Show,
    show_version: Show,
    name_ref: Callable[[str, str | None], tuple[str, str | None]] = _as_given,
) -> None:
    """``describe NAME [--version REF]``: the entry (``show``) or one version (``show_version``). ``texts``: the
    command's summary, the NAME argument's help and a third example; ``name_ref(NAME, --version)`` reads the
    NAME and the version it names (a dataset's ``NAME@REF``)."""
    summary, name_help, example = texts

    @app.command(
        "describe",
        help=w.examples(
            summary, f"describe {w.example}", f"describe {w.example} --version production -o json", example
        ),
    )
    def describe(
        ctx: typer.Context,
        name: str = typer.Argument(..., help=name_help),
        version: str | None = typer.Option(None, "--version", help="Show one version: a number, a label or latest."),
        output: Output = OutputOption,
    ) -> None:
        entry, ref = name_ref(name, version)
        sdk = w.sdk(ctx)
        if ref is not None:
            show_version(sdk.version(entry, ref), output)
        else:
            show(sdk.get(entry), output)


def versions_command(app: typer.Typer, w: Words, columns: list[Any]) -> None:
    """``versions NAME``: the entry's versions, oldest first, shown in ``columns``."""

    @app.command(
        "versions",
        help=w.examples(
            f"List a {w.noun}'s versions, oldest first.",
            f"versions {w.example}",
            f"versions {w.shared_example} -o json",
        ),
    )
    def versions(
        ctx: typer.Context,
        name: str = typer.Argument(..., help=f"{w.noun.capitalize()} name, or OWNER/NAME for a shared {w.noun}."),
        output: Output = OutputOption,
    ) -> None:
        render(w.sdk(ctx).versions(name), output, columns)


def label_commands(app: typer.Typer, w: Words, labels: str, moved: str, removed: str) -> None:
    """``label NAME LABEL VERSION`` and ``unlabel NAME LABEL``; ``labels`` names two in the label's help
    ("staging or production"), ``moved`` and ``removed`` the labels of their examples."""
    noun = w.noun.capitalize()

    @app.command(
        "label",
        help=w.examples(
            "Point a label at a version; the label leaves the version it was on.", f"label {w.example} {moved} 3"
        ),
    )
    def label(
        ctx: typer.Context,
        name: str = typer.Argument(..., help=f"{noun} name."),
        label_name: str = typer.Argument(..., metavar="LABEL", help=f"Label, e.g. {labels}."),
        version: int = typer.Argument(..., help="Version number the label moves to."),
        output: Output = OutputOption,
    ) -> None:
        result = w.sdk(ctx).set_label(name, label_name, version)
        show_made(result, output, f"{w.noun} {name}: {result.label} -> version {result.version}")

    @app.command("unlabel", help=w.examples(f"Remove a label from a {w.noun}.", f"unlabel {w.example} {removed}"))
    def unlabel(
        ctx: typer.Context,
        name: str = typer.Argument(..., help=f"{noun} name."),
        label_name: str = typer.Argument(..., metavar="LABEL", help="Label to remove."),
    ) -> None:
        w.sdk(ctx).remove_label(name, label_name)
        err_console.print(f"{w.noun} {name}: label {label_name} removed")


def share_commands(app: typer.Typer, w: Words, shared_reads: str) -> None:
    """``share NAME --tenant T`` and ``unshare NAME --tenant T``; ``shared_reads`` says what the tenant may do."""
    noun = w.noun.capitalize()

    @app.command(
        "share",
        help=w.examples(
            f"Share a {w.noun} read-only with another tenant: {shared_reads}.",
            f"share {w.example} --tenant research",
        ),
    )
    def share(
        ctx: typer.Context,
        name: str = typer.Argument(..., help=f"{noun} name."),
        tenant: str = typer.Option(..., "--tenant", help=f"Tenant that may read the {w.noun}."),
    ) -> None:
        w.sdk(ctx).share(name, tenant)
        err_console.print(f"{w.noun} {name} shared read-only with tenant {tenant}")

    @app.command(
        "unshare",
        help=w.examples(f"Stop sharing a {w.noun} with a tenant.", f"unshare {w.example} --tenant research"),
    )
    def unshare(
        ctx: typer.Context,
        name: str = typer.Argument(..., help=f"{noun} name."),
        tenant: str = typer.Option(..., "--tenant", help="Tenant to take access from."),
    ) -> None:
        w.sdk(ctx).unshare(name, tenant)
        err_console.print(f"{w.noun} {name} no longer shared with tenant {tenant}")


def delete_command(app: typer.Typer, w: Words, refused: str, stored: str) -> None:
    """``delete NAME [--version N] [--yes]``; ``refused`` says when a deletion is refused, ``stored`` what is
    removed for good ("Artifacts are")."""

    @app.command(
        "delete",
        help=w.examples(
            f"Delete a {w.noun} with all its versions, or one version (refused while {refused}).",
            f"delete {w.example} --version 2",
            f"delete {w.example} --yes",
        ),
    )
    def delete(
        ctx: typer.Context,
        name: str = typer.Argument(..., help=f"{w.noun.capitalize()} name."),
        version: int | None = typer.Option(None, "--version", help="Delete only this version."),
        yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    ) -> None:
        what = (
            f"version {version} of {w.noun} {name}" if version is not None else f"{w.noun} {name} and all its versions"
        )
        if not yes:
            typer.confirm(f"Delete {what}? {stored} removed for good", abort=True, err=True)
        sdk = w.sdk(ctx)
        if version is not None:
            sdk.delete_version(name, version)
        else:
            sdk.delete(name)
        err_console.print(f"deleted {what}")
