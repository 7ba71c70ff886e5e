"""A trainer package (wheel or sdist) runs as ``python -m module args`` — the Google CloudML way."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import textwrap

import pytest

from tests.conftest import wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}


def _package_source(root):
    src = root / "trainer-0.1"
    (src / "trainer").mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "trainer"
            version = "0.1"

            [tool.setuptools]
            packages = ["trainer"]
            """
        )
    )
    (src / "trainer" / "__init__.py").write_text("")
    (src / "trainer" / "task.py").write_text("import sys\nprint('task args', sys.argv[1:])\n")
    return src


@pytest.fixture
def sdist(tmp_path):
    src = _package_source(tmp_path)
    out = tmp_path / "trainer-0.1.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(src, arcname="trainer-0.1")
    return out


@pytest.fixture
def wheel(tmp_path):
    src = _package_source(tmp_path)
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    return next(dist.glob("*.whl"))


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_package_runs_as_module(running_env, request, kind):
    file = request.getfixturevalue(kind)
    c = running_env.admin
    code = c.code.upload(file, kind=kind)
    assert code.kind == kind and code.size == file.stat().st_size
    c.jobs.submit({"name": f"pkg-{kind}", "code": code.id, "module": "trainer.task", "args": ["--lr", "0.1"]})
    job = wait_for(lambda: (j := c.jobs.get(f"pkg-{kind}")).state in TERMINAL and j, timeout=120, what="package job")
    lines = [x.text for x in c.jobs.logs(f"pkg-{kind}")]
    assert job.state == "SUCCEEDED", lines
    assert "task args ['--lr', '0.1']" in lines


def test_package_needs_module_not_command(running_env, wheel):
    from dlcloud.errors import InvalidSpec

    c = running_env.admin
    code = c.code.upload(wheel, kind="wheel")
    with pytest.raises(InvalidSpec, match="run a package with 'module:'"):
        c.jobs.submit({"name": "wrong", "code": code.id, "command": "python x.py"})
