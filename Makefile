# dlcloud — `make run` starts the platform on this machine, `make test` runs the whole suite.
VENV ?= .venv
# Ray Serve, for bench/serving.py only: its own venv so that Ray's pins never touch ours
RAY_VENV ?= .venv-bench-ray
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=
# Which build of torch 2.13.0 the venvs get: TORCH=cuda (the default index's: on Linux the CUDA build) or
# TORCH=cpu (the CPU build, 2.13.0+cpu, from TORCH_INDEX: no GB of CUDA libraries for nothing). By default cuda
# where this machine has an NVIDIA GPU (`nvidia-smi -L` succeeds or /proc/driver/nvidia exists), cpu elsewhere;
# `make run TORCH=cpu` (or cuda) chooses. TORCH_INDEX (PyTorch's CPU index by default) is an extra index: its
# 2.13.0+cpu ranks above PyPI's 2.13.0, and where it cannot be reached pip goes on with the sources it is
# configured with (a mirror, --find-links); empty, torch comes from those alone. CI (.ci/run) gives TORCH=cpu
# TORCH_INDEX= : the CPU build its pip holds, nothing downloaded. An existing venv keeps its torch: `make clean`
# first to switch.
TORCH ?= $(shell (nvidia-smi -L >/dev/null 2>&1 || test -d /proc/driver/nvidia) && echo cuda || echo cpu)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(if $(filter-out cpu cuda,$(TORCH)),$(error TORCH must be cpu or cuda, got '$(TORCH)'))
TORCH_PIP_ARGS = $(if $(and $(filter cpu,$(TORCH)),$(TORCH_INDEX)),--extra-index-url $(TORCH_INDEX) )torch==2.13.0

.PHONY: install run test fuzz lint system-deps bench bench-deps clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, the build TORCH chose, so that nothing installed after it picks another
	$(PIP) install -q $(TORCH_PIP_ARGS)
	$(PIP) install -q -e ".[all,test,lint]"
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/dlcloud up

system-deps:
	bash scripts/install-system-deps.sh

# the suite on TEST_WORKERS workers (pytest-xdist, a file per worker at a time), then the timing-sensitive
# tests (marker ``serial``) alone
TEST_WORKERS ?= 2
test: system-deps install
	$(PY) -m pytest -m "not gpu and not serial" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	$(PY) -m pytest -m "serial and not gpu" $(PYTEST_ARGS)
	@echo "GPU tier (pytest -m gpu) is run on a GPU machine; it was deselected here."

# Schemathesis over /api/v1/openapi.json of a real `dlcloud up` on SQLite, then on PostgreSQL, signed as the
# admin and as another tenant's member (tests/fuzz/run.py, docs/api.md; `make test` runs a quick version).
# FUZZ_ARGS="--seed 1 --max-examples 100"
FUZZ_ARGS ?=
fuzz: install
	$(PY) tests/fuzz/run.py $(FUZZ_ARGS)
	$(PY) tests/fuzz/run.py --postgres $(FUZZ_ARGS)

# lint-imports: the import contracts of pyproject.toml ([tool.importlinter], docs/architecture.md)
lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

$(RAY_VENV)/.installed:
	test -x $(RAY_VENV)/bin/python || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install -q --upgrade pip
	# torch first, the build TORCH chose, as for our venv
	$(RAY_VENV)/bin/python -m pip install -q $(TORCH_PIP_ARGS)
	$(RAY_VENV)/bin/python -m pip install -q "ray[serve]==2.60.0" torch==2.13.0 numpy
	touch $@

# bench/serving.py also needs wrk (Debian/Ubuntu: apt-get install -y wrk)
bench-deps: $(RAY_VENV)/.installed

bench: install bench-deps
	$(PY) bench/job_latency.py
	$(PY) bench/api_throughput.py
	$(PY) bench/scheduler.py
	$(PY) bench/ddp_overhead.py
	$(PY) bench/datasets.py
	$(PY) bench/hpo.py
	$(PY) bench/serving.py --ray-venv $(RAY_VENV)

clean:
	rm -rf $(VENV) $(RAY_VENV) build dist src/*.egg-info
