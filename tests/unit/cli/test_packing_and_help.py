"""Packing honours ignore files and skips links; every CLI command has help with an example."""

from __future__ import annotations

import os
import tarfile

import typer
from typer.main import get_command

from dlcloud.cli.main import app
from dlcloud.cli.packing import pack_directory


def test_pack_respects_ignore_files_and_skips_links(tmp_path):
    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"0" * 100)
    (root / "notes.log").write_text("log\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / ".dlcloudignore").write_text("data/\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    os.symlink(root / "train.py", root / "link.py")
    result = pack_directory(root)
    try:
        with tarfile.open(result.archive) as tf:
            names = sorted(tf.getnames())
        assert names == [".dlcloudignore", ".gitignore", "pkg/mod.py", "train.py"]
        assert result.skipped_links == ["link.py"]
        assert result.files == 4
    finally:
        result.archive.unlink()


def _commands(cmd, path=()):
    if isinstance(cmd, typer.core.TyperGroup):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def test_every_command_has_help_with_an_example():
    root = get_command(app)
    missing = [" ".join(p) for p, cmd in _commands(root) if "Example" not in (cmd.help or "")]
    assert missing == []


def test_read_commands_offer_json_output():
    root = get_command(app)
    readers = {
        ("jobs", "list"),
        ("jobs", "describe"),
        ("jobs", "metrics"),
        ("models", "list"),
        ("models", "describe"),
        ("models", "versions"),
        ("envs", "list"),
        ("envs", "describe"),
        ("envs", "create"),
        ("tenants", "list"),
        ("users", "list"),
        ("keys", "list"),
        ("quota",),
        ("usage",),
        ("audit",),
        ("whoami",),
    }
    for path, cmd in _commands(root):
        if path in readers:
            assert any("--output" in p.opts for p in cmd.params), path
