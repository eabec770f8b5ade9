"""``python -m benchmarks``: every case, each against its baseline in the same run, into one report.

Writes ``benchmarks/results/latest.json`` (everything; ``summary`` holds the goals table's rows) and the same as
``<date>-<cpu>.json`` (the run kept beside earlier ones: the results' history is those files, not prose), ``latest.md``
(the goals table first — every row the performance issue sets a goal for, with the host's CPU — then each section's
own tables), ``latest.png`` (the goals chart) and ``latest-throughput.png`` (MB/s of every case next to its
baseline). ``--quick`` keeps it to a few minutes; the full profile (``make bench``) takes about 25-35 minutes here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bombs import bombs_table, run_bombs
from benchmarks.chart import write_chart, write_goals_chart
from benchmarks.concurrency import concurrency_table, run_concurrency
from benchmarks.e2e import make_file, memory_profile, memory_table, run, table
from benchmarks.kernels import codecs_table, kernels_table, run_codecs, run_kernels
from benchmarks.network import network_table, run_small_objects, run_wan
from benchmarks.summary import host_cpu, machine, summarize, summary_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB, 3 runs: a few minutes")
    parser.add_argument("--size", type=int, help="file size in MiB (default 1024; --quick: 256)")
    parser.add_argument("--reps", type=int, help="runs per case (default 5; --quick: 3)")
    parser.add_argument("--out", default="benchmarks/results", help="directory for latest.json/.md/.png")
    parser.add_argument(
        "--s3", action="store_true", help="also the S3 cases (starts a Swift s3api server; TRANSFER_SWIFT_VENV)"
    )
    parser.add_argument(
        "--memory-sizes", help="MiB sizes for the peak-RSS runs (default 1024,4096; --quick: 256,1024; 0: skip)"
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated: kernels,codecs,e2e,memory,bombs,wan,small,concurrency,scale,http2,dedup_whole,dedup,"
        "s3_concurrent,dedup_s3,replicas (the last three: with --s3)",
    )
    parser.add_argument(
        "--scale-counts", help="stored-object counts for the scale table (default 0,10000,100000; --quick: 0,2000)"
    )
    args = parser.parse_args(argv)
    size = (args.size or (256 if args.quick else 1024)) << 20
    reps = args.reps or (3 if args.quick else 5)
    skip = set(filter(None, args.skip.split(",")))
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    report: dict[str, Any] = {"date": date, "machine": machine(), "cpu": host_cpu(), "size": size, "reps": reps}
    sections: list[str] = [f"Machine: {report['machine']}; file size {size >> 20} MiB, {reps} runs per case."]
    kernel_size = 32 << 20 if args.quick else 64 << 20
    chart_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="transfer-bench-") as tmp:
        work = Path(tmp)
        if "kernels" not in skip:
            report["kernels"] = run_kernels(kernel_size, 3)
            sections.append(kernels_table(report["kernels"]))
            chart_rows += [r for r in report["kernels"] if r["baseline_MBps"]]
        if "codecs" not in skip:
            report["codecs"] = run_codecs(16 << 20 if args.quick else kernel_size, 2 if args.quick else 3)
            sections.append(codecs_table(report["codecs"]))
        if "e2e" not in skip:
            report["e2e"] = run(size, reps, work)
            sections.append(table(report["e2e"]))
            chart_rows += report["e2e"]["cases"]
        if "memory" not in skip:
            sizes_text = args.memory_sizes or ("256,1024" if args.quick else "1024,4096")
            report["memory"] = memory_profile([int(x) << 20 for x in sizes_text.split(",") if int(x) > 0], work)
        if "bombs" not in skip:  # 1 GiB decoded per bomb whatever the profile: the figure
            report["bombs"] = run_bombs(1 << 30, work)
        if "wan" not in skip:
            src = work / "wan-payload.bin"
            make_file(src, size)
            report["wan"] = run_wan(src, max(3, reps - 2), work)  # three pairs at least: a median and a range
            src.unlink()
            chart_rows.append(report["wan"])
        if "small" not in skip:
            report["small"] = run_small_objects(2000 if args.quick else 5000, 64, work)
        if "concurrency" not in skip:
            report["concurrency"] = run_concurrency(work, quick=args.quick)
        if report.get("wan") or report.get("small"):
            sections.append(network_table(report.get("wan"), report.get("small")))
        if report.get("concurrency"):
            sections.append(concurrency_table(report["concurrency"], report["machine"]))
        if report.get("memory"):
            sections.append(memory_table(report["memory"]))
        if report.get("bombs"):
            sections.append(bombs_table(report["bombs"]))
        if "scale" not in skip:
            from benchmarks.scale import run_scale, scale_table

            counts_text = args.scale_counts or ("0,2000" if args.quick else "0,10000,100000")
            scale_dir = work / "scale"
            scale_dir.mkdir()
            report["scale"] = run_scale([int(c) for c in counts_text.split(",")], reps, 16, scale_dir)
            sections.append(scale_table(report["scale"]))
        if "http2" not in skip:
            from benchmarks.http2 import http2_table, run_http2

            report["http2"] = run_http2(size, reps, work, quick=args.quick)
            sections.append(http2_table(report["http2"]))
        if "dedup_whole" not in skip:
            from benchmarks.dedup_whole import dedup_whole_table, run_dedup_whole

            report["dedup_whole"] = run_dedup_whole(size, reps, work)
            sections.append(dedup_whole_table(report["dedup_whole"]))
        if "dedup" not in skip:
            from benchmarks.dedup import dedup_table, run_dedup

            report["dedup"] = run_dedup(size, 1 if args.quick else 3, work, install_rsync=True)
            sections.append(dedup_table(report["dedup"]))
        if args.s3:
            from benchmarks.s3 import run_s3, s3_table

            report["s3"] = run_s3(size, reps, work, memory_size=2 * size)
            sections.append(s3_table(report["s3"]))
            chart_rows += report["s3"]["cases"]
            if "s3_concurrent" not in skip:
                from benchmarks.s3 import concurrent_memory, concurrent_memory_table
                from devtools.s3server import swift_s3_server

                with swift_s3_server() as endpoint:
                    report["s3_concurrent"] = concurrent_memory(endpoint, work)
                sections.append(concurrent_memory_table(report["s3_concurrent"]))
            if "dedup_s3" not in skip:
                from benchmarks.dedup import dedup_table, run_dedup

                report["dedup_s3"] = run_dedup(min(size, 256 << 20), 1 if args.quick else 3, work, s3=True)
                sections.append(dedup_table(report["dedup_s3"]))
            if "replicas" not in skip:
                from benchmarks.replicas import replicas_table, run_replicas

                report["replicas"] = run_replicas(work)
                sections.append(replicas_table(report["replicas"]))
    report["summary"] = summarize(report)
    profile = f"{'--quick' if args.quick else 'full'} profile: {size >> 20} MiB files, {reps} runs per case."
    sections.insert(0, summary_table(report["summary"], report["cpu"], profile))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(report, indent=2))
    if not args.quick:  # a full run is kept under its date and host; --quick runs are not results to compare
        host = re.sub(r"[^a-z0-9]+", "-", report["cpu"].lower()).strip("-")
        (out / f"{date}-{host}.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = "\n\n".join(sections) + "\n"
    (out / "latest.md").write_text(markdown)
    write_goals_chart(report["summary"], out / "latest.png", f"goals of the performance issue — {report['cpu']}")
    if chart_rows:  # e.g. only the memory sections were run: nothing to chart
        title = f"transfer service vs baselines, same run — {report['machine']}"
        write_chart(chart_rows, out / "latest-throughput.png", title)
    print(markdown)
    return 0
