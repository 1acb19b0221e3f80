# make run   : set up .venv, run the three nodes with the shipped trained model (models/sim) driving the simulated robot (DURATION=10 s)
# make test  : set up .venv, run the default test suite: every test but the slow and soak tiers
# make test-slow / test-soak / test-all : the slow tier, the soak tier, every test
# make docs  : build the documentation site (mkdocs, strict: a broken link is an error) into site/
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MODEL  := models/sim
DURATION ?= 10
TASK ?= reach
# pytest-xdist workers for the test targets: one per core (TEST_JOBS=0: in one process)
TEST_JOBS ?= auto

.PHONY: setup run test test-slow test-soak test-all bench docs clean

setup: $(STAMP)

$(STAMP): setup.py vla_edge_ros/dependencies.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); \
	  else echo "error: '$(PYTHON) -m venv' failed; install the python3-venv package" >&2; exit 1; fi; }
	$(PY) -m pip install -q --upgrade pip setuptools
	$(PY) -m pip install -q --no-build-isolation -e ".[ros,train,test,ray,metaworld,docs]"
	@touch $(STAMP)

run: $(STAMP)
	@test -f $(MODEL)/model.safetensors || { echo "error: $(MODEL) is missing; it ships with the repository" \
	  "(retrain it, about 5 hours: $(VENV)/bin/vla-edge train --recipe $(MODEL)/recipe.yaml --out $(MODEL))" >&2; exit 1; }
	$(VENV)/bin/vla-edge run --config config/default.yaml --sim $(TASK) --duration $(DURATION)

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) -m "not slow and not soak" test

test-slow: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) -m slow test

test-soak: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) -m soak test

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) -m "" test

bench: $(STAMP)
	$(PY) bench/bench_model.py

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) models/tiny build *.egg-info
