# The two commands of README.md (serve, test). All targets create ./.venv and install the project into it first.
# install     the venv, the MCP Inspector CLI (pinned, into .cache/node), oidc-provider and the MCP TypeScript SDK
#             for the identity tests (pinned, into .cache/identity-node), the web page's and /docs' browser libraries (npm ci in transfer/web, pinned by its
#             package-lock.json; never copied into the repository) and, for the browser test, Debian's chromium; for the
#             S3 tests on Ceph 16.2 (devtools/ceph.py) Debian's Ceph monitor, OSD and RADOS Gateway, HAProxy for the
#             replica tests (tests/ops/test_replicas_ceph.py), and debootstrap, which makes the Debian sid root that Ceph
#             20.2 runs from (devtools/sidroot.py; the tests make it on first use, once per machine, in
#             /var/cache/transfer-tests): each only if missing, without recommends
# docs        the documentation site, built strictly (a warning, a broken link or a missing page fails) into ./site
# docs-serve  the same, previewed with live reload on http://127.0.0.1:8000 (nothing in production serves ./site)
# test        lint + the site + every test (the README's command), the test files spread over 3 worker processes (most tests
#             wait on servers and sockets, so 3 beat 2 on two cores; a file stays on one worker, for its fixtures)
# test-quick  lint + the tests not marked slow or s3: the inner loop while editing; run `make test` before pushing
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the MCP Inspector CLI (tests/agents/test_mcp_inspector.py drives it), pinned, from the npm registry, into .cache/node
INSPECTOR_VERSION := 2.12.0
INSPECTOR := .cache/node/node_modules/.bin/mcp-inspector
# the identity tests (tests/identity/): a certified OpenID Provider and the MCP TypeScript SDK's OAuth client, pinned
IDENTITY_NODE := .cache/identity-node
IDENTITY_PACKAGES := oidc-provider@9.13.3 @modelcontextprotocol/sdk@1.32.2
IDENTITY_STAMP := $(IDENTITY_NODE)/.installed-9.13.3-1.32.2
WEB := transfer/web
WEB_STAMP := $(WEB)/node_modules/.installed

.PHONY: install serve test test-quick lint docs docs-serve bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(WEB_STAMP): $(WEB)/package.json $(WEB)/package-lock.json
	command -v npm >/dev/null || (apt-get update && apt-get install -y npm)
	cd $(WEB) && npm ci --ignore-scripts --no-audit --no-fund
	touch $(WEB_STAMP)

$(INSPECTOR):
	command -v npm >/dev/null || (apt-get update && apt-get install -y npm)
	npm install --prefix .cache/node --no-audit --no-fund --silent @modelcontextprotocol/inspector@$(INSPECTOR_VERSION)

$(IDENTITY_STAMP):
	command -v npm >/dev/null || (apt-get update && apt-get install -y npm)
	npm install --prefix $(IDENTITY_NODE) --no-audit --no-fund --silent $(IDENTITY_PACKAGES)
	touch $(IDENTITY_STAMP)

install: $(STAMP) $(WEB_STAMP) $(INSPECTOR) $(IDENTITY_STAMP)
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	command -v radosgw >/dev/null && command -v ceph-osd >/dev/null || (apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ceph-mon ceph-osd radosgw ceph-common)
	command -v haproxy >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy)
	command -v debootstrap >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap)

serve: $(STAMP) $(WEB_STAMP)
	$(BIN)/transfer serve

lint: $(STAMP)
	$(BIN)/ruff check transfer storage devtools tests benchmarks
	$(BIN)/ruff format --check transfer storage devtools tests benchmarks
	$(BIN)/mypy

# Material for MkDocs prints a banner about its successor on every build; the site is built with it as it is
DOCS_ENV := NO_MKDOCS_2_WARNING=1

docs: $(STAMP)
	$(DOCS_ENV) $(BIN)/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	$(DOCS_ENV) $(BIN)/mkdocs serve --strict -a 127.0.0.1:8000

test: lint install docs
	$(BIN)/pytest -n 3 --dist loadfile

test-quick: lint install
	$(BIN)/pytest -q -m "not slow and not s3"

# bench        every row of the goals table (benchmarks/results/latest.md, .png), S3 included: 17 min here (AMD EPYC, 2 vCPU)
# bench-quick  the same rows on 256 MiB files: about 8 minutes (the S3 server is Swift s3api from .cache/swift-venv)
bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick --s3

bench: $(STAMP)
	$(BIN)/python -m benchmarks --s3

clean:
	rm -rf $(VENV) $(WEB)/node_modules transfer-data site .pytest_cache .mypy_cache .ruff_cache
