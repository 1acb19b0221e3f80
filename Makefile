# make run   : set up .venv, write the tiny default model, run the three nodes on a synthetic camera (DURATION=10 s)
# make test  : set up .venv, run the whole test suite (slow tests: make test-slow)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MODEL  := models/tiny
DURATION ?= 10

.PHONY: setup run test test-slow bench clean

setup: $(STAMP)

$(STAMP): requirements.txt setup.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); \
	  else echo "error: '$(PYTHON) -m venv' failed; install the python3-venv package" >&2; exit 1; fi; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

$(MODEL)/config.json: | $(STAMP)
	$(VENV)/bin/vla-edge init-model --out $(MODEL) --preset tiny --seed 0

run: $(STAMP) $(MODEL)/config.json
	$(VENV)/bin/vla-edge run --config config/default.yaml --duration $(DURATION)

test: $(STAMP)
	$(PY) -m pytest -q test

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow test

bench: $(STAMP)
	$(PY) bench/bench_model.py

clean:
	rm -rf $(VENV) models build *.egg-info
