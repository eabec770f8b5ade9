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

    rows = run_kernels(1 << 20, 2)
    assert {r["case"].split(",")[0] for r in rows} >= {"SHA-256 (hashlib)", "gzip encode", "zstd 1 encode"}
    by_id = {r["id"]: r for r in rows}
    for row_id in ("base64_encode", "gzip_decode_random", "deflate_decode_random"):  # the goals table reads these
        assert by_id[row_id]["runs"] == 2
        assert by_id[row_id]["ratio_min"] <= by_id[row_id]["ratio_median"] <= by_id[row_id]["ratio_max"]
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

    # 16 MiB each way per level: the server's CPU is read in clock ticks (10 ms), and 2 MiB of uploads took less
    # than one now and then (0.0 s/GiB: the test failed one run in a few)
    report = run_concurrency(tmp_path, levels=(1, 2), size=8 << 20)
    assert [r["clients"] for r in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["download"]["MBps"] > 0 and row["upload"]["MBps"] > 0
        assert row["download"]["cpu_s_per_GiB"] >= 0 and row["upload"]["cpu_s_per_GiB"] > 0
    assert "| 2 |" in concurrency_table(report, "test machine")


def test_codec_comparison_decodes_the_same_streams() -> None:
    from benchmarks.kernels import INFLATERS, codecs_table, run_codecs

    rows = run_codecs(1 << 20, 1)
    assert {(r["kind"], r["format"], r["direction"], r["stream"]) for r in rows} >= {
        ("random", "gzip", "decode", "zlib 6"),
        ("random", "deflate", "decode", "isal 1"),
        ("text", "gzip", "encode", ""),
    }
    decode = next(r for r in rows if r["direction"] == "decode")
    assert set(decode["MBps"]) == {*INFLATERS, "zlib one call"} and all(v > 0 for v in decode["MBps"].values())
    assert "zlib-ng" in INFLATERS  # a dev dependency: the comparison the service's choice of isal rests on
    assert "| random | gzip | decode (zlib 6) |" in codecs_table(rows)


def _pair(case: str, median: float, low: float, high: float, runs: int = 3) -> dict[str, object]:
    return {
        "case": case,
        "ours_MBps": 100.0,
        "baseline": "b",
        "baseline_MBps": 100.0 / median,
        "ratio_median": median,
        "ratio_min": low,
        "ratio_max": high,
        "runs": runs,
    }


def test_goals_table_reads_every_row_and_says_not_run() -> None:
    from benchmarks.summary import GOALS, ROWS, summarize, summary_table

    assert list(ROWS) == list(GOALS)  # every goal has a source, every source a goal
    report = {
        "e2e": {
            "cases": [
                _pair("download full body", 1.2, 1.1, 1.3),
                _pair("download one range (half)", 0.9, 0.8, 1.05),
                _pair("upload (curl POST, SHA-256, fsync, new file)", 0.85, 0.7, 0.9),
            ]
        },
        "kernels": [{"id": "gzip_decode_random", **_pair("gzip decode, random", 2.0, 1.9, 2.1)}],
        "small": {
            "requests": 10,
            "concurrency": 4,
            "service": {"rps": 300.0},
            "baseline": {"rps": 3000.0},
            "ratio": 0.1,
        },
        "concurrency": {
            "size": 16 << 20,
            "rows": [
                {
                    "clients": n,
                    "transfers": max(n, 8),
                    "size": 16 << 20,
                    "download": {"MBps": 2000, "p50_s": 0.1, "p99_s": 0.2, "cpu_s_per_GiB": 0.1 * n},
                    "upload": {"MBps": 300, "p50_s": 0.5, "p99_s": 0.9, "cpu_s_per_GiB": 2.0},
                }
                for n in (1, 8)
            ],
        },
        "memory": [
            {"size": 1 << 30, "peak_rss_after_upload": 80_000_000, "peak_rss_after_download": 90_000_000},
            {"size": 4 << 30, "peak_rss_after_upload": 85_000_000, "peak_rss_after_download": 95_000_000},
        ],
        "scale": {
            "rows": [
                {"stored": 0, "list": 2.0, "session": 10.0},
                {"stored": 10_000, "list": 8.0, "session": 11.0},
                {"stored": 100_000, "list": 10.0, "session": 13.0},
            ]
        },
        "dedup": {
            "size": 1000,
            "full_upload_s": 2.0,
            "cases": {
                "unchanged": {"sent_bytes": 0, "manifest_bytes": 10, "seconds": 1.0, "vs_full": 0.5, "runs": 3}
                | {"server_cpu_s_per_GiB": 2.0, "changed_bytes": 0, "file_bytes": 1000, "budget_bytes": 30},
                "1% in 20 places": {"sent_bytes": 30, "manifest_bytes": 10, "changed_bytes": 10, "seconds": 1.0}
                | {"file_bytes": 1000, "budget_bytes": 40, "rsync": {"sent_bytes": 12, "seconds": 0.5}},
                "16 MiB appended": {"sent_bytes": 500, "manifest_bytes": 10, "changed_bytes": 100, "seconds": 1.0}
                | {"file_bytes": 1100, "budget_bytes": 133},
            },
            "resolve": {"cached_s": 0.5, "plain_s": 0.25, "fetched_bytes": 5, "cached_bytes": 995, "vs_plain": 2.0},
        },
    }
    rows = {r["id"]: r for r in summarize(report)}
    assert list(rows) == list(GOALS)
    assert rows["download_full"]["met"] is True and rows["download_full"]["goal"] == "≥ 1.0×"
    assert rows["download_range"]["met"] is False  # the median decides, not the best pair
    assert rows["upload_dd"]["met"] is True and rows["upload_dd"]["low"] == 0.7
    assert rows["gzip_decode_random"]["value"] == 2.0
    assert rows["small_sink"]["met"] is False
    assert rows["cpu_download"]["value"] == 0.1 and rows["cpu_download"]["high"] == 0.8
    assert rows["cpu_upload"]["met"] is None  # a figure the issue asks for without a threshold
    assert rows["memory_peak"]["value"] == 95 and rows["memory_peak"]["met"] is True
    assert rows["memory_growth"]["value"] == round(95 / 90, 2) and rows["memory_growth"]["met"] is True
    # listings against what is stored: the largest count vs 0, and vs the smallest count whose page is full
    assert rows["list_scale"]["value"] == 5.0 and rows["list_scale"]["met"] is False
    assert rows["list_scale_full_page"]["value"] == 1.25 and rows["list_scale_full_page"]["met"] is True
    assert rows["session_scale"]["value"] == 1.3 and rows["session_scale"]["met"] is False
    # deduplication: bytes sent (chunks + manifest) over 3 % of the file + the changes, at most 1
    assert rows["dedup_changed"]["value"] == 1.0 and rows["dedup_changed"]["met"] is True
    assert "rsync daemon 12 bytes" in rows["dedup_changed"]["detail"]
    assert rows["dedup_appended"]["value"] == 510 / 133 and rows["dedup_appended"]["met"] is False
    assert rows["dedup_unchanged"]["value"] == 0.5 and rows["dedup_unchanged"]["met"] is True
    assert rows["dedup_resolve"]["value"] == 2.0 and rows["dedup_resolve"]["met"] is None
    # sections that did not run, and rows whose section ran without them: "not run", never a number
    for row_id in (
        "s3_upload",
        "s3_download",
        "memory_s3",
        "chunked_wan",
        "resolve_four",
        "small_durable",
        "clients_256",
    ):
        assert rows[row_id]["value"] is None and rows[row_id]["met"] is None
    table = summary_table(list(rows.values()), "Test CPU, 2 vCPU")
    assert "## Goals — host CPU: Test CPU, 2 vCPU" in table
    assert "| download full body vs nginx sendfile | 1.20× (1.10-1.30) | ≥ 1.0× | yes |" in table
    assert "| S3 upload through the service vs boto3 upload_file | not run | ≥ 1.0× | — |" in table
    assert "**no**" in table
    assert len([line for line in table.splitlines() if line.startswith("| ")]) == len(GOALS) + 1


def test_goals_chart_and_host_cpu(tmp_path: Path) -> None:
    from benchmarks.chart import write_goals_chart
    from benchmarks.summary import host_cpu, summarize

    write_goals_chart(summarize({}), tmp_path / "goals.png", "nothing ran")  # every row "not run"
    assert (tmp_path / "goals.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cpu = host_cpu()
    assert cpu.split(", ")[-1].split()[0].isdigit() and cpu.split(", ")[-1].split()[1] in ("vCPU", "CPU")
