# Two commands do all the set-up on a fresh machine:
#   make run    install what is needed, open the dashboard (train with one click on Start)
#   make test   install what is needed, run the test suite
PYTHON ?= python3
VENV ?= .venv
# Used only when no installed torch satisfies the project's requirement. On the
# project's CI machines this is a CPU build that lies on disk.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# pytest's worker processes (pytest-xdist); 0 runs the suite in this process.
TEST_WORKERS ?= 2

.PHONY: run train test lint bench setup clean

$(BIN)/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

# Keep an installed torch that satisfies the requirement; install one only if none does.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch, sys; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v < (2, 5))" 2>/dev/null \
		|| $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test,bench]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/speedboard gui

train: setup
	$(BIN)/speedboard train

test: setup
	$(BIN)/python -m ruff check core gui tests bench speedboard assets
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

bench: setup
	$(BIN)/speedboard bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
