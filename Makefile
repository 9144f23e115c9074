# Two set-up commands (see README.md):
#   make lab    creates .venv, installs, makes sure RabbitMQ and Redis answer, runs the lab (JOBS runs at
#               once, never two on the same FM's code; JOBS=1: one after another)
#   make test   the same set-up, then pytest (unit + integration) and pyright (strict); not the by-hand
#               attendee runs (make test-by-hand: about 300 s together, see README)
#   make bench  the chord benchmark (bench/bench_chord.py, docs/benchmarks.md) in namespace rclbench unless
#               RCL_NAMESPACE is set; options with BENCH_ARGS, e.g. make bench BENCH_ARGS="-n 100 1000 --repeats 2"
#   make matrix the lab, --prove and the claims on every Celery version in matrix/ (one venv each
#               under .lab/matrix/), then one table of what holds where (lab/matrix.py)
# Pass options to the lab with ARGS, e.g. make lab ARGS="--only fm3 --prove"; to the matrix with
# MATRIX_ARGS, e.g. make matrix MATRIX_ARGS="--only 5.5".

PYTHON ?= python3
JOBS ?= 4
PYTEST_ARGS ?= -m "not attendee"
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: lab test test-by-hand matrix services typecheck down clean bench

BENCH_STAMP := $(VENV)/.bench-installed

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is needed, this is " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

services: $(STAMP)
	$(BIN)/python -m lab.services

lab: services
	$(BIN)/python run_all_fms.py --jobs $(JOBS) $(ARGS)

test: services
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(BIN)/pyright

test-by-hand: services
	$(BIN)/python -m pytest -m attendee tests/test_by_hand_steps.py

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: services $(BENCH_STAMP)
	RCL_NAMESPACE=$${RCL_NAMESPACE:-rclbench} $(BIN)/python bench/bench_chord.py $(BENCH_ARGS)

matrix: services
	$(BIN)/python -m lab.matrix $(MATRIX_ARGS)

typecheck: $(STAMP)
	$(BIN)/pyright

# --down refuses (exit 2) while a run holds the namespace: so does `make clean` then; anything else is ignored
down:
	@status=0; test -x $(BIN)/python && $(BIN)/python run_all_fms.py --down || status=$$?; test $$status -ne 2

clean: down
	rm -rf $(VENV) .lab *.egg-info
