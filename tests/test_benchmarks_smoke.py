"""The benchmark machinery on a tiny file, so it cannot rot (figures are not asserted: speed is not a test)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.e2e import run, table


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    report = run(2 << 20, reps=1, workdir=tmp_path, use_baselines=True)
    names = [row["case"] for row in report["cases"]]
    assert any(n.startswith("upload") for n in names) and any(n.startswith("resolve") for n in names)
    assert all(row["ours_MBps"] > 0 for row in report["cases"])
    assert report["server_peak_rss_bytes"] > 0
    assert "| case |" in table(report)


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_memory_profile_runs(tmp_path: Path) -> None:
    from benchmarks.e2e import memory_profile

    rows = memory_profile([1 << 20], tmp_path)
    assert rows[0]["size"] == 1 << 20 and rows[0]["peak_rss_after_download"] >= rows[0]["peak_rss_after_upload"] > 0


@pytest.mark.s3
@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_s3_benchmark_runs(tmp_path: Path, s3_endpoint: object) -> None:
    from benchmarks.s3 import run_s3, s3_table

    report = run_s3(6 << 20, 1, tmp_path, endpoint=s3_endpoint, memory_size=6 << 20)
    assert [row["runs"] for row in report["cases"]] == [1, 1]
    assert report["memory"]["stored_sha256_matches"] is True
    assert "boto3 upload_file" in s3_table(report)
