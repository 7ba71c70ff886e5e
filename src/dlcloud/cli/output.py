"""Rendering for the CLI: Rich tables for people, ``-o json`` for scripts."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def transfer_progress() -> Progress:
    """The progress bar of an upload or download, on stderr (gone once done where stderr is a terminal)."""
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err_console,
        transient=not err_console.is_terminal,
    )


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOption = typer.Option(Output.table, "-o", "--output", help="Output format: table or json.")


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def short_time(value: str | None) -> str:
    if not value:
        return "-"
    return value.replace("T", " ")[:19]


def render(
    data: Any,
    output: Output,
    columns: Sequence[tuple[str, str | Callable[[dict[str, Any]], Any]]],
    *,
    title: str | None = None,
) -> None:
    if output == Output.json:
        print_json(data)
        return
    rows = data if isinstance(data, list) else [data]
    table = Table(title=title, header_style="bold", box=None, pad_edge=False)
    for header, _ in columns:
        table.add_column(header)
    for row in rows:
        cells = []
        for _, getter in columns:
            value = getter(row) if callable(getter) else row.get(getter)
            cells.append("-" if value is None else str(value))
        table.add_row(*cells)
    if not rows:
        console.print("(none)")
        return
    console.print(table)


def render_fields(data: dict[str, Any], output: Output, fields: Sequence[tuple[str, Any]]) -> None:
    if output == Output.json:
        print_json(data)
        return
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        console.print(f"[bold]{key.ljust(width)}[/bold]  {'-' if value is None else value}")
