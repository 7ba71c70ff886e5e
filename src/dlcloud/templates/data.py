"""Reading a template's training data: dense CSV with a header, or sparse LibSVM.

Every error is a ``DataError`` whose message names the file's line (1-based) and what was wrong, e.g.
``train.csv line 17: 3 columns, the header has 4``. Blank lines are skipped in both formats; ``#`` starts a
comment in LibSVM files. numpy only: no ML library.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlcloud.templates.catalog import DATA_FORMATS


class DataError(ValueError):
    """The data file cannot be used; the message says where and why."""


@dataclass(frozen=True)
class Table:
    """Examples as a dense float32 matrix, with their labels as the file wrote them."""

    features: np.ndarray  # [N, D] float32
    labels: list[str]
    feature_names: list[str]
    lines: list[int]  # the line each example is on, for messages about its label


def _number(text: str, where: str, what: str = "") -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{where}: {text.strip()!r} is not a number{what}") from None
    if not math.isfinite(value):
        raise DataError(f"{where}: {text.strip()!r} is not a finite number{what}")
    return value


def read_csv(path: Path, label: str | None = None) -> Table:
    """A CSV file with a header line; ``label`` names the label column (default: the last one).

    Raises:
        DataError: naming the line: a row with another number of columns than the header, a feature that is
            not a number, an empty label; no header, no rows, no such label column.
    """
    name = path.name
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header: list[str] | None = None
        rows: list[list[float]] = []
        labels: list[str] = []
        lines: list[int] = []
        col = -1
        try:
            for record in reader:
                line = reader.line_num
                if not record or all(not cell.strip() for cell in record):
                    continue
                if header is None:
                    header = [c.strip() for c in record]
                    if label is None:
                        col = len(header) - 1
                    elif label in header:
                        col = header.index(label)
                    else:
                        raise DataError(
                            f"{name} line {line}: the header has no column {label!r}; its columns: {', '.join(header)}"
                        )
                    if len(header) < 2:
                        raise DataError(f"{name} line {line}: the header has 1 column; a label and features are needed")
                    continue
                if len(record) != len(header):
                    raise DataError(f"{name} line {line}: {len(record)} columns, the header has {len(header)}")
                where = f"{name} line {line}"
                value = record[col].strip()
                if not value:
                    raise DataError(f"{where}: the label ({header[col]}) is empty")
                labels.append(value)
                lines.append(line)
                rows.append([_number(c, where, f" (column {header[i]})") for i, c in enumerate(record) if i != col])
        except csv.Error as exc:
            raise DataError(f"{name} line {reader.line_num}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if header is None:
        raise DataError(f"{name}: the file is empty; a header line and rows are needed")
    if not rows:
        raise DataError(f"{name}: the header is there but no rows follow")
    names = [h for i, h in enumerate(header) if i != col]
    return Table(np.asarray(rows, dtype=np.float32), labels, names, lines)


def read_libsvm(path: Path, num_features: int | None = None) -> Table:
    """A LibSVM file: ``LABEL INDEX:VALUE ...`` per line, indices from 1; ``qid:`` tokens are ignored.

    The matrix has ``num_features`` columns, or as many as the highest index in the file.

    Raises:
        DataError: naming the line: index 0 or below, an index above ``num_features``, an index given twice,
            a token that is not ``INDEX:VALUE``, a value or label that is not a number; no rows.
    """
    name = path.name
    entries: list[dict[int, float]] = []
    labels: list[str] = []
    lines: list[int] = []
    highest = 0
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].strip()
        if not content:
            continue
        where = f"{name} line {number}"
        label, *tokens = content.split()
        _number(label, where, " (the label)")
        row: dict[int, float] = {}
        for token in tokens:
            index_text, sep, value_text = token.partition(":")
            if index_text == "qid":
                continue
            if not sep or not index_text or not value_text:
                raise DataError(f"{where}: {token!r} is not INDEX:VALUE")
            try:
                index = int(index_text)
            except ValueError:
                raise DataError(f"{where}: index {index_text!r} is not an integer") from None
            if index < 1:
                raise DataError(f"{where}: index {index} (indices start at 1)")
            if num_features is not None and index > num_features:
                raise DataError(f"{where}: index {index} is above num_features ({num_features})")
            if index in row:
                raise DataError(f"{where}: index {index} appears twice")
            row[index] = _number(value_text, where, f" (index {index})")
            highest = max(highest, index)
        entries.append(row)
        labels.append(label)
        lines.append(number)
    if not entries:
        raise DataError(f"{name}: no rows")
    width = num_features or highest
    if width == 0:
        raise DataError(f"{name}: no features on any line")
    matrix = np.zeros((len(entries), width), dtype=np.float32)
    for i, row in enumerate(entries):
        for index, value in row.items():
            matrix[i, index - 1] = value
    return Table(matrix, labels, [str(i) for i in range(1, width + 1)], lines)


def find_file(root: Path, path: str | None) -> Path:
    """The data file: ``root/path``, ``root`` itself when it is a file, else the one file under ``root``
    (``.dlcloud-*`` bookkeeping aside)."""
    if path:
        target = root / path
        if not target.is_file():
            raise DataError(f"no file {path!r} in the data ({root})")
        return target
    if root.is_file():
        return root
    if not root.is_dir():
        raise DataError(f"the data {root} does not exist")
    # ``.dlcloud-*`` files are the store's bookkeeping (a dataset's manifest), never data
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".dlcloud-"))
    if len(files) != 1:
        found = ", ".join(str(p.relative_to(root)) for p in files[:10]) or "none"
        raise DataError(f"the data holds {len(files)} files ({found}); name one with the template's 'path'")
    return files[0]


def load(path: Path, data_format: str, *, label: str | None = None, num_features: int | None = None) -> Table:
    """The examples in ``path`` read as ``data_format`` (csv or libsvm)."""
    if data_format not in DATA_FORMATS:
        raise DataError(f"data format must be one of {', '.join(DATA_FORMATS)}, got {data_format!r}")
    if data_format == "libsvm":
        return read_libsvm(path, num_features)
    return read_csv(path, label)
