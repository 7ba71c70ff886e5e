"""Reading pip requirements files for ``dlcloud envs create -r``: requirements, wheels, nested files, options."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlcloud.client.environments import read_requirements
from dlcloud.errors import InvalidArgument
from tests.wheels import make_wheel


def test_requirements_wheels_nested_files_and_index_options(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist")
    (tmp_path / "base.txt").write_text("numpy==2.1  # pinned\n--extra-index-url https://extra/simple\n")
    req = tmp_path / "requirements.txt"
    req.write_text(
        "# a comment\n"
        "-r base.txt\n"
        "--index-url=https://mirror/simple\n"
        "scikit-learn>=1.5 ; python_version >= '3.10'\n"
        "torch \\\n  ==2.13.0\n"
        "\n"
        "dist/tinypkg-0.1-py3-none-any.whl\n"
        "-r requirements.txt\n"  # a cycle is read once
    )
    got = read_requirements(req)
    assert got.requirements == ["numpy==2.1", "scikit-learn>=1.5 ; python_version >= '3.10'", "torch    ==2.13.0"]
    assert got.wheels == [wheel.resolve()]
    assert got.index_url == "https://mirror/simple"
    assert got.extra_index_urls == ["https://extra/simple"]
    assert not got.no_index


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("-e .", "pip option -e is not supported"),
        ("--find-links /opt/wheels", "pip option --find-links is not supported"),
        ("missing-0.1-py3-none-any.whl", "wheel missing-0.1-py3-none-any.whl not found"),
    ],
)
def test_unsupported_lines_are_refused_with_their_place(tmp_path: Path, line: str, message: str) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text(f"numpy\n{line}\n")
    with pytest.raises(InvalidArgument, match=message) as exc:
        read_requirements(req)
    assert f"{req}:2" in str(exc.value)


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read requirements file"):
        read_requirements(tmp_path / "nope.txt")
