"""The benchmark machinery on a tiny file, so it cannot rot (figures are not asserted: speed is not a test)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.e2e import run, table


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    report = run(2 << 20, reps=1, workdir=tmp_path, use_baselines=True)
    names = [row["case"] for row in report["cases"]]
    assert any(n.startswith("upload") for n in names) and any(n.startswith("resolve") for n in names)
    assert all(row["ours_MBps"] > 0 for row in report["cases"])
    assert report["server_peak_rss_bytes"] > 0
    assert "| case |" in table(report)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_memory_profile_runs(tmp_path: Path) -> None:
    from benchmarks.e2e import memory_profile

    rows = memory_profile([1 << 20], tmp_path)
    assert rows[0]["size"] == 1 << 20 and rows[0]["peak_rss_after_download"] >= rows[0]["peak_rss_after_upload"] > 0
    assert rows[0]["peak_rss_after_import"] >= rows[0]["peak_rss_after_download"]


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_s3_benchmark_runs(tmp_path: Path, s3_endpoint: object) -> None:
    from benchmarks.s3 import run_s3, s3_table

    report = run_s3(6 << 20, 1, tmp_path, endpoint=s3_endpoint, memory_size=6 << 20)
    assert [row["runs"] for row in report["cases"]] == [1, 1, 1, 1]
    assert report["memory"]["stored_sha256_matches"] is True
    assert "boto3 upload_file" in s3_table(report)
    assert "transfer upload --direct" in s3_table(report)


def test_kernels_and_chart(tmp_path: Path) -> None:
    from benchmarks.chart import write_chart
    from benchmarks.kernels import kernels_table, run_kernels

    rows = run_kernels(1 << 20, 1)
    assert {r["case"].split(",")[0] for r in rows} >= {"SHA-256 (hashlib)", "gzip encode", "zstd 1 encode"}
    assert "| kernel (one core) |" in kernels_table(rows)
    write_chart([r for r in rows if r["baseline_MBps"]], tmp_path / "chart.png", "smoke")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_network_cases_run(tmp_path: Path) -> None:
    from benchmarks.e2e import make_file
    from benchmarks.network import network_table, run_small_objects, run_wan

    src = tmp_path / "p.bin"
    make_file(src, 2 << 20)
    wan = run_wan(src, 1, tmp_path, connections=2)
    small = run_small_objects(50, 8, tmp_path)
    assert wan["runs"] == 1 and small["service"]["rps"] > 0 and small["baseline"]["rps"] > 0
    assert small["durable_baseline"]["rps"] > 0
    assert "Small objects" in network_table(wan, small)


def test_bomb_memory_benchmark_runs(tmp_path: Path) -> None:
    from benchmarks.bombs import bombs_table, run_bombs

    rows = run_bombs(32 << 20, tmp_path)  # 32 MiB: past the ratio guard's 16 MiB grace, so pure zeros are refused
    assert [r["case"] for r in rows] == ["gzip x3", "zstd x1", "gzip->zstd x1", "zstd pure zeros x1"]
    assert [r["refused"] for r in rows] == [None, None, None, "decoded_size_limit"]
    assert all(r["peak_rss"] >= r["idle_rss"] > 0 for r in rows)
    assert "| bomb upload |" in bombs_table(rows)


@pytest.mark.slow
def test_scale_benchmark_runs(tmp_path: Path) -> None:
    from benchmarks.scale import CASES, run_scale, scale_table

    report = run_scale([0, 20], 1, 4, tmp_path)
    assert [row["stored"] for row in report["rows"]] == [0, 20]
    assert report["rows"][1]["paged"] >= 20  # every stored file paged through, plus the cases' own uploads
    assert all(report["rows"][1][name] > 0 for name in CASES)
    assert "| stored objects |" in scale_table(report)


def test_concurrency_rows_run(tmp_path: Path) -> None:
    from benchmarks.concurrency import concurrency_table, run_concurrency

    report = run_concurrency(tmp_path, levels=(1, 2), size=1 << 20)
    assert [r["clients"] for r in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["download"]["MBps"] > 0 and row["upload"]["MBps"] > 0
        assert row["download"]["cpu_s_per_GiB"] >= 0 and row["upload"]["cpu_s_per_GiB"] > 0
    assert "| 2 |" in concurrency_table(report, "test machine")
