"""schemathesis against the service's own OpenAPI schema: thousands of generated requests, never a 5xx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import LiveServer


def test_no_server_errors_for_generated_requests(live_server: LiveServer, tmp_path: Path) -> None:
    cli = Path(sys.executable).parent / "schemathesis"
    out = subprocess.run(
        [
            str(cli),
            "run",
            f"{live_server.url}/openapi.json",
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
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Server error" not in out.stdout
