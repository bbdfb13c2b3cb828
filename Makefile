# Routine targets. `make run` and `make test` are the README's two commands: each installs
# what it needs into .venv first (idempotent), so they work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-gpu lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[mpich,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

install: $(STAMP)

## The default sweep on the embedded digits: 4 points at every default (local launcher, CPU when no GPU,
## MLflow in sqlite:///mlflow.db); about 23 s on two cores, 8 of them timing its points again alone.
run: $(STAMP)
	$(BIN)/python -m sweeper -m hidden=64,256 nproc=1,2

## The whole suite (what CI runs: .ci/run). As root with apt-get it brings up Slurm, PostgreSQL + the
## MLflow server and a headless browser first, and puts back what it started (scripts/test.sh);
## elsewhere their tests, and the GPU tests without a GPU, are skipped with a reason.
test: $(STAMP)
	bash scripts/test.sh

## On a GPU machine: the GPU tests only.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -m gpu

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf .pytest_cache .ruff_cache .cache outputs multirun .submitit
