#!/usr/bin/env bash
# The GPU tier (pytest -m gpu) on a machine with an NVIDIA GPU whose python3 already holds a CUDA build of torch
# but not dlcloud's other requirements, and which cannot download anything.
#
#   scripts/gpu-tier.sh prepare    # here, with network: wheels for Python 3.12 and bubblewrap into .whl/
#   scripts/gpu-tier.sh run        # there, from the repository root, with .whl/ copied beside it
#
# prepare: the pinned requirements the tier imports (pyproject.toml), as manylinux x86_64 wheels for CPython
# 3.12, without numpy, pytest and its plugins (the machine's own, matched to its torch, are used), and this
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
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
        fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 pydantic==2.14.3 \
        pydantic-settings==2.16.3 sqlalchemy==2.1.9 alembic==1.20.1 httpx==0.28.1 anyio==4.16.0 typer==0.29.2 \
        rich==15.0.0 prometheus-client==0.26.0 pathspec==1.1.1 cryptography==50.0.2 msgspec==0.22.0 \
        plotext==6.1.0 optuna==5.0.0 pyyaml==6.0.3 nvidia-ml-py==13.615.71 pytest-asyncio==1.5.0 \
        pytest-timeout==2.4.0 pytest==9.2.0
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
