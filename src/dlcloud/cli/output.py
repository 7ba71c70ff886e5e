"""Rendering for the CLI: Rich tables for people, ``-o json`` for scripts.

A table never cuts a header or a value short: where every column fits the console's width it prints whole; where
not, the table keeps the columns that fit, in order (the first always), and each row's other values follow it
on indented lines (``HEADER=value``), wrapped at the width.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import typer
from pydantic import BaseModel
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from dlcloud.schemas.common import format_memory

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
T = TypeVar("T")


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


def transfer(shown: str, run: Callable[[Callable[[int], None]], T], total: int | None = None) -> T:
    """``run(advance)`` under the progress bar ``shown`` (``transfer_progress``); ``advance(n)`` counts ``n`` more
    bytes moved of ``total`` (None: unknown)."""
    with transfer_progress() as progress:
        task = progress.add_task(shown, total=total)
        return run(lambda n: progress.advance(task, n))


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOption = typer.Option(Output.table, "-o", "--output", help="Output format: table or json.")


def print_json(data: Any) -> None:
    """``data`` as indented JSON; a read model (or a list of them) as the server sent it."""
    typer.echo(json.dumps(jsonable(data), indent=2, default=str))


def jsonable(data: Any) -> Any:
    """Read models (also in a list) as their JSON form: every field the server sent, in its order."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [jsonable(item) for item in data]
    return data


def size_text(n: int | None) -> str:
    """A size in bytes for a table: ``512B``, ``1.5Mi``; ``-`` for none."""
    if n is None:
        return "-"
    return format_memory(n) if n >= 1024 else f"{n}B"


def short_time(value: datetime | str | None) -> str:
    if not value:
        return "-"
    text = value.isoformat() if isinstance(value, datetime) else value
    return text.replace("T", " ")[:19]


# a column: its header and the field whose JSON value it shows, or a function of the row (a read model)
Column = tuple[str, str | Callable[[Any], Any]]
GAP = 2  # spaces between two columns of a table


def render(data: Any, output: Output, columns: Sequence[Column], *, title: str | None = None) -> None:
    if output == Output.json:
        print_json(data)
        return
    rows = data if isinstance(data, list) else [data]
    if not rows:
        console.print("(none)")
        return
    headers = [header for header, _ in columns]
    cells = [[_cell(row, jsonable(row), getter) for _, getter in columns] for row in rows]
    widths = [max(cell_len(text) for text in (header, *(r[i] for r in cells))) for i, header in enumerate(headers)]
    shown = columns_that_fit(widths, console.width)
    if len(shown) == len(columns):
        table = Table(title=title, header_style="bold", box=None, pad_edge=False)
        for header in headers:
            table.add_column(header, no_wrap=True)
        for r in cells:
            table.add_row(*(Text(text) for text in r))
        console.print(table)
    else:
        _print_stacked(title, headers, cells, widths, shown)


def _cell(row: Any, shown: Any, getter: str | Callable[[Any], Any]) -> str:
    value = getter(row) if callable(getter) else shown.get(getter)
    return "-" if value is None else str(value)


def columns_that_fit(widths: Sequence[int], width: int) -> list[int]:
    """The indices of the columns a table of ``width`` shows whole: the first always, then each in order that
    still fits beside those before it."""
    shown, used = [0], widths[0] if widths else 0
    for i, w in enumerate(widths[1:], start=1):
        if used + GAP + w <= width:
            shown.append(i)
            used += GAP + w
    return shown


def _print_stacked(
    title: str | None, headers: list[str], cells: list[list[str]], widths: list[int], shown: list[int]
) -> None:
    """The table of the ``shown`` columns, each row followed by its other values, indented and wrapped."""

    def line(texts: list[str]) -> str:
        return (
            (" " * GAP)
            .join(text + " " * (widths[i] - cell_len(text)) for i, text in zip(shown, texts, strict=True))
            .rstrip()
        )

    if title:
        console.print(Text(title, style="bold"))
    console.print(Text(line([headers[i] for i in shown]), style="bold"))
    rest = [i for i in range(len(headers)) if i not in shown]
    for r in cells:
        console.print(Text(line([r[i] for i in shown])))
        for text in pack([f"{headers[i]}={r[i]}" for i in rest], console.width, indent=GAP):
            console.print(Text(text))


def pack(items: list[str], width: int, *, indent: int) -> list[str]:
    """``items`` on lines of at most ``width`` after ``indent`` spaces, as many to a line as fit; an item longer
    than a line alone is wrapped at its spaces (a word is never cut)."""
    lines: list[str] = []
    current = ""
    room = max(width - indent, 20)
    for item in items:
        if current and cell_len(current) + GAP + cell_len(item) <= room:
            current += " " * GAP + item
            continue
        if current:
            lines.append(current)
        parts = textwrap.wrap(item, width=room, break_long_words=False, break_on_hyphens=False) or [item]
        lines += parts[:-1]
        current = parts[-1]
    if current:
        lines.append(current)
    return [" " * indent + text for text in lines]


def render_fields(data: Any, output: Output, fields: Sequence[tuple[str, Any]]) -> None:
    if output == Output.json:
        print_json(data)
        return
    width = max(len(k) for k, _ in fields)
    for key, value in fields:  # a value prints as written, brackets and all
        console.print(f"[bold]{key.ljust(width)}[/bold]  {escape('-' if value is None else str(value))}")
