# Two commands a fresh machine runs: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test checks installs lint typecheck unit browser postgres bench mutants clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict engine rollout service console demo app.py pages

# Two workers, one per CI core; --dist loadfile keeps a module on one worker, so its module-scoped
# servers start once, and --no-loadscope-reorder keeps tests/conftest.py's order (slowest files first).
# The 30 slowest tests are listed so that the suite's time stays visible.
unit: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30

browser:
	bash scripts/install-browser.sh

postgres:
	bash scripts/install-postgres.sh

# The static checks (CPU: the venv's install, ruff, mypy) and the system installs (apt: network and
# disk, one at a time since apt holds one lock) run side by side, two jobs; the tests start once both
# are done, with both cores to themselves.
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target checks installs
	$(MAKE) --no-print-directory unit

checks: lint typecheck

installs:
	$(MAKE) --no-print-directory browser
	$(MAKE) --no-print-directory postgres

demo: $(STAMP)
	$(PY) -m demo.living $(ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

# One-line bugs applied one at a time to a throwaway copy of the tree: does the explorer (and do the
# targeted tests) catch each? Writes bench/results/mutants.md.
mutants: $(STAMP)
	$(PY) bench/mutants.py --tests $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
