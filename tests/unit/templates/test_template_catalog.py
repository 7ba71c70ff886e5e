"""The template table: defaults, bounds and names checked the same way for the API and the trainer."""

from __future__ import annotations

import shlex

import pytest

from dlcloud.templates.catalog import TEMPLATES, command_for, detect_format, get_template


def test_every_template_resolves_its_defaults() -> None:
    for name, template in TEMPLATES.items():
        if name == "cnn2d":
            assert template.resolve({"height": 4, "width": 4})["channels"] == 1
            continue
        resolved = template.resolve({})
        assert resolved["lr"] == 0.01 and resolved["epochs"] == 20, name


def test_values_given_as_text_are_converted() -> None:
    h = get_template("mlp").resolve({"layers": "3", "units": 128, "lr": "0.1", "dropout": 0})
    assert (h["layers"], h["units"], h["lr"], h["dropout"]) == (3, 128, 0.1, 0.0)
    assert get_template("lstm").resolve({"bidirectional": "true"})["bidirectional"] is True


@pytest.mark.parametrize(
    ("template", "given", "message"),
    [
        ("mlp", {"layers": 17}, "hparam layers must be int 1..16, got 17"),
        ("mlp", {"units": 0}, "hparam units must be int 1..4096, got 0"),
        ("mlp", {"lr": 0}, "hparam lr must be number > 0, ≤ 10, got 0"),
        ("mlp", {"epochs": 1001}, "hparam epochs must be int 1..1000"),
        ("mlp", {"dropout": 1}, "hparam dropout must be number ≥ 0, < 1, got 1"),
        ("mlp", {"layers": 2.5}, "hparam layers must be int 1..16, got 2.5"),
        ("mlp", {"layers": True}, "hparam layers must be int"),
        ("mlp", {"activation": "swish"}, "hparam activation must be one of relu, tanh, gelu, sigmoid"),
        ("logreg", {"layers": 2}, "template logreg has no hparam layers; its hparams are: lr, epochs"),
        ("cnn2d", {"width": 8}, "template cnn2d needs hparam height"),
    ],
)
def test_bad_hparams_say_what_is_allowed(template: str, given: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        get_template(template).resolve(given)


def test_unknown_template_lists_the_templates() -> None:
    with pytest.raises(ValueError, match="unknown template 'resnet'; templates: mlp, logreg, wide-deep, cnn1d"):
        get_template("resnet")


def test_format_from_the_file_name() -> None:
    assert detect_format("a.libsvm", None) == detect_format("A.SVM", None) == "libsvm"
    assert detect_format("a.csv", None) == detect_format(None, None) == "csv"
    assert detect_format("a.csv", "libsvm") == "libsvm"


def test_command_reads_the_dataset_variable() -> None:
    cmd = command_for({"name": "mlp", "data": "team/my-data@3", "path": "x y.csv", "label": "y"})
    assert cmd.startswith('python -m dlcloud.templates.train --template mlp --data="${DLCLOUD_DATASET_MY_DATA}" ')
    argv = shlex.split(cmd.split(" ", 6)[6])
    assert argv[:4] == ["--path", "x y.csv", "--label", "y"]
    assert argv[-4:] == ["--task", "classification", "--seed", "0"]
