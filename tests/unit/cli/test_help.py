"""Every command's ``--help`` as printed by the real CLI: each ``[...]`` of its help texts is there as written, and
it shows an example of the command itself."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from dlcloud.cli.main import app, keep_indented_blocks


def _walk(cmd: typer.core.TyperCommand | typer.core.TyperGroup, path: tuple[str, ...] = ()) -> Iterator:
    yield path, cmd
    if isinstance(cmd, typer.core.TyperGroup):
        for name, sub in cmd.commands.items():
            yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(get_command(app)))
LEAVES = [(p, c) for p, c in COMMANDS if not isinstance(c, typer.core.TyperGroup)]


def _help(path: tuple[str, ...]) -> str:
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def _source_texts(cmd: typer.core.TyperCommand) -> list[str]:
    texts = [cmd.help or ""]
    texts += [getattr(p, "help", None) or "" for p in cmd.params if not getattr(p, "hidden", False)]
    return [t.replace("\b", "") for t in texts]


def _bracketed(text: str) -> Iterator[str]:
    """Each ``[`` of ``text`` with what follows it up to its ``]`` (or 20 characters), without whitespace."""
    for m in re.finditer(r"\[", text):
        end = text.find("]", m.start())
        piece = text[m.start() : end + 1] if 0 < end - m.start() < 80 else text[m.start() : m.start() + 20]
        yield re.sub(r"\s+", "", piece)


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) or "dlcloud" for p, _ in COMMANDS])
def test_help_prints_every_bracket_of_its_texts(path, cmd):
    printed = re.sub(r"\s+", "", _help(path))
    missing = [piece for text in _source_texts(cmd) for piece in _bracketed(text) if piece not in printed]
    assert missing == []


def test_the_walk_sees_the_texts_that_lost_their_brackets():
    """The help texts of the issue are among those checked (the test above would pass on an empty walk)."""
    texts = {p: " ".join(_source_texts(c)) for p, c in COMMANDS}
    assert "[default: 127.0.0.1]" in texts[("up",)]
    assert "[sgd, adam]" in texts[("tune", "submit")]
    assert "[pre] and [post]" in texts[("jobs", "logs")]


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_help_shows_an_example_of_the_command(path, cmd):
    printed = _help(path)
    _, sep, examples = printed.partition("Example")
    assert sep, f"dlcloud {' '.join(path)} --help has no example"
    assert re.search(rf"^\s+(\S+=\S+ )*dlcloud {' '.join(path)}\b", examples, re.MULTILINE), examples


def test_indented_paragraphs_are_kept_as_written():
    text = keep_indented_blocks("Do it.\n\n    Example:\n\n      dlcloud x --a\n      dlcloud x --b\n\n    Done.")
    assert text == "Do it.\n\nExample:\n\n\b\n  dlcloud x --a\n  dlcloud x --b\n\nDone."
    assert keep_indented_blocks(text) == text
