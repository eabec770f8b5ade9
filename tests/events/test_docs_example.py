"""The example hook and receiver of docs/HOOKS.md, run as the page shows it, against a real server: it refuses an
executable, tags what it allows, and verifies and prints the event of the file it let through."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.e2e import free_port
from tests.conftest import running
from tests.events.conftest import event_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "HOOKS.md"


def example_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    [code] = [b for b in blocks if b.startswith("# hooks_example.py")]
    return code


def wait_listening(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the example did not start"
            time.sleep(0.05)


def test_the_documented_example_hook_and_receiver_work(tmp_path: Path) -> None:
    script = tmp_path / "hooks_example.py"
    script.write_text(example_code())
    port = free_port()
    settings = event_settings(tmp_path, hook_url=f"http://127.0.0.1:{port}/pre-upload")
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        made = http.post("/v1/admin/subscriptions", json={"url": f"http://127.0.0.1:{port}/webhooks"})
        assert made.status_code == 201, made.text
        env = {**os.environ, "PORT": str(port), "WEBHOOK_SECRET": made.json()["secret"]}
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
        try:
            wait_listening(port, proc)
            refused = http.post("/v1/files", content=b"MZ", params={"name": "setup.exe"})
            assert refused.status_code == 403 and refused.json()["error"]["detail"]["reason"] == "no executables here"
            allowed = http.post("/v1/files", content=b"fine", params={"name": "notes.txt"})
            assert allowed.status_code == 201, allowed.text
            file_id = allowed.json()["metadata"]["file_id"]
            assert allowed.json()["metadata"]["project"] == "team-open"
            assert proc.stdout is not None
            line = proc.stdout.readline().split()
            assert line[:2] == ["file.published", file_id] and line[2].startswith("evt_")
        finally:
            proc.terminate()
            proc.communicate(timeout=10)
