"""schemathesis against the service's own OpenAPI schema, authenticated with an admin key: thousands of generated
requests, never a 5xx. Two operations wait by design and are tested on their own: the SSE stream of a job that
has not started yet waits for it (job_wait_ttl, a minute), and so does the TP long poll."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import running
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings


@pytest.mark.slow
def test_no_server_errors_for_generated_requests(tmp_path: Path) -> None:
    key = new_token()
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys={"fuzz": {"sha256": token_hash(key), "scopes": ["admin"]}},
    )
    cli = Path(sys.executable).parent / "schemathesis"
    with running(settings) as live_server:
        out = _run(cli, live_server.url, key, tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Server error" not in out.stdout
    # it really exercised the API, authenticated (an unauthenticated run would only see 401s)
    summary = out.stdout[out.stdout.rfind("API Operations") :]
    assert "Tested" in out.stdout or "tested" in summary, out.stdout[-2000:]


def _run(cli: Path, url: str, key: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(cli),
            "run",
            f"{url}/openapi.json",
            "--header",
            f"Authorization: Bearer {key}",
            "--exclude-path-regex",
            "(/events$|^/tp/v1/messages$)",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "25",
            "--seed",
            "20261130",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
