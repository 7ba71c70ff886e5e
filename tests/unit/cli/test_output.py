"""The CLI's tables and field lists print every header and value whole, brackets included, at any width."""

from __future__ import annotations

import sys

import pytest

from dlcloud.cli.main import main
from dlcloud.cli.output import Output, columns_that_fit, pack, render, render_fields

ROWS = [
    {"name": "mnist-train", "state": "FAILED", "reason": "attempt 1 failed with exit code 3 [oom]", "gpus": 1},
    {"name": "b", "state": "QUEUED", "reason": None, "gpus": 0},
]
COLUMNS = [("NAME", "name"), ("STATE", "state"), ("GPUS", "gpus"), ("REASON", "reason")]


def test_a_table_that_fits_prints_whole_with_its_brackets(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "120")
    render(ROWS, Output.table, COLUMNS)
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        "NAME         STATE   GPUS  REASON",
        "mnist-train  FAILED  1     attempt 1 failed with exit code 3 [oom]",
        "b            QUEUED  0     -",
    ]


def test_a_narrow_table_keeps_the_columns_that_fit_and_stacks_the_rest(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "30")
    render(ROWS, Output.table, COLUMNS, title="Jobs")
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        "Jobs",
        "NAME         STATE   GPUS",
        "mnist-train  FAILED  1",
        "  REASON=attempt 1 failed with",
        "  exit code 3 [oom]",
        "b            QUEUED  0",
        "  REASON=-",
    ]
    assert all(len(line) <= 30 for line in lines)


@pytest.mark.parametrize(
    ("widths", "width", "shown"),
    [
        ([10, 10, 10], 34, [0, 1, 2]),
        ([10, 30, 5], 20, [0, 2]),  # a wide column left out, a later narrow one kept
        ([50, 5], 20, [0]),  # the first column always, even too wide
    ],
)
def test_columns_that_fit(widths, width, shown):
    assert columns_that_fit(widths, width) == shown


def test_pack_keeps_items_whole_where_they_fit():
    items = ["A=1", "B=two words", "C=" + "x" * 30]
    assert pack(items, 40, indent=2) == ["  A=1  B=two words", "  C=" + "x" * 30]


def test_fields_print_their_values_as_written(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "120")
    render_fields({}, Output.table, [("Command", "python train.py --tags [a,b] [bold]x"), ("Exit code", None)])
    assert capsys.readouterr().out.splitlines() == [
        "Command    python train.py --tags [a,b] [bold]x",
        "Exit code  -",
    ]


def test_an_error_message_prints_its_brackets(monkeypatch, capsys, tmp_path):
    """``dlcloud``'s own error line: the message as the server or the CLI wrote it, not read as Rich markup."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for key, value in (("ENDPOINT", "http://127.0.0.1:9"), ("ACCESS_KEY", "AKTEST"), ("SECRET_KEY", "secret")):
        monkeypatch.setenv(f"DLCLOUD_{key}", value)
    monkeypatch.setattr(sys, "argv", ["dlcloud", "usage", "--since", "[bold]"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    assert "error (invalid_argument): --since takes a duration" in (err := capsys.readouterr().err)
    assert "got '[bold]'" in err
