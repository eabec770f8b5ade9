"""Bundles are bytes their key stores: a bundle's record (inline items and all) is charged to its owner's usage once,
refunded once however many deletes and sweeps race (one server, two replicas on one data directory, the S3 test
server), lives as a file does (``expires_in``, the key's default, refused above the maximum), is gone for readers
from its expiry on and swept through its own expiry index; ``transfer usage repair`` counts it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import Clock, LiveServer
from tests.files.test_ledger import RACERS, life, race, side_ledger, two_replicas, upload
from tests.uploads.test_api_upload import assert_error
from tests.uploads.test_lifecycle import DAY, QUOTA, TOKENS, gc, key, usage
from transfer.cli import main as cli_main

__all__ = ["life", "two_replicas"]  # fixtures used by name

TEXT = "x" * 200_000  # an inline item of 200 kB: what a bundle stores outside any file


def text_item(data: str = TEXT) -> dict[str, Any]:
    return {
        "role": "main",
        "content": {"type": "inline", "content_type": "text/plain", "charset": "utf-8", "data": data},
    }


def make_bundle(http: httpx.Client, items: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return http.post("/v1/bundles", json={"items": items, **extra}, headers=key("alice"))


def test_a_bundle_is_charged_refused_over_the_quota_and_refunded_once(life: LiveServer) -> None:
    with httpx.Client(base_url=life.url, timeout=60) as http:
        before = usage(http, "alice")
        r = make_bundle(http, [text_item()])
        assert r.status_code == 201, r.text
        bundle_id = r.json()["id"]
        after = usage(http, "alice")
        charged = after["bytes_used"] - before["bytes_used"]
        assert len(TEXT) < charged < len(TEXT) + 1000  # the record as stored: the inline item and a little JSON
        assert after["files"] == before["files"]  # a bundle is not a file

        # what is left of the quota takes no bundle larger than it (413 before anything is stored)
        left = QUOTA - after["bytes_used"]
        assert_error(make_bundle(http, [text_item("y" * (left + 1))]), 413, "quota_exceeded")
        assert usage(http, "alice")["bytes_used"] == after["bytes_used"]

        answers = race([("DELETE", f"{life.url}/v1/bundles/{bundle_id}", "admin") for _ in range(RACERS)])
        assert sorted(r.status_code for r in answers) == [204] + [404] * (RACERS - 1)
        assert usage(http, "alice")["bytes_used"] == before["bytes_used"]
        assert_error(http.get(f"/v1/bundles/{bundle_id}", headers=key("alice")), 404, "not_found")


def test_racing_bundle_deletes_through_two_replicas_refund_once(two_replicas: tuple[LiveServer, LiveServer]) -> None:
    one, two = two_replicas
    with httpx.Client(base_url=one.url, timeout=60) as http:
        kept = upload(one.url, 1000)
        for _ in range(5):
            r = make_bundle(http, [text_item(), {"role": "reference", "file_id": kept}])
            assert r.status_code == 201, r.text
            doomed = r.json()["id"]
            urls = [f"{(one, two)[i % 2].url}/v1/bundles/{doomed}" for i in range(RACERS)]
            answers = race([("DELETE", url, "admin") for url in urls])
            assert sorted(r.status_code for r in answers) == [204] + [404] * (RACERS - 1)
            assert usage(http, "alice")["bytes_used"] == 1000  # the file stays; the bundle's bytes went once
        assert http.get(f"/v1/files/{kept}", headers=key("alice")).status_code == 200


def test_a_bundle_expires_and_its_sweep_refunds_it_once(
    two_replicas: tuple[LiveServer, LiveServer], clock: Clock
) -> None:
    one, two = two_replicas
    with httpx.Client(base_url=one.url, timeout=60) as http:
        assert_error(make_bundle(http, [text_item("a")], expires_in=30 * DAY), 400, "expires_in_too_long")
        short = make_bundle(http, [text_item()], expires_in=60)
        default = make_bundle(http, [text_item()])  # the key's default_file_ttl, a day, as for its files
        assert short.status_code == 201 and default.status_code == 201, (short.text, default.text)
        charged = usage(http, "alice")["bytes_used"]
        assert charged > 2 * len(TEXT)

        clock.advance(61)  # gone for readers from its expiry on, swept or not
        assert_error(http.get(f"/v1/bundles/{short.json()['id']}", headers=key("alice")), 410, "bundle_expired")
        assert http.get(f"/v1/bundles/{default.json()['id']}", headers=key("alice")).status_code == 200
        clock.advance(3600)  # its hour has passed: the sweeps of both replicas race for it
        answers = race([("POST", f"{(one, two)[i % 2].url}/v1/admin/gc", "admin") for i in range(4)])
        assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
        assert sum(r.json()["removed"]["expired_bundles"] for r in answers) == 1
        after_short = usage(http, "alice")["bytes_used"]
        assert 0 < after_short < charged and after_short * 2 == pytest.approx(charged, abs=10)
        assert_error(http.get(f"/v1/bundles/{short.json()['id']}", headers=key("admin")), 404, "not_found")

        clock.advance(DAY)
        assert gc(http)["expired_bundles"] == 1
        assert usage(http, "alice")["bytes_used"] == 0
        assert gc(http)["expired_bundles"] == 0  # the index entries went with the bundles


def test_usage_repair_counts_bundles(life: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    with httpx.Client(base_url=life.url, timeout=60) as http:
        upload(life.url, 1000)
        r = make_bundle(http, [text_item()])
        assert r.status_code == 201, r.text
        used = usage(http, "alice")["bytes_used"]
    admin = ["--server", life.url, "--api-key", TOKENS["admin"]]
    assert cli_main(["usage", "repair", "--json", *admin]) == 0  # the bundle is counted: nothing differs
    assert json.loads(capsys.readouterr().out)["keys"]["alice"]["counted"] == {"bytes_used": used, "files": 1}

    side_ledger(life, lambda ledger: ledger.refund("alice", used - 1000, files=0, rid="b_lost"))  # the charge lost
    assert cli_main(["usage", "repair", "--fix", "--json", *admin]) == 0
    report = json.loads(capsys.readouterr().out)["keys"]["alice"]
    assert report["recorded"] == {"bytes_used": 1000, "files": 1}
    assert report["counted"] == {"bytes_used": used, "files": 1} and report["fixed"]
    with httpx.Client(base_url=life.url) as http:
        assert usage(http, "alice")["bytes_used"] == used
