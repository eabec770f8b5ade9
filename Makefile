# The two commands of README.md (serve, test). All targets create ./.venv and install the project into it first.
# test        lint + every test (the README's command)
# test-quick  lint + the tests not marked slow or s3: the inner loop while editing; run `make test` before pushing
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the MCP Inspector CLI (tests/test_mcp_inspector.py drives it), pinned, from the npm registry, into .cache/node
INSPECTOR_VERSION := 2.12.0
INSPECTOR := .cache/node/node_modules/.bin/mcp-inspector

.PHONY: serve test test-quick lint bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(INSPECTOR):
	npm install --prefix .cache/node --no-audit --no-fund --silent @modelcontextprotocol/inspector@$(INSPECTOR_VERSION)

serve: $(STAMP)
	$(BIN)/transfer serve

lint: $(STAMP)
	$(BIN)/ruff check transfer storage tests benchmarks
	$(BIN)/ruff format --check transfer storage tests benchmarks
	$(BIN)/mypy

test: lint $(INSPECTOR)
	$(BIN)/pytest

test-quick: lint $(INSPECTOR)
	$(BIN)/pytest -q -m "not slow and not s3"

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) transfer-data .pytest_cache .mypy_cache .ruff_cache
