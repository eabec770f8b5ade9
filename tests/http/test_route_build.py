"""The routes of every included router are built when the application is built, not on a first request: FastAPI
builds an included router's routes lazily, and two applications in one process that build theirs at once, on two
threads, race in pydantic and answer 500 (see transfer.api.app.build_routes)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import routing

from tests.conftest import serving
from transfer.hosts import create_app
from transfer.settings import Settings

# one route of each kind of router the application includes: REST resources, the bindings, the web page
FIRST_REQUESTS: list[tuple[str, str]] = [
    ("GET", "/healthz"),
    ("GET", "/v1/files"),
    ("GET", "/v1/usage"),
    ("GET", "/v1/chunked"),
    ("OPTIONS", "/tus/files"),
    ("OPTIONS", "/v1/uploads"),
    ("GET", "/v1/jobs/nosuchjob1"),
    ("GET", "/v1/bundles/nosuchbundle"),
    ("GET", "/v1/sessions/nosuchsession"),
    ("GET", "/v1/direct/nosuchplan"),
    ("GET", "/tp/v1/messages"),
    ("GET", "/.well-known/agent-card.json"),
    ("GET", "/"),
]


def settings_in(path: Path) -> Settings:
    return Settings(data_dir=path, signing_keys={"test": "0123456789abcdef0123456789abcdef"})


def test_two_applications_answer_their_first_requests_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = [settings_in(tmp_path / name) for name in ("one", "two")]
    apps = [create_app(s) for s in settings]  # built one after the other, as replicas in one process are

    # the race itself is rare; what makes it possible is a route built by a request, which this turns into a 500
    def built_late(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a route was built on a request, not with the application")

    monkeypatch.setattr(routing._EffectiveRouteContext, "from_api_route", built_late)
    with serving(apps[0], settings[0]) as one, serving(apps[1], settings[1]) as two:
        start = threading.Barrier(2 * len(FIRST_REQUESTS))
        answers: list[tuple[str, str, int]] = []

        def first(url: str, method: str, path: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as client:
                start.wait()
                answers.append((method, path, client.request(method, path).status_code))

        threads = [
            threading.Thread(target=first, args=(live.url, method, path))
            for method, path in FIRST_REQUESTS
            for live in (one, two)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(answers) == 2 * len(FIRST_REQUESTS)
    assert [a for a in answers if a[2] >= 500] == []  # each route answered as itself, on both
