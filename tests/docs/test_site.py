"""The documentation site: built strictly, offline, complete, and failing when a page goes stale.

The build is MkDocs with Material (``mkdocs.yml``), strict: a broken link, a missing page or a reference to a Python
object that no longer exists stops it. The configuration, HTTP API, CLI and error references are generated from the
code at build time (``devtools/docs_hooks.py``); these tests hold them to the code they come from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import docs_hooks
from tests.docs.pages import DOCS, ROOT, pages
from transfer.settings import Settings

MKDOCS = Path(sys.executable).with_name("mkdocs")
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("TRANSFER_")}, "NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(out)],
        cwd=config.parent,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_loads_nothing_from_elsewhere(site: Path) -> None:
    """No web font, script, stylesheet or image from another host: the site reads the same offline."""
    loads = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)
    offenders = []
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        offenders += [f"{page.relative_to(site)}: {m.group(0)}" for m in loads.finditer(text)]
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page
    assert offenders == []


def test_the_configuration_reference_names_every_setting(site: Path) -> None:
    page = (site / "operations" / "configuration.html").read_text(encoding="utf-8")
    missing = [f"TRANSFER_{name.upper()}" for name in Settings.model_fields if f"TRANSFER_{name.upper()}" not in page]
    assert missing == []


def test_every_variable_the_code_reads_is_documented() -> None:
    """A ``TRANSFER_*`` (or other) variable read with os.environ/getenv anywhere in the service is a setting or a row
    of the reference's "read outside the settings" table."""
    read = re.compile(r"(?:environ\.get|environ\[|getenv)\(?\s*[\"']([A-Z][A-Z0-9_]+)[\"']")
    documented = {f"TRANSFER_{name.upper()}" for name in Settings.model_fields}
    for names, _, _ in docs_hooks.OTHER_VARIABLES:
        documented |= {n.strip() for n in names.split("/")}
    undocumented = {}
    for source in [*(ROOT / "transfer").rglob("*.py"), *(ROOT / "storage").rglob("*.py")]:
        for name in read.findall(source.read_text(encoding="utf-8")):
            if name not in documented and not name.startswith("MALLOC_"):
                undocumented[name] = str(source.relative_to(ROOT))
    assert undocumented == {}


def test_the_http_reference_has_every_route_of_the_openapi_document(site: Path) -> None:
    document = docs_hooks.openapi_document()
    page = (site / "reference" / "http-api.html").read_text(encoding="utf-8")
    served = json.loads((site / "reference" / "openapi.json").read_text())
    assert served["paths"].keys() == document["paths"].keys()
    missing = [
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters" and f"{method.upper()} {path}" not in page
    ]
    assert missing == []


def test_search_finds_a_setting_a_route_and_the_replica_page(site: Path) -> None:
    index = json.loads((site / "search" / "search_index.json").read_text())
    by_page: dict[str, str] = {}
    for doc in index["docs"]:
        page = doc["location"].split("#")[0]
        by_page[page] = by_page.get(page, "") + " " + doc["text"] + " " + doc["title"]
    assert "TRANSFER_S3_PART_SIZE" in by_page["operations/configuration.html"]
    assert "/v1/uploads/{uid}" in by_page["reference/http-api.html"]
    assert "replicas" in by_page["SCALING.html"].lower()


def test_a_broken_link_or_a_vanished_object_fails_the_build(tmp_path: Path) -> None:
    """What the strict build is for: a page that links to nothing, or documents a function that is gone."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "devtools", tmp_path / "devtools")
    page = tmp_path / "docs" / "guide" / "tus.md"
    page.write_text(page.read_text() + "\nSee [the hooks](no-such-page.md).\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr

    page.write_text(page.read_text().replace("See [the hooks](no-such-page.md).", ""))
    reference = tmp_path / "docs" / "reference" / "python-client.md"
    reference.write_text(reference.read_text() + "\n::: transfer.client.NoSuchClient\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "NoSuchClient" in done.stdout + done.stderr


def test_the_readme_is_a_front_page_with_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines() == [
        "make serve   # install into ./.venv and run the service on http://127.0.0.1:8080 (local storage in "
        "./transfer-data)",
        "make test    # install into ./.venv, then ruff, mypy --strict and the whole test suite",
    ]


def test_no_page_speaks_of_how_the_project_was_made() -> None:
    diary = re.compile(
        r"\bsession \d+\b|\b(?:this|last|next|earlier) round\b|\bround (?:two|three|four)\b|\bthis issue\b"
        r"|farm-bench|farm-studio|\.library",
        re.IGNORECASE,
    )
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for path in pages()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if diary.search(line)
    ]
    assert found == []


def test_the_benchmarks_page_dates_every_row_and_keeps_its_run() -> None:
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    table = text.split("## The latest figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| row ")]
    assert rows and all(re.search(r"\| \d{4}-\d{2}-\d{2} \|$", row) for row in rows), rows
    assert "AMD EPYC, 2 vCPU" in table
    (kept,) = re.findall(r"`(benchmarks/results/[^`]+\.json)`", table)
    run = json.loads((ROOT / kept).read_text())
    assert run["date"] in kept and run["cpu"] == "AMD EPYC, 2 vCPU"
    assert {row.rsplit("| ", 1)[-1].strip(" |") for row in rows} >= {run["date"]}
