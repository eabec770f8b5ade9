"""The MCP tools as the official MCP Inspector CLI (``@modelcontextprotocol/inspector --cli``, a Node client nobody
on this project wrote) sees them: tools/list and tools/call over stdio (``transfer mcp`` started by the Inspector)
and over streamable HTTP (``/mcp`` of a live server). The Inspector checks every structured result against the
tool's output schema, so these calls also prove the schemas describe what the tools return.

The Inspector is installed by ``make`` (pinned, into ``.cache/node``); run alone, this module installs the same
version there with npm, and is skipped only on a machine without Node.js."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer, running
from transfer.settings import Settings

INSPECTOR_VERSION = "2.12.0"  # the Makefile pins the same version
REPO = Path(__file__).resolve().parents[2]
PREFIX = REPO / ".cache" / "node"
BIN = PREFIX / "node_modules" / ".bin" / "mcp-inspector"


def _installed_version() -> str | None:
    manifest = PREFIX / "node_modules" / "@modelcontextprotocol" / "inspector" / "package.json"
    if not manifest.is_file():
        return None
    version: str = json.loads(manifest.read_text())["version"]
    return version


@pytest.fixture(scope="module")
def inspector() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed to run the MCP Inspector")
    if _installed_version() != INSPECTOR_VERSION or not BIN.exists():
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(PREFIX),
                "--no-audit",
                "--no-fund",
                "--silent",
                f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}",
            ],
            check=True,
            timeout=600,
        )
    return BIN


def inspect(inspector: Path, *argv: str, cwd: Path | None = None) -> dict[str, Any]:
    """One Inspector CLI call; its JSON answer. Exit 0: the Inspector found the answer well-formed (results checked
    against the output schema); exit 5: the same, for a tool error (isError)."""
    out = subprocess.run(
        [str(inspector), "--cli", *argv], capture_output=True, text=True, timeout=120, cwd=cwd, stdin=subprocess.DEVNULL
    )
    assert out.returncode in (0, 5), out.stdout + out.stderr
    answer: dict[str, Any] = json.loads(out.stdout)
    assert (out.returncode == 5) == bool(answer.get("isError")), out.stdout + out.stderr
    return answer


def _error(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["isError"] is True, answer
    body: dict[str, Any] = json.loads(answer["content"][0]["text"])["error"]
    return body


@pytest.fixture
def stdio_server(tmp_path: Path) -> Iterator[list[str]]:
    """The command line (for the Inspector) that starts `transfer mcp` on stdio, as an agent's config would."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("notes for another agent\n" * 100)
    yield [
        "--cwd",
        str(work),
        "-e",
        f"TRANSFER_DATA_DIR={tmp_path / 'data'}",
        sys.executable,
        "-m",
        "transfer",
        "mcp",
    ]


def test_inspector_over_stdio(inspector: Path, stdio_server: list[str]) -> None:
    listed = inspect(inspector, *stdio_server, "--method", "tools/list")
    tools = {t["name"]: t for t in listed["tools"]}
    assert {"upload_file", "resolve", "tp_resource_unmount", "send_chunk"} <= set(tools)
    assert tools["tp_resource_unmount"]["annotations"]["destructiveHint"] is True
    assert tools["describe"]["annotations"]["readOnlyHint"] is True
    assert all(t["outputSchema"]["additionalProperties"] is False for t in tools.values())

    call = ["--method", "tools/call", "--tool-name"]
    uploaded = inspect(inspector, *stdio_server, *call, "upload_file", "--tool-arg", "path=notes.txt")
    descriptor = uploaded["structuredContent"]
    assert uploaded["isError"] is False and descriptor["size"] == 2400 and descriptor["name"] == "notes.txt"
    back = inspect(inspector, *stdio_server, *call, "resolve", "--tool-arg", f"descriptor={json.dumps(descriptor)}")
    assert back["structuredContent"]["content"] == "notes for another agent\n" * 100
    # an argument that does not fit the schema: our JSON error, code invalid_request, naming the field
    bad = _error(inspect(inspector, *stdio_server, *call, "send_chunk", "--tool-arg", "session_id=s", "index=-1"))
    assert bad["code"] == "invalid_request" and {"index", "data"} <= {e["field"] for e in bad["detail"]["errors"]}


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    with running(settings) as live:
        yield live


def test_inspector_over_http(inspector: Path, http_server: LiveServer) -> None:
    url = f"{http_server.url}/mcp"
    listed = inspect(inspector, url, "--transport", "http", "--method", "tools/list")
    tools = {t["name"]: t for t in listed["tools"]}
    # no TRANSFER_MCP_ROOT over HTTP: only the tools that can work are listed
    assert "upload_file" not in tools and set(tools["resolve"]["inputSchema"]["properties"]) == {"descriptor"}
    call = [url, "--transport", "http", "--method", "tools/call", "--tool-name"]
    stored = inspect(inspector, *call, "upload_content", "--tool-arg", "data=hello over http", "name=h.txt")
    descriptor = stored["structuredContent"]
    assert descriptor["type"] == "inline" and descriptor["size"] == 15
    back = inspect(inspector, *call, "resolve", "--tool-arg", f"descriptor={json.dumps(descriptor)}")
    assert back["structuredContent"] == {"content": "hello over http", "content_encoding": "utf-8", "size": 15}
    missing = _error(inspect(inspector, *call, "describe", "--tool-arg", "file_id=f_" + "0" * 32))
    assert missing["code"] == "not_found" and missing["status"] == 404


def test_inspector_is_pinned_in_the_makefile() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}" in makefile or (
        f"INSPECTOR_VERSION := {INSPECTOR_VERSION}" in makefile
    )
    assert os.path.relpath(PREFIX, REPO) in makefile
