"""The docs name only commands and options the real CLI has: every ``dlcloud ...`` invocation in README.md and
docs/*.md (in shell code blocks and in inline code) is walked through the Typer app's command tree, and
docs/cli.md's command tree is the real one, command for command."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.main import get_command

from dlcloud.cli.main import app

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "text"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# ``dlcloud`` as a command word: at the start, or after a shell separator or a ``$(``
INVOCATION = re.compile(r"(?:^|(?<=[\s;&|(]))dlcloud(?=\s+\S)")
COMMENT = re.compile(r"(?:^|\s)#.*$")
ROOT: Any = get_command(app)  # a Typer group: its commands by name
GROUPS = {name for name, cmd in ROOT.commands.items() if hasattr(cmd, "commands")}


@dataclass(frozen=True)
class Mention:
    doc: str
    line: int
    text: str


def _shell_lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """The lines of shell-like fenced blocks (a ``\\``-continued line joined to the next), with their numbers and
    whether the block is a shell block (else it may show output too)."""
    lang: str | None = None
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(2).lower()
            continue
        if lang is None or lang not in SHELL_BLOCKS:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line, lang in ("bash", "sh", "shell")
        pending = ""


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines outside fenced blocks."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            yield number, line


def mentions() -> Iterator[Mention]:
    """Every ``dlcloud ...`` invocation of the docs: from shell blocks, from inline code that starts with
    ``dlcloud`` and from inline code that starts with a command group and a word (``jobs submit``)."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        name = str(doc.relative_to(REPO))
        for number, line, shell in _shell_lines(text):
            prompt = line.lstrip().startswith("$ ")
            line = COMMENT.sub("", line.lstrip()[2:] if prompt else line)
            words = line.split()
            # in a block that may show output (``dlcloud is starting at ...``) a line without a prompt counts
            # where its second word is a command or an option
            if not (shell or prompt) and (len(words) < 2 or not (words[1] in ROOT.commands or words[1][0] in "-[")):
                continue
            for match in INVOCATION.finditer(line):
                yield Mention(name, number, line[match.start() :])
        for number, line in _prose_lines(text):
            for span in INLINE.findall(line):
                words = span.split()
                if words[0] == "dlcloud" and len(words) > 1:
                    yield Mention(name, number, span)
                elif words[0] in GROUPS and len(words) > 1 and re.fullmatch(r"[a-z][a-z-]*", words[1]):
                    yield Mention(name, number, "dlcloud " + span)


def _words(command: str) -> list[str]:
    """The words of one command: up to a shell separator, a comment or the end of a ``$(...)``."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    try:
        for word in lexer:
            if word and set(word) <= set(";&|()<>"):
                break
            words.append(word)
    except ValueError:  # an unclosed quote: the command goes on past what the line holds
        pass
    return words


def _options(cmd: Any) -> dict[str, bool]:
    """The command's options, each with whether it takes a value."""
    out = {"--help": False, "-h": False}
    for param in cmd.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        takes_value = not (getattr(param, "is_flag", False) or getattr(param, "count", False))
        for opt in (*param.opts, *param.secondary_opts):
            out[opt] = takes_value and opt not in param.secondary_opts
    return out


def problems(mention: Mention) -> list[str]:
    """What the invocation names that the CLI lacks."""
    words = [w.strip("[]") for w in _words(mention.text)[1:]]
    cmd, path, out = ROOT, ["dlcloud"], []
    i = 0
    while i < len(words):
        word = words[i]
        if not word or word.startswith(("<", "{", "$", ".")) or re.fullmatch(r"-\d.*", word):
            i += 1
            continue
        if word.startswith("-"):
            opts = _options(cmd)
            opt = word.split("=", 1)[0]
            if opt not in opts:
                out.append(f"{' '.join(path)} has no option {opt}")
            elif opts[opt] and "=" not in word:
                i += 1  # its value
            i += 1
            continue
        commands = getattr(cmd, "commands", None)
        if commands is None:
            i += 1  # an argument
            continue
        if word not in commands:
            out.append(f"{' '.join(path)} has no command {word!r}")
            break
        cmd, path = commands[word], [*path, word]
        i += 1
    return out


def test_the_walk_finds_what_is_missing() -> None:
    """The checker itself: names of commands and options that do not exist are caught, real ones pass."""
    good = Mention("x.md", 1, "dlcloud --profile local jobs submit --name a --args --lr=0.1 --follow -o json")
    assert problems(good) == []
    assert problems(Mention("x.md", 1, "dlcloud jobs get mnist")) == ["dlcloud jobs has no command 'get'"]
    assert problems(Mention("x.md", 1, "dlcloud up --sandbox-uid-start 5")) == [
        "dlcloud up has no option --sandbox-uid-start"
    ]
    assert problems(Mention("x.md", 1, "dlcloud jobs logs x --follow | tail # --nothing")) == []
    found = [m.text for m in mentions() if m.doc == "docs/cli.md"]
    assert any(t.startswith("dlcloud jobs submit -f job.yaml") for t in found)


def test_every_command_and_option_the_docs_name_exists() -> None:
    found = list(mentions())
    assert len(found) > 300  # the docs are read (README and docs/ hold hundreds of invocations)
    bad = [f"{m.doc}:{m.line}: {p}  ({m.text.strip()[:100]})" for m in found for p in problems(m)]
    assert bad == [], "\n".join(bad)


def _command(span: str) -> Any | None:
    """The leaf command a code span names (``jobs submit``, ``dlcloud up``), or None."""
    words = span.split()
    words = words[1:] if words[:1] == ["dlcloud"] else words
    while words and not re.fullmatch(r"[a-z][a-z-]*", words[-1]):  # NAME [REF]: its arguments
        words.pop()
    cmd: Any = ROOT
    for word in words:
        cmd = getattr(cmd, "commands", {}).get(word)
        if cmd is None:
            return None
    return None if not words or hasattr(cmd, "commands") else cmd


def option_lists() -> Iterator[tuple[int, str, str, Any]]:
    """docs/cli.md's option lists (a paragraph such as "`jobs logs`: `-f/--follow`, `--tail N`"): each option with
    the commands it is listed for, the ones named in code before it in its paragraph."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    paragraph: list[tuple[int, str]] = []
    for number, line in [*_prose_lines(text), (0, "")]:
        if line.strip():
            paragraph += [(number, span) for span in INLINE.findall(line)]
            continue
        current: list[tuple[str, Any]] = []
        last_was_command = False
        for number_, span in paragraph:
            cmd = _command(span)
            if cmd is not None:
                current = [*current, (span, cmd)] if last_was_command else [(span, cmd)]
            elif re.match(r"--?[a-z]", span):
                for opt in span.split()[0].split("/"):
                    for name, command in current:
                        yield number_, opt.split("=")[0], name, command
            elif re.fullmatch(r"[a-z]+", span):  # a command of the section named alone (`describe`): unknown
                current = []
            last_was_command = cmd is not None
        paragraph = []


def test_the_option_lists_of_cli_md_name_real_options() -> None:
    listed = list(option_lists())
    assert len(listed) > 100
    bad = [f"docs/cli.md:{n}: {name} has no option {opt}" for n, opt, name, cmd in listed if opt not in _options(cmd)]
    assert bad == [], "\n".join(bad)


# options the docs name in inline code that belong to other programs, not to dlcloud's CLI
OTHER_PROGRAMS = {
    "--algorithms": "bench/hpo.py",
    "--prune-min-resource": "bench/hpo.py",
    "--epochs": "bench/ddp_overhead.py",
    "--jobs": "bench/scheduling_policies.py",
    "--json": "bench/scheduling_policies.py",
    "--allow-run-as-root": "mpirun",
    "--chief_hosts": "TensorFlow parameter-server scripts",
    "--ps_hosts": "TensorFlow parameter-server scripts",
    "--nproc_per_node": "torchrun",
    "--data-binary": "curl",
    "--disable-host-loopback": "slirp4netns",
    "--disable-userns": "bwrap",
    "--find-links": "pip",
    "--no-deps": "pip",
    "--lr": "a user's training script",
}


def _all_options(cmd: Any) -> set[str]:
    return set(_options(cmd)).union(*(_all_options(sub) for sub in getattr(cmd, "commands", {}).values()))


def test_an_option_named_alone_is_one_of_the_cli_or_of_a_known_other_program() -> None:
    """An option in inline code on its own (``--sandbox-uid-start``) must exist somewhere in the CLI, unless it
    is another program's (OTHER_PROGRAMS)."""
    known = _all_options(ROOT) | set(OTHER_PROGRAMS)
    bad = []
    for doc in DOCS:
        for number, line in _prose_lines(doc.read_text(encoding="utf-8")):
            for span in INLINE.findall(line):
                if re.match(r"--[a-z]", span):
                    bad += [
                        f"{doc.relative_to(REPO)}:{number}: {opt}"
                        for opt in (o.split("=")[0] for o in span.split()[0].split("/"))
                        if opt not in known
                    ]
    assert bad == [], "\n".join(bad)


def _real_tree() -> dict[str, set[str]]:
    return {name: set(getattr(cmd, "commands", {})) for name, cmd in ROOT.commands.items()}


def _documented_tree() -> dict[str, set[str]]:
    """docs/cli.md's command tree: the first fenced block, a line per command (``jobs submit | list | ...``)."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    block = re.search(r"```\n(dlcloud \[.*?)```", text, re.S)
    assert block, "docs/cli.md has no command tree"
    tree: dict[str, set[str]] = {}
    for line in block.group(1).splitlines()[1:]:
        line = re.split(r"\s{2,}|\s+\(", line.strip())[0]
        if not line:
            continue
        name, _, subs = line.partition(" ")
        tree[name] = {s.strip() for s in subs.split("|") if s.strip()}
    return tree


def test_the_command_tree_in_cli_md_is_the_real_one() -> None:
    documented, real = _documented_tree(), _real_tree()
    assert sorted(documented) == sorted(real)
    for name in real:
        assert documented[name] == real[name], name
