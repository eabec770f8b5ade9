"""One composition root: every host runs the same maintenance (the sweeps of ``Services.maintenance``, stdio MCP
included), and ``close`` stops it; every capability a backend declares has a reader. (Which layer may import which:
``test_layers.py``.)"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.base import Capability
from tests.layout import object_file
from transfer.service.container import Services
from transfer.service.files.documents import write_document
from transfer.service.jobs.journal import job_key
from transfer.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def capability_reads(source: str) -> set[str]:
    """The Capability members a module's code reads (``Capability.X`` as an expression: not a mention in a
    comment, a docstring or a string)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Capability"
    }


def test_every_capability_has_a_reader() -> None:
    """A capability a backend declares but nothing reads is a promise nobody keeps: each member is read by code
    somewhere: the service, storage/base.py's own rules that the service applies (the capabilities replicas need),
    or the conformance suite that holds backends to it. The enum's definition is no read (no ``Capability.X``)."""
    sources = [p.read_text() for p in (REPO / "transfer").rglob("*.py") if "node_modules" not in p.parts]
    sources.append((REPO / "storage" / "base.py").read_text())
    sources.append((REPO / "tests" / "storage_conformance.py").read_text())
    read = set().union(*(capability_reads(text) for text in sources))
    assert [c.name for c in Capability if c.name not in read] == []


def test_a_capability_only_mentioned_is_not_read() -> None:
    mentioned = '''"""Capability.PRESIGN is documented here."""
# Capability.COMPOSE in a comment
x = "Capability.MULTIPART"
if Capability.WRITE_AT_OFFSET in caps:
    pass
'''
    assert capability_reads(mentioned) == {"WRITE_AT_OFFSET"}


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, **extra)


@pytest.mark.anyio
async def test_services_run_their_sweeps_and_close_stops_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    services = Services.build(_settings(tmp_path, session_gc_interval=0.05, job_retention=1))
    caplog.set_level(logging.INFO, "transfer.maintenance")
    await services.start()
    await services.start()  # a second host sharing the set (stdio MCP serving HTTP too): no second set of sweeps
    assert len(services._sweepers) == len(services.maintenance())
    storage = services.files.storage
    old = {"id": "old-job-0001", "kind": "upload", "owner": None, "state": "completed", "updated_at": 0, "events": []}
    await write_document(storage, job_key("old-job-0001", "state"), old)

    def logged() -> bool:
        return any("sweep jobs removed 1" in r.getMessage() for r in caplog.records)

    for _ in range(200):  # the sweep logs after it returns: wait for both the removal and the line
        if await services.journal.load("old-job-0001") is None and logged():
            break
        await asyncio.sleep(0.05)
    assert await services.journal.load("old-job-0001") is None
    assert logged()
    sweepers = list(services._sweepers)
    await services.close()
    assert all(not t.done() for t in sweepers)  # still one host using it
    await services.close()
    assert sweepers and all(t.done() for t in sweepers)


def test_stdio_mcp_runs_the_maintenance(tmp_path: Path) -> None:
    """``transfer mcp`` over stdio, with no HTTP server of its own (a public URL is set), sweeps as ``transfer
    serve`` does: a job record past its retention is gone while the MCP session is open."""
    settings = _settings(tmp_path)

    async def seed() -> None:
        services = Services.build(settings)
        await services.files.start()
        doc = {"id": "stale-job-01", "kind": "upload", "owner": None, "state": "failed", "updated_at": 0, "events": []}
        await write_document(services.files.storage, job_key("stale-job-01", "state"), doc)
        await services.files.close()

    asyncio.run(seed())
    record = object_file(settings.data_dir, job_key("stale-job-01", "state"))
    assert record.exists()
    env = {
        **os.environ,
        "TRANSFER_DATA_DIR": str(settings.data_dir),
        "TRANSFER_SIGNING_KEYS": '{"t": "0123456789abcdef0123"}',
        "TRANSFER_PUBLIC_URL": "http://127.0.0.1:9",
        "TRANSFER_SESSION_GC_INTERVAL": "0.1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "transfer", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while record.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        assert not record.exists()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # end of the MCP session: the process closes its services and exits
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == 0


@pytest.mark.anyio
async def test_websocket_subscription_rules_are_the_tp_services(tmp_path: Path) -> None:
    """What a subscriber may hear is decided by TPService.subscription, with no WebSocket involved: the read scope,
    the shape of ``payload.subscribe``, and per id: a file id the caller cannot see is refused (the others go
    on); a relay channel is heard; every accepted id is followed."""
    from transfer.core.agents.tp import Binding, Envelope, make_envelope
    from transfer.core.auth import Authenticator, new_token, parse_keys, token_hash
    from transfer.errors import InsufficientScope, InvalidEnvelope, NotFound

    reader, uploader = new_token(), new_token()
    keys = {
        "reader": {"sha256": token_hash(reader), "scopes": ["read"]},
        "uploader": {"sha256": token_hash(uploader), "scopes": ["upload"]},
    }
    auth = Authenticator(parse_keys(keys))
    services = Services.build(_settings(tmp_path))
    await services.start()
    try:

        def notify(subscribe: object) -> Envelope:
            return make_envelope(
                "resource_notify", {"subscribe": subscribe}, sender="agent:a", binding=Binding.NATIVE_TP, timestamp=0
            )

        tp = services.tp
        grant = auth.authorizer(f"Bearer {reader}")
        sub = await tp.subscription(notify(["chan-1", "f_" + "0" * 32]), grant)
        assert sub is not None
        assert sub.subscribed == ["chan-1"] and sub.follow == ["chan-1"]
        assert "resource:chan-1" in sub.topics
        assert [(rid, type(exc)) for rid, exc in sub.refused] == [("f_" + "0" * 32, NotFound)]
        with pytest.raises(InvalidEnvelope):
            await tp.subscription(notify("chan-1"), grant)
        with pytest.raises(InsufficientScope):
            await tp.subscription(notify(["chan-1"]), auth.authorizer(f"Bearer {uploader}"))
        plain = make_envelope(
            "resource_notify", {"resource_id": "x"}, sender="a", binding=Binding.NATIVE_TP, timestamp=0
        )
        assert await tp.subscription(plain, grant) is None  # a message, not a subscription
    finally:
        await services.close()


def test_the_doors_share_the_collaborators_of_the_composition_root(tmp_path: Path) -> None:
    """One publisher, one upload lifecycle, one upload engine per process: no door builds its own; every door's
    kind is registered with the one lifecycle, whose publisher is the file service's; tus and sessions share their
    open-upload slots."""
    services = Services.build(_settings(tmp_path))
    doors = (services.sessions, services.tus, services.direct, services.authorizations, services.chunks)
    assert all(door.lifecycle is services.uploads for door in doors)
    assert services.uploads.publisher is services.files.publisher
    assert {kind.name for kind in services.uploads.kinds.values()} == {
        "tus",
        "session",
        "plan",
        "authorization",
        "chunked",
    }
    assert services.sessions.engine is services.tus.engine
    assert services.sessions.kind.slots is services.tus.kind.slots
