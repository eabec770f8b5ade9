"""Direct plans seen from two service instances on one bucket (the S3 test server): a plan aborted through one is
refused (410) by the other's part URLs at once, although that one had the plan cached; and a plan's slot among its
key's open plans goes when it completes or is aborted, not only when the key next reaches its limit."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Clock, s3_client, serving
from tests.uploads.test_direct import TOKENS, direct_settings, http_for, put_part, sha_hex
from transfer.core.auth import token_hash
from transfer.hosts import create_app

pytestmark = pytest.mark.s3


@pytest.fixture
def two(s3_env: dict[str, str], tmp_path: Path, clock: Clock) -> Iterator[tuple[Any, Any]]:
    keys = {name: {"sha256": token_hash(token), "scopes": ["upload", "read"]} for name, token in TOKENS.items()}
    settings = direct_settings(tmp_path, api_keys=keys, single_replica=True)
    with ExitStack() as stack:
        one = stack.enter_context(serving(create_app(settings, clock=clock), settings))
        other = stack.enter_context(serving(create_app(settings, clock=clock), settings))
        yield one, other


def slot_markers(endpoint: Any, bucket: str) -> set[str]:
    """The plan ids holding a slot in the key's open-plans record (``owners/<key hash>/open/plans``, whatever
    objects the backend keeps for it: the one with the JSON record)."""
    client = s3_client(endpoint)
    objects = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    ids: set[str] = set()
    for o in objects:
        if "owners/" in o["Key"] and "/open/plans" in o["Key"]:
            try:
                ids |= set(json.loads(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())["ids"])
            except (ValueError, KeyError, TypeError):
                continue
    return ids


def test_a_plan_aborted_on_one_replica_gets_410_for_parts_on_the_other(two: tuple[Any, Any]) -> None:
    one, other = two
    parts = {"parts": [{"number": 1, "sha256": "a" * 64}]}
    with http_for(one) as first, http_for(other) as second:
        pid = first.post("/v1/direct", json={"size": 10}).json()["id"]
        assert second.post(f"/v1/direct/{pid}/parts", json=parts).status_code == 200  # cached there now
        assert second.post(f"/v1/direct/{pid}/parts", json=parts).status_code == 200  # served from the cache
        assert first.delete(f"/v1/direct/{pid}").status_code == 204
        for http in (second, first):
            refused = http.post(f"/v1/direct/{pid}/parts", json=parts)
            assert refused.status_code == 410 and refused.json()["error"]["code"] == "gone", refused.text


def test_a_plan_lets_go_of_its_slot_when_it_completes_or_is_aborted(
    two: tuple[Any, Any], s3_endpoint: Any, s3_bucket: str
) -> None:
    one, other = two
    data = os.urandom(1000)
    with http_for(one) as http, http_for(other) as elsewhere:
        done = http.post("/v1/direct", json={"size": len(data), "checksum": sha_hex(data)}).json()["id"]
        dropped = http.post("/v1/direct", json={"size": 10}).json()["id"]
        assert len(slot_markers(s3_endpoint, s3_bucket)) == 2
        assert put_part(http, done, 1, data).status_code == 200
        assert elsewhere.post(f"/v1/direct/{done}/complete", json={}).status_code == 200
        assert len(slot_markers(s3_endpoint, s3_bucket)) == 1
        assert elsewhere.delete(f"/v1/direct/{dropped}").status_code == 204
        assert slot_markers(s3_endpoint, s3_bucket) == set()
