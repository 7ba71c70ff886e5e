# dlcloud — `make run` starts the platform on this machine, `make test` runs the whole suite.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=

.PHONY: install run test lint system-deps bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build of torch 2.13.0 is installed first so nothing pulls CUDA packages
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[all,test,lint]"
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/dlcloud up

system-deps:
	bash scripts/install-system-deps.sh

test: system-deps install
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)
	@echo "GPU tier (pytest -m gpu) is run on a GPU machine; it was deselected here."

lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

bench: install
	$(PY) bench/job_latency.py
	$(PY) bench/api_throughput.py
	$(PY) bench/scheduler.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
