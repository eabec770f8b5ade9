# The two commands of README.md. Both create ./.venv and install the project into it first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/transfer serve

lint: $(STAMP)
	$(BIN)/ruff check transfer storage tests benchmarks
	$(BIN)/ruff format --check transfer storage tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) transfer-data .pytest_cache .mypy_cache .ruff_cache
