"""The Makefile's choice of torch build (README, Setup): the CUDA build from the default index where an NVIDIA GPU
is present, the CPU build from PyTorch's CPU index elsewhere, TORCH=cpu|cuda to choose, and CI (.ci/run) on the
CPU build from pip's own sources. Read from ``make -n`` (what make would run), nothing installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


# what a make that runs this suite (``make test TORCH=cpu TORCH_INDEX=`` in CI) hands down to the makes it starts:
# its command-line variables travel in MAKEFLAGS and would win over the ones a test gives
_MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TORCH") and k not in _MAKE_VARIABLES}


def _torch_installs(tmp_path: Path, *args: str, gpu: bool | None = None, target: str = "install") -> list[str]:
    """The ``pip install ... torch==`` lines ``make -n`` would run for ``target`` into a venv that does not exist
    yet; ``gpu``: a fake ``nvidia-smi -L`` that succeeds (True) or none on PATH (False)."""
    env = _clean_env()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
        smi.chmod(0o755)
    if gpu is not None:  # PATH without any other nvidia-smi
        for tool in ("make", "sh", "test"):
            if found := shutil.which(tool):
                (bin_dir / tool).symlink_to(found)
        env["PATH"] = str(bin_dir)
    venv = tmp_path / "venv"
    res = subprocess.run(
        ["make", "-n", target, f"VENV={venv}", f"RAY_VENV={tmp_path / 'ray'}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return [line for line in res.stdout.splitlines() if re.search(r"pip install .*torch==2\.13\.0$", line)]


def test_a_machine_with_an_nvidia_gpu_gets_the_default_index_build(tmp_path: Path) -> None:
    (line,) = _torch_installs(tmp_path, gpu=True)
    assert line.endswith("pip install -q torch==2.13.0") and "index" not in line


def test_a_machine_without_gpu_gets_the_cpu_build(tmp_path: Path) -> None:
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver: make sees a GPU whatever PATH holds")
    (line,) = _torch_installs(tmp_path, gpu=False)
    assert f"--extra-index-url {CPU_INDEX} torch==2.13.0" in line


def test_torch_chooses_the_build_and_torch_index_its_index(tmp_path: Path) -> None:
    (cpu,) = _torch_installs(tmp_path, "TORCH=cpu", gpu=True)
    assert f"--extra-index-url {CPU_INDEX} torch==2.13.0" in cpu
    (cuda,) = _torch_installs(tmp_path, "TORCH=cuda")
    assert "index" not in cuda
    (mirror,) = _torch_installs(tmp_path, "TORCH=cpu", "TORCH_INDEX=http://mirror.internal/cpu")
    assert "--extra-index-url http://mirror.internal/cpu torch==2.13.0" in mirror
    (ray,) = _torch_installs(tmp_path, "TORCH=cpu", target="bench-deps")
    assert CPU_INDEX in ray


def test_a_torch_that_is_neither_cpu_nor_cuda_is_refused(tmp_path: Path) -> None:
    res = subprocess.run(
        ["make", "-n", "install", "TORCH=gpu"], cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode != 0 and "TORCH must be cpu or cuda, got 'gpu'" in res.stderr


def test_ci_installs_the_cpu_build_from_pips_own_sources(tmp_path: Path) -> None:
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line.split("#")[0].split() for line in ci.splitlines() if line.startswith("make ")]
    assert [c[:2] for c in commands] == [["make", "lint"], ["make", "test"]]  # lint (import contracts too), suite
    for command in commands:  # whichever installs the venv installs the CPU build
        assert "TORCH=cpu" in command and "TORCH_INDEX=" in command
        (where := tmp_path / command[1]).mkdir()
        (line,) = _torch_installs(where, *command[2:], gpu=True, target=command[1])
        assert line.endswith("pip install -q torch==2.13.0") and "index" not in line
