"""How ``dlcloud jobs submit``'s options combine with a spec file: options win, lists and mappings add to the
file's, an option drops the field it conflicts with, a template job without a name is named after it."""

from __future__ import annotations

import re
from typing import Any

from typer.main import get_command

from dlcloud.cli.jobs import _apply_options
from dlcloud.cli.main import app


def options(**given: Any) -> dict[str, Any]:
    """Every option of the real command at its default (as the command passes them), then ``given``."""
    submit = get_command(app).commands["jobs"].commands["submit"]
    defaults = {p.name: [] if p.multiple else (False if p.is_flag else None) for p in submit.params}
    unknown = set(given) - set(defaults)
    assert not unknown, unknown
    return {**defaults, **given}


def test_no_option_leaves_the_file_as_it_is():
    spec = {"name": "a", "command": "x", "env": {"A": "1"}, "resources": {"gpus": 1}, "template": {}}
    _apply_options(spec, options())
    assert spec == {"name": "a", "command": "x", "env": {"A": "1"}, "resources": {"gpus": 1}, "template": {}}


def test_options_win_and_drop_what_they_conflict_with():
    spec = {"name": "a", "command": "x", "priority_class": "high", "resources": {"gpus": 1, "memory": "1Gi"}}
    _apply_options(spec, options(name="b", module="pkg.train", args=["--lr=1"], priority=5, gpus=2, code="."))
    assert spec == {
        "name": "b",
        "module": "pkg.train",
        "args": ["--lr=1"],
        "priority": 5,
        "resources": {"gpus": 2, "memory": "1Gi"},
        "code": ".",
    }


def test_lists_and_mappings_add_to_the_files():
    spec = {"name": "a", "env": {"A": "1"}, "datasets": [{"name": "clicks", "version": 1}], "publish": [80]}
    given = options(
        env=["B=2"], datasets=["views"], publish=[81], hparam=["lr=0.1", "tag=007"], max_restarts=3, backoff=1.5
    )
    _apply_options(spec, given)
    assert spec["env"] == {"A": "1", "B": "2"}
    assert spec["datasets"] == [{"name": "clicks", "version": 1}, "views"]
    assert spec["publish"] == [80, 81]
    assert spec["hparams"] == {"lr": 0.1, "tag": "007"}
    assert spec["restart"] == {"max_restarts": 3, "backoff_seconds": 1.5}


def test_a_template_job_without_a_name_is_named_after_the_template():
    spec: dict[str, Any] = {"template": {"label": "y"}, "register_model": {"path": "model.pt"}}
    _apply_options(spec, options(template="mlp", data="train.csv", non_preemptible=True, register_model="churn"))
    assert spec["template"] == {"label": "y", "name": "mlp", "data": "train.csv"}
    assert re.fullmatch(r"mlp-[0-9a-f]{6}", spec["name"])
    assert spec["preemptible"] is False
    assert spec["register_model"] == {"path": "model.pt", "name": "churn"}
