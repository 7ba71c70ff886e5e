#!/usr/bin/env bash
# The GPU tier (pytest -m gpu) on a machine with an NVIDIA GPU whose python3 already holds a CUDA build of torch
# but not dlcloud's other requirements, and which cannot download anything.
#
#   scripts/gpu-tier.sh prepare    # here, with network: wheels for Python 3.12 and bubblewrap into .whl/
#   scripts/gpu-tier.sh run        # there, from the repository root, with .whl/ copied beside it
#
# prepare: the pinned requirements the tier imports (read from pyproject.toml), as manylinux x86_64 wheels for
# CPython 3.12, without numpy, tensorboard, pytest and its plugins (the machine's own are used), and this
# host's bwrap with the libraries it links (the sandbox); .whl/ is ignored by git (.git/info/exclude).
# run: installs the wheels into /tmp/site, bwrap into /usr/local/bin (its libraries only where missing), and
# runs pytest -m gpu with the machine's python3; pytest's log goes to $OUT/gpu-tier.log when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
prepare)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    rm -rf .whl && mkdir -p .whl/bin .whl/lib
    platforms=()
    for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
        platforms+=(--platform "${p}_x86_64")
    done
    # the pins of pyproject.toml (its dependencies and the gpu extra, pytest-timeout and pytest-asyncio of the test
    # extra), less what the machine has matched to its torch or the tier never imports (boto3: s3:// stores only)
    mapfile -t pins < <(python3 - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
pins = project["dependencies"] + extras["gpu"] + [p for p in extras["test"] if p.startswith(("pytest-timeout", "pytest-asyncio"))]
for pin in pins:
    if re.split(r"[=<>\[ ]", pin)[0] not in ("numpy", "boto3", "tensorboard"):
        print(pin)
PY
    )
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
        "${pins[@]}"
    rm -f .whl/numpy-*.whl .whl/pytest-*.whl .whl/pluggy-*.whl .whl/iniconfig-*.whl .whl/pygments-*.whl
    bwrap=$(command -v bwrap) || {
        echo "bwrap is not installed here: make system-deps" >&2
        exit 1
    }
    cp "$bwrap" .whl/bin/
    ldd "$bwrap" | awk '$3 ~ /^\// {print $3}' | grep -v -e libc.so -e ld-linux | xargs -r cp -L -t .whl/lib/
    du -sh .whl
    ;;
run)
    test -d .whl || {
        echo ".whl/ is missing: run 'scripts/gpu-tier.sh prepare' where pip can download, and carry .whl" >&2
        exit 1
    }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    install -m 0755 .whl/bin/bwrap /usr/local/bin/bwrap
    if ldd /usr/local/bin/bwrap | grep -q 'not found'; then
        cp -n .whl/lib/* /usr/local/lib/ && ldconfig
    fi
    export PYTHONPATH="$PWD/src:$PWD:/tmp/site" PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    log=${OUT:-/tmp}/gpu-tier.log
    python3 -m pytest -m gpu tests/gpu -v \
        "${@:2}" 2>&1 | tee "$log"
    ;;
*)
    echo "usage: scripts/gpu-tier.sh prepare|run [pytest args]" >&2
    exit 2
    ;;
esac
