"""Building venvs: spec hashing, one build per hash under concurrency, inheritance, readable failures,
interrupted builds, and what of the server's environment a build sees and logs. No package index is reached:
requirements come from wheels made in the test."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dlcloud.executors import host_venvs
from dlcloud.executors.local import venvs
from dlcloud.executors.local.venvs import BuildError, BuildSpec, Runner
from tests.wheels import make_wheel

HOST = host_venvs.HostBuild.here(sys.executable)  # this host: its interpreter and base environment, no wheel


def inherit_spec(**kw: object) -> BuildSpec:
    fields: dict = dict(python=host_venvs.python_version(), inherit=True, no_index=True)
    fields.update(host_venvs.base_spec_fields())
    fields.update(kw)
    return BuildSpec(**fields)


def test_hash_covers_the_spec_but_not_order_or_where_wheels_are_stored() -> None:
    a = inherit_spec(requirements=("b==1", "a==2"), wheels=(("f" * 64, "code/t1/c1/one.whl"),))
    b = inherit_spec(requirements=("a==2", "b==1"), wheels=(("f" * 64, "code/t2/c2/two.whl"),))
    assert a.spec_hash() == b.spec_hash()
    assert len(a.spec_hash()) == 64
    for other in (
        inherit_spec(requirements=("a==2",)),
        inherit_spec(requirements=("b==1", "a==2"), wheels=(("e" * 64, "code/t1/c1/one.whl"),)),
        inherit_spec(requirements=("b==1", "a==2"), wheels=(("f" * 64, "code/t1/c1/one.whl"),), no_index=False),
        inherit_spec(
            requirements=("b==1", "a==2"), wheels=(("f" * 64, "code/t1/c1/one.whl"),), base_packages="changed"
        ),
    ):
        assert other.spec_hash() != a.spec_hash()
    assert BuildSpec.from_json(a.to_json()) == a


def test_interpreters_are_found_only_where_they_run(tmp_path: Path) -> None:
    assert host_venvs.find_interpreter(host_venvs.python_version()) == os.path.abspath(sys.executable)
    assert host_venvs.python_version() in host_venvs.available_versions()
    shim = tmp_path / "python3.29"  # on PATH, but not a working interpreter (like a pyenv shim)
    shim.write_text("#!/bin/sh\necho 'python3.29: command not found' >&2; exit 127\n")
    shim.chmod(0o755)
    assert host_venvs.find_interpreter("3.29", search_path=str(tmp_path)) is None
    assert "3.29" not in host_venvs.available_versions(search_path=str(tmp_path))
    assert host_venvs.find_interpreter("3.28", search_path=str(tmp_path)) is None


def test_base_distributions_are_read_from_site_packages() -> None:
    dists = host_venvs.base_distributions()
    assert "pytest" in dists and "dlcloud" in dists
    assert host_venvs.base_digest(dists) == host_venvs.base_digest(dict(dists))


def test_concurrent_builds_of_one_hash_build_once_and_inherit_the_base(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels")
    spec = inherit_spec(wheels=(("a" * 64, "code/t/c/tinypkg.whl"),))
    host = host_venvs.HostBuild.here(sys.executable, (("a" * 64, str(wheel)),))
    spec_hash = spec.spec_hash()
    envs_dir = tmp_path / "envs"
    results: list[venvs.BuildResult] = []
    threads = [
        threading.Thread(target=lambda: results.append(venvs.materialise(spec, spec_hash, envs_dir, Runner(), host)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(r.built for r in results) == [False, False, True]
    assert all(r.size_bytes > 0 for r in results)
    log = host_venvs.log_path(envs_dir, spec_hash).read_text()
    assert log.count("build started") == 1 and "build finished" in log
    venv = host_venvs.venv_dir(envs_dir, spec_hash)
    python = venv / "bin" / "python"
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, tinypkg, pytest; print(sys.prefix); print(tinypkg.__file__); print(pytest.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == str(venv)
    assert out[1].startswith(str(venv))  # installed into the venv
    assert not out[2].startswith(str(venv))  # inherited from the base, not installed again
    for path in (venv, venv / "bin", venv / "pyvenv.cfg"):
        assert path.stat().st_mode & 0o222 == 0, path  # read-only once built
    assert (venv / venvs.READY_MARKER).exists()
    pip = subprocess.run([str(venv / "bin" / "pip"), "--version"], capture_output=True, text=True, check=True)
    assert "pip" in pip.stdout
    host_venvs.remove_tree(venv)
    assert not venv.exists()


def test_broken_requirement_fails_readably_and_leaves_no_venv(tmp_path: Path) -> None:
    spec = inherit_spec(requirements=("nonexistent-pkg-dlcloud==9.9",))
    spec_hash = spec.spec_hash()
    with pytest.raises(BuildError, match="No matching distribution found for nonexistent-pkg-dlcloud==9.9") as exc:
        venvs.materialise(spec, spec_hash, tmp_path, Runner(), HOST)
    assert str(exc.value).startswith("pip install failed (exit code 1):\n")
    assert not host_venvs.venv_dir(tmp_path, spec_hash).exists()
    assert "build failed: pip install failed" in host_venvs.log_path(tmp_path, spec_hash).read_text()


def test_an_interrupted_build_is_built_again(tmp_path: Path) -> None:
    spec = inherit_spec()
    spec_hash = spec.spec_hash()
    leftover = host_venvs.venv_dir(tmp_path, spec_hash)
    (leftover / "bin").mkdir(parents=True)
    (leftover / "bin" / "half-written").write_text("x")
    result = venvs.materialise(spec, spec_hash, tmp_path, Runner(), HOST)
    assert result.built and venvs.is_ready(tmp_path, spec_hash)
    assert not (leftover / "bin" / "half-written").exists()
    assert "removing the unfinished venv" in host_venvs.log_path(tmp_path, spec_hash).read_text()


def test_build_environment_is_an_allow_list_plus_the_configured_index() -> None:
    server = {
        "PATH": "/bin",
        "HTTPS_PROXY": "http://proxy:3128",
        "PIP_INDEX_URL": "https://user:server-secret@mirror/simple",
        "PIP_CONFIG_FILE": "/etc/secret-pip.conf",
        "DLCLOUD_SECRET_KEY": "s",
        "AWS_SECRET_ACCESS_KEY": "k",
    }
    env = host_venvs.build_env_vars(server)
    assert env == {"PATH": "/bin", "HTTPS_PROXY": "http://proxy:3128", "PYTHONUNBUFFERED": "1", "PIP_NO_INPUT": "1"}
    env = host_venvs.build_env_vars(
        server, index_url="https://builds:t0ken@mirror/simple", extra_index_urls=["https://a", "https://b"]
    )
    assert env["PIP_INDEX_URL"] == "https://builds:t0ken@mirror/simple"
    assert env["PIP_EXTRA_INDEX_URL"] == "https://a https://b"
    assert venvs.url_credentials(env) == ("builds:t0ken", "t0ken")


def test_requirements_are_not_expanded_and_credentials_not_logged(tmp_path: Path) -> None:
    """pip expands ${NAME} in requirements files: a requirement naming the index variable must reach pip as
    written, and the build's output hides the index credentials pip's environment holds."""
    spec = inherit_spec(
        requirements=("x @ https://127.0.0.1:9/${PIP_INDEX_URL}/x-1.0-py3-none-any.whl",), no_index=False
    )
    env = host_venvs.build_env_vars(index_url="https://user:build-secret-42@127.0.0.1:9/simple")
    runner = Runner(env={**env, "PIP_RETRIES": "0"})  # nothing listens on port 9: fail at once
    with pytest.raises(BuildError) as exc:
        venvs.materialise(spec, spec.spec_hash(), tmp_path, runner, HOST)
    log = host_venvs.log_path(tmp_path, spec.spec_hash()).read_text()
    assert "stdout Collecting x @ https://127.0.0.1:9/${PIP_INDEX_URL}/" in log  # pip got the text as written
    assert "build-secret-42" not in log + str(exc.value)
    # a step that prints its environment, as the setup code of a hostile sdist can: the output is redacted
    out = io.StringIO()
    printenv = "import os; print(os.environ['PIP_INDEX_URL']); raise SystemExit(3)"
    with pytest.raises(BuildError) as exc:
        runner.run([sys.executable, "-c", printenv], host_venvs.BuildLog(out), time.monotonic() + 60, "printing")
    assert "https://***@127.0.0.1:9/simple" in out.getvalue() and "build-secret-42" not in out.getvalue()
    assert "https://***@127.0.0.1:9/simple" in str(exc.value) and "build-secret-42" not in str(exc.value)
