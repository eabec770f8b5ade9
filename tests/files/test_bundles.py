"""Content bundles: create from stored files and inline content, fetch with fresh URLs, resolve into a directory
(every item verified), the CLI — on local storage and on the S3 test server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.uploads.test_api_upload import assert_error
from transfer.client import AsyncTransferClient, load_descriptor
from transfer.core.model.content import ContentBundle

MiB = 1 << 20


@pytest.mark.anyio
async def test_bundle_round_trip(server: LiveServer, tmp_path: Path) -> None:
    report = os.urandom(2 * MiB)
    chart = os.urandom(1000)
    async with AsyncTransferClient(server.url) as client:
        r = await client.upload(report, name="report.bin")
        c = await client.upload(chart, name="chart.png")
        bundle = await client.create_bundle(
            [
                {"role": "main", "file_id": (r.metadata or {})["file_id"], "id": "report"},
                {"role": "thumbnail", "file_id": (c.metadata or {})["file_id"]},
                {
                    "role": "reference",
                    "content": {
                        "type": "inline",
                        "content_type": "text/markdown",
                        "charset": "utf-8",
                        "data": "# notes",
                    },
                },
                {
                    "role": "attachment",
                    "content": {"type": "inline", "content_type": "application/json", "data": {"k": [1, 2]}},
                },
            ],
            name="analysis",
        )
        assert isinstance(bundle, ContentBundle) and bundle.name == "analysis"
        assert bundle.total_size == len(report) + len(chart)
        assert [i.role.value for i in bundle.items] == ["main", "thumbnail", "reference", "attachment"]
        assert bundle.items[0].content.type.value == "url" and bundle.items[1].content.type.value == "inline"
        fetched = load_descriptor((await client.http.get(f"{server.url}/v1/bundles/{bundle.id}")).content)
        assert isinstance(fetched, ContentBundle) and fetched.to_json()["total_size"] == bundle.total_size
        out = tmp_path / "out"
        await client.resolve(fetched, out)
    assert (out / "report.bin").read_bytes() == report
    assert (out / "chart.png").read_bytes() == chart
    assert (out / "item-003.txt").read_text() == "# notes"
    assert json.loads((out / "item-004.json").read_text()) == {"k": [1, 2]}
    assert sorted(p.name for p in out.iterdir()) == ["chart.png", "item-003.txt", "item-004.json", "report.bin"]


@pytest.mark.anyio
async def test_a_bad_item_leaves_nothing_in_the_directory(server: LiveServer, tmp_path: Path) -> None:
    async with AsyncTransferClient(server.url) as client:
        d = await client.upload(os.urandom(2 * MiB), name="a.bin")
        bundle = await client.create_bundle(
            [
                {"role": "main", "file_id": (d.metadata or {})["file_id"]},
                {
                    "role": "reference",
                    "content": {"type": "inline", "content_type": "text/plain", "charset": "utf-8", "data": "x"},
                },
            ]
        )
        doc = bundle.to_json()
        doc["items"][0]["content"]["checksum"] = "sha256:" + "0" * 64
        with pytest.raises(Exception, match="checksum"):
            await client.resolve(ContentBundle.model_validate(doc), tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_bundle_errors(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert_error(http.post("/v1/bundles", json={"items": []}), 400, "invalid_request")
        assert_error(
            http.post("/v1/bundles", json={"items": [{"role": "boss", "file_id": "f_x"}]}), 400, "invalid_request"
        )
        assert_error(
            http.post("/v1/bundles", json={"items": [{"role": "main", "file_id": "f_" + "0" * 32}]}), 404, "not_found"
        )
        assert_error(
            http.post("/v1/bundles", json={"items": [{"role": "main", "content": {"type": "inline"}}]}),
            422,
            "invalid_descriptor",
        )
        assert_error(http.get("/v1/bundles/b_nope"), 404, "not_found")


def test_cli_bundle_and_resolve(server: LiveServer, tmp_path: Path) -> None:
    src = tmp_path / "main.bin"
    src.write_bytes(os.urandom(3 * MiB))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "transfer",
            "bundle",
            "--server",
            server.url,
            "--name",
            "b",
            f"main:{src}",
            "reference:text=see main.bin",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    (tmp_path / "bundle.json").write_text(out.stdout)
    res = subprocess.run(
        [sys.executable, "-m", "transfer", "resolve", str(tmp_path / "bundle.json"), "-o", str(tmp_path / "dir")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "dir" / "main.bin").read_bytes() == src.read_bytes()
    assert (tmp_path / "dir" / "item-002.txt").read_text() == "see main.bin"
