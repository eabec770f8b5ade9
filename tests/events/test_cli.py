"""``transfer subscriptions …`` and ``transfer events …`` against a running service, as an operator types them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import running
from tests.events.conftest import event_settings
from tests.events.receiver import Receiver
from transfer.cli import main


def test_an_operator_manages_subscriptions_and_dead_letters_from_the_cli(
    tmp_path: Path, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    with running(event_settings(tmp_path, events_max_age=0.5)) as live:
        server = ["--server", live.url]
        assert main(["subscriptions", "add", receiver.url, "--type", "file.published", "--json", *server]) == 0
        made = json.loads(capsys.readouterr().out)
        assert made["types"] == ["file.published"] and made["secret"].startswith("whsec_")
        receiver.secrets.append(made["secret"])
        assert main(["subscriptions", "ls", *server]) == 0
        assert made["id"] in capsys.readouterr().out
        assert main(["subscriptions", "rotate", made["id"], "--grace", "60", "--json", *server]) == 0
        rotated = json.loads(capsys.readouterr().out)
        receiver.secrets.append(rotated["secret"])
        assert len(rotated["secrets"]) == 2

        receiver.status = 500
        with httpx.Client(base_url=live.url, timeout=30) as http:
            file_id = http.post("/v1/files", content=b"x", params={"name": "x"}).json()["metadata"]["file_id"]
        deadline = time.monotonic() + 30
        while True:
            assert main(["events", "dead", "--json", *server]) == 0
            dead = json.loads(capsys.readouterr().out)["events"]
            if dead:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert main(["events", "dead", *server]) == 0
        line = capsys.readouterr().out
        assert file_id in line and "HTTP 500" in line
        receiver.status = 204
        assert main(["events", "retry", dead[0]["id"], *server]) == 0
        receiver.wait(lambda r: len(r.deliveries) == 1)
        assert main(["events", "status", *server]) == 0
        assert "waiting" in capsys.readouterr().out
        assert main(["subscriptions", "rm", made["id"], *server]) == 0
        assert main(["subscriptions", "rm", made["id"], *server]) == 1
        assert "not_found" in capsys.readouterr().err
