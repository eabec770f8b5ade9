"""The goals table: every row the performance issue sets a goal for, read from one benchmark report.

:data:`GOALS` is the one place the goals live (row id -> goal); :data:`ROWS` says where in the report each row's
figure comes from. A row whose section did not run (``--skip``, no ``--s3``, a baseline tool missing) shows
"not run", never a number. Figures are same-run ratios over alternating pairs, printed as median (min-max), or the
figure itself where the issue asks for one without a ratio (server CPU seconds per GiB, concurrent clients).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class Goal:
    """A row's goal: met when the figure is at least ``target`` (``at_most``: at most), in ``unit``. ``target``
    None: the issue asks for the figure only, nothing is met or missed."""

    label: str
    target: float | None = None
    unit: str = "×"
    at_most: bool = False

    @property
    def text(self) -> str:
        if self.target is None:
            return "figure only"
        sign = "≤" if self.at_most else "≥"
        number = f"{self.target:g}" if self.unit != "×" else f"{self.target:.1f}"
        return f"{sign} {number}{self.unit if self.unit == '×' else ' ' + self.unit}"

    def met(self, value: float) -> bool | None:
        if self.target is None:
            return None
        return value <= self.target if self.at_most else value >= self.target


# The goals of the performance issue, in its order: the one table of row id -> goal.
GOALS: dict[str, Goal] = {
    "download_full": Goal("download full body vs nginx sendfile", 1.0),
    "download_range": Goal("download half range vs nginx sendfile", 1.0),
    "upload_dd": Goal("upload (SHA-256, fsync, new file) vs dd conv=fsync", 0.8),
    "upload_sink": Goal("upload into a discarding sink vs one-core SHA-256", 0.6),
    "resolve_one": Goal("resolve, one stream, vs curl | tee | sha256sum", 1.0),
    "resolve_four": Goal("resolve, 4 connections, vs aria2c -x4 + sha256sum", 1.0),
    "chunked_wan": Goal("--chunked x4 over 50 MB/s, 20 ms vs one stream", 3.0),
    "small_sink": Goal("durable 4 KiB x64 concurrent vs minimal FastAPI sink", 0.3),
    "small_durable": Goal("durable 4 KiB x64 concurrent vs durable FastAPI baseline", 2.0),
    "s3_upload": Goal("S3 upload through the service vs boto3 upload_file", 1.0),
    "s3_download": Goal("S3 download through the service vs boto3 download_file", 1.0),
    "base64_encode": Goal("base64 encode 1 MiB vs stdlib", 5.0),
    "gzip_decode_random": Goal("gzip decode, incompressible, vs zlib", 1.0),
    "deflate_decode_random": Goal("deflate decode, incompressible, vs zlib", 1.0),
    "cpu_upload": Goal("server CPU per GiB uploaded", unit="s/GiB"),
    "cpu_download": Goal("server CPU per GiB downloaded", unit="s/GiB"),
    "clients_1": Goal("1 client: MB/s and p99, down / up", unit="MB/s"),
    "clients_8": Goal("8 concurrent clients: MB/s and p99, down / up", unit="MB/s"),
    "clients_64": Goal("64 concurrent clients: MB/s and p99, down / up", unit="MB/s"),
    "clients_256": Goal("256 concurrent clients: MB/s and p99, down / up", unit="MB/s"),
    "memory_peak": Goal("server peak RSS, largest file", 200, "MB", at_most=True),
    "memory_growth": Goal("server peak RSS, largest file / smallest file", 1.1, at_most=True),
    "memory_s3": Goal("server peak RSS, upload into S3", 200, "MB", at_most=True),
    "memory_s3_concurrent": Goal("server peak RSS, 1 / 8 / 32 concurrent uploads into S3", 200, "MB", at_most=True),
    "replicas_small": Goal("4 KiB uploads/s through 1 / 2 / 3 replicas on Ceph", unit="uploads/s"),
    "replicas_large": Goal("64 MiB uploads, MB/s through 1 / 2 / 3 replicas on Ceph", unit="MB/s"),
    "list_scale": Goal("first page of GET /v1/files, most stored vs 0 stored", 1.5, at_most=True),
    "list_scale_full_page": Goal("the same, vs the smallest count that fills a page (100 files)", 1.5, at_most=True),
    "session_scale": Goal("session open + chunk + status, most stored vs 0 stored", 1.2, at_most=True),
    # the deduplication issue: bytes sent by a new version, over its budget of 3 % of the file + the changed bytes
    "dedup_changed": Goal("chunked upload, 1 % changed in 20 places: bytes sent / (3 % + changes)", 1.0, at_most=True),
    "dedup_appended": Goal("chunked upload, 16 MiB appended: bytes sent / (3 % + changes)", 1.0, at_most=True),
    "dedup_unchanged": Goal("chunked upload of the same file again: time vs a full upload", 1.0, at_most=True),
    "dedup_resolve": Goal("resolve of the changed file, old chunks cached: time vs a plain resolve"),
}


@dataclass(frozen=True)
class Figure:
    """One row's measurement: ``value`` (median) with its ``low``-``high`` range over ``runs`` pairs, and the
    absolute figures behind it in ``detail``."""

    value: float
    low: float | None = None
    high: float | None = None
    runs: int = 1
    detail: str = ""
    text: str | None = None  # printed instead of value (rows with more than one figure)


def _ratio_row(row: dict[str, Any] | None, what: str = "MB/s") -> Figure | None:
    """A same-run pair row (e2e, wan, s3, kernels): ratio median (min-max) over alternating pairs."""
    if not row or row.get("ratio_median") is None:
        return None
    detail = f"{row['ours_MBps']:,.0f} vs {row['baseline_MBps']:,.0f} {what}"
    return Figure(row["ratio_median"], row.get("ratio_min"), row.get("ratio_max"), row.get("runs", 1), detail)


def _case(section: str, *prefixes: str) -> Callable[[dict[str, Any]], Figure | None]:
    """The row of ``report[section]['cases']`` whose name starts with one of ``prefixes``."""

    def find(report: dict[str, Any]) -> Figure | None:
        cases = (report.get(section) or {}).get("cases") or []
        for row in cases:
            if any(row["case"].startswith(p) for p in prefixes):
                return _ratio_row(row)
        return None

    return find


def _kernel(row_id: str) -> Callable[[dict[str, Any]], Figure | None]:
    def find(report: dict[str, Any]) -> Figure | None:
        row = next((r for r in report.get("kernels") or [] if r.get("id") == row_id), None)
        return _ratio_row(row)

    return find


def _wan(report: dict[str, Any]) -> Figure | None:
    return _ratio_row(report.get("wan"))


def _small(key: str, baseline: str) -> Callable[[dict[str, Any]], Figure | None]:
    def find(report: dict[str, Any]) -> Figure | None:
        small = report.get("small")
        if not small or small.get(key) is None or baseline not in small:
            return None
        detail = f"{small['service']['rps']:,.0f} vs {small[baseline]['rps']:,.0f} req/s"
        return Figure(small[key], small.get(f"{key}_min"), small.get(f"{key}_max"), small.get("runs", 1), detail)

    return find


def _cpu(mode: str) -> Callable[[dict[str, Any]], Figure | None]:
    """Server CPU seconds per GiB with one client at a time, and its range over every client count."""

    def find(report: dict[str, Any]) -> Figure | None:
        rows = (report.get("concurrency") or {}).get("rows") or []
        if not rows:
            return None
        values = [r[mode]["cpu_s_per_GiB"] for r in rows]
        first = rows[0]
        detail = f"{first['clients']} client; range over {', '.join(str(r['clients']) for r in rows)} clients"
        return Figure(first[mode]["cpu_s_per_GiB"], min(values), max(values), len(rows), detail)

    return find


def _clients(level: int) -> Callable[[dict[str, Any]], Figure | None]:
    def find(report: dict[str, Any]) -> Figure | None:
        rows = (report.get("concurrency") or {}).get("rows") or []
        row = next((r for r in rows if r["clients"] == level), None)
        if row is None:
            return None
        d, u = row["download"], row["upload"]
        text = f"{d['MBps']:,} MB/s p99 {d['p99_s']:.2f} s / {u['MBps']:,} MB/s p99 {u['p99_s']:.2f} s"
        detail = f"{row['transfers']} transfers of {row['size'] // MiB} MiB each way"
        if row.get("reduced"):
            detail += f" ({row['reduced']})"
        return Figure(d["MBps"], runs=1, detail=detail, text=text)

    return find


def _memory_sizes(report: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]] | None:
    rows = sorted(report.get("memory") or [], key=lambda m: m["size"])
    if len(rows) < 2:
        return None
    return rows[0], rows[-1]


def _peak(m: dict[str, int]) -> int:
    return max(v for k, v in m.items() if k.startswith("peak_rss"))


def _memory_peak(report: dict[str, Any]) -> Figure | None:
    rows = sorted(report.get("memory") or [], key=lambda m: m["size"])
    if not rows:
        return None
    big = rows[-1]
    detail = f"{big['size'] // MiB} MiB file: max of after upload, download, import"
    return Figure(round(_peak(big) / 1e6), runs=1, detail=detail)


def _memory_growth(report: dict[str, Any]) -> Figure | None:
    pair = _memory_sizes(report)
    if pair is None:
        return None
    small, big = pair
    detail = (
        f"{_peak(big) / 1e6:.0f} MB at {big['size'] // MiB} MiB vs {_peak(small) / 1e6:.0f} MB at "
        f"{small['size'] // MiB} MiB"
    )
    return Figure(round(_peak(big) / _peak(small), 2), runs=1, detail=detail)


def _memory_s3(report: dict[str, Any]) -> Figure | None:
    m = (report.get("s3") or {}).get("memory")
    if not m:
        return None
    detail = f"{m['size'] // MiB} MiB file through the service into S3"
    return Figure(round(m["peak_rss_after_upload"] / 1e6), runs=1, detail=detail)


def _memory_s3_concurrent(report: dict[str, Any]) -> Figure | None:
    rows = [r for r in (report.get("s3_concurrent") or {}).get("rows", []) if r["budget"] == "default"]
    if not rows:
        return None
    text = " / ".join(f"{r['peak_rss'] / 1e6:.0f}" for r in rows) + " MB"
    detail = f"{' / '.join(str(r['clients']) for r in rows)} clients × {rows[0]['size'] // MiB} MiB each"
    return Figure(round(max(r["peak_rss"] for r in rows) / 1e6), runs=1, detail=detail, text=text)


def _replicas(key: str, unit: str) -> Callable[[dict[str, Any]], Figure | None]:
    def find(report: dict[str, Any]) -> Figure | None:
        rows = (report.get("replicas") or {}).get("rows") or []
        if not rows:
            return None
        text = " / ".join(f"{r[key]:,.0f}" for r in rows) + f" {unit}"
        loads = " / ".join(f"{r['load_average']:.1f}" for r in rows)
        detail = f"HAProxy, one Ceph bucket; load average {loads}"
        return Figure(round(rows[-1][key]), runs=1, detail=detail, text=text)

    return find


def _scale(case: str, *, full_page: bool = False) -> Callable[[dict[str, Any]], Figure | None]:
    """The largest stored count's median against the 0-stored one's (``full_page``: against the smallest count
    whose first page is full, so that both pages list as many files)."""

    def find(report: dict[str, Any]) -> Figure | None:
        rows = (report.get("scale") or {}).get("rows") or []
        if len(rows) < 2:
            return None
        last = rows[-1]
        bases = [r for r in rows[:-1] if r["stored"] >= 100] if full_page else [r for r in rows if r["stored"] == 0]
        if not bases:
            return None
        base = bases[0]
        detail = f"{last[case]:.1f} vs {base[case]:.1f} ms at {last['stored']:,} vs {base['stored']:,} stored"
        return Figure(last[case] / base[case], runs=1, detail=detail)

    return find


def _dedup_budget(case: str) -> Callable[[dict[str, Any]], Figure | None]:
    """Bytes a new version sent (chunks and manifest) over its budget, 3 % of the file plus the bytes changed."""

    def find(report: dict[str, Any]) -> Figure | None:
        dedup = report.get("dedup") or {}
        row = (dedup.get("cases") or {}).get(case)
        if not row:
            return None
        size, budget = row["file_bytes"], row["budget_bytes"]
        sent = row["sent_bytes"] + row["manifest_bytes"]
        detail = f"{sent:,} bytes sent of {size:,} ({sent / size:.2%}), {row['seconds']:.2f} s"
        rsync = row.get("rsync")
        if rsync:
            detail += f"; rsync daemon {rsync['sent_bytes']:,} bytes, {rsync['seconds']:.2f} s"
        return Figure(sent / budget, runs=1, detail=detail)

    return find


def _dedup_unchanged(report: dict[str, Any]) -> Figure | None:
    dedup = report.get("dedup") or {}
    row = (dedup.get("cases") or {}).get("unchanged")
    if not row:
        return None
    detail = (
        f"{row['seconds']:.2f} vs {dedup['full_upload_s']:.2f} s, {row['sent_bytes'] + row['manifest_bytes']:,} "
        f"bytes sent of {dedup['size']:,}; server CPU {row['server_cpu_s_per_GiB']:.2f} s/GiB"
    )
    return Figure(row["vs_full"], runs=row.get("runs", 1), detail=detail)


def _dedup_resolve(report: dict[str, Any]) -> Figure | None:
    res = (report.get("dedup") or {}).get("resolve")
    if not res:
        return None
    detail = (
        f"{res['cached_s']:.2f} vs {res['plain_s']:.2f} s; {res['fetched_bytes']:,} bytes fetched, "
        f"{res['cached_bytes']:,} from the cache"
    )
    return Figure(res["vs_plain"], runs=1, detail=detail, text=f"{res['vs_plain']:.2f}×")


# Where each goal row's figure comes from in the report (section and case).
ROWS: dict[str, Callable[[dict[str, Any]], Figure | None]] = {
    "download_full": _case("e2e", "download full body"),
    "download_range": _case("e2e", "download one range"),
    "upload_dd": _case("e2e", "upload (curl POST"),
    "upload_sink": _case("e2e", "upload into a discarding sink"),
    "resolve_one": _case("e2e", "resolve url descriptor, one stream", "resolve url descriptor (download"),
    "resolve_four": _case("e2e", "resolve url descriptor, 4 connections"),
    "chunked_wan": _wan,
    "small_sink": _small("ratio", "baseline"),
    "small_durable": _small("ratio_durable", "durable_baseline"),
    "s3_upload": _case("s3", "S3 upload through the service"),
    "s3_download": _case("s3", "S3 download through the service"),
    "base64_encode": _kernel("base64_encode"),
    "gzip_decode_random": _kernel("gzip_decode_random"),
    "deflate_decode_random": _kernel("deflate_decode_random"),
    "cpu_upload": _cpu("upload"),
    "cpu_download": _cpu("download"),
    "clients_1": _clients(1),
    "clients_8": _clients(8),
    "clients_64": _clients(64),
    "clients_256": _clients(256),
    "memory_peak": _memory_peak,
    "memory_growth": _memory_growth,
    "memory_s3": _memory_s3,
    "memory_s3_concurrent": _memory_s3_concurrent,
    "replicas_small": _replicas("small_per_s", "uploads/s"),
    "replicas_large": _replicas("large_MBps", "MB/s"),
    "list_scale": _scale("list"),
    "list_scale_full_page": _scale("list", full_page=True),
    "session_scale": _scale("session"),
    "dedup_changed": _dedup_budget("1% in 20 places"),
    "dedup_appended": _dedup_budget("16 MiB appended"),
    "dedup_unchanged": _dedup_unchanged,
    "dedup_resolve": _dedup_resolve,
}


def summarize(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per goal row, in :data:`GOALS` order: id, label, goal, figure (None: not run), met."""
    out = []
    for row_id, goal in GOALS.items():
        figure = ROWS[row_id](report)
        out.append(
            {
                "id": row_id,
                "label": goal.label,
                "goal": goal.text,
                "target": goal.target,
                "at_most": goal.at_most,
                "unit": goal.unit,
                "value": None if figure is None else figure.value,
                "low": None if figure is None else figure.low,
                "high": None if figure is None else figure.high,
                "runs": None if figure is None else figure.runs,
                "text": None if figure is None else figure.text,
                "detail": "" if figure is None else figure.detail,
                "met": None if figure is None else goal.met(figure.value),
            }
        )
    return out


def _number(value: float, unit: str) -> str:
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "s/GiB":
        return f"{value:.2f} s/GiB"
    return f"{value:,.0f} {unit}"


def figure_text(row: dict[str, Any]) -> str:
    """``median (min-max)``, or the row's own text; "not run" when its section did not run."""
    if row["value"] is None:
        return "not run"
    if row["text"]:
        return str(row["text"])
    text = _number(row["value"], row["unit"])
    if row["low"] is not None and row["high"] is not None and row["runs"] and row["runs"] > 1:
        low, high = (f"{row['low']:.2f}", f"{row['high']:.2f}")
        text += f" ({low}-{high})"
    return text


def summary_table(rows: list[dict[str, Any]], cpu: str, note: str = "") -> str:
    """The markdown goals table, the host's CPU in its header."""
    lines = [
        f"## Goals — host CPU: {cpu}",
        "",
        "Ratios are ours/baseline measured in the same run over alternating pairs: median (min-max). "
        + (note + " " if note else "")
        + '"not run": the section was skipped or its baseline is missing on this host.',
        "",
        "| row | figure | goal | met | behind the figure |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        met = "—" if r["met"] is None else ("yes" if r["met"] else "**no**")
        label = r["label"].replace("|", "\\|")
        lines.append(f"| {label} | {figure_text(r)} | {r['goal']} | {met} | {r['detail']} |")
    return "\n".join(lines)


def machine() -> str:
    """The host as every report names it: its CPU (:func:`host_cpu`), the Python version and the kernel."""
    return f"{host_cpu()}, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def host_cpu() -> str:
    """The host's CPU as a reader compares hosts: model name from /proc/cpuinfo (lscpu's vendor and model when
    it has none) and the CPUs this process may use, e.g. "AMD EPYC 7B13, 2 vCPU"."""
    model = ""
    virtual = False
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            if key.strip() == "flags" and " hypervisor" in f" {value}":
                virtual = True
    except OSError:
        pass
    if not model and shutil.which("lscpu"):
        fields = {}
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        model = " ".join(filter(None, (fields.get("Vendor ID"), fields.get("Model name")))) or ""
        virtual = virtual or "Hypervisor vendor" in fields
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"{model or platform.processor() or 'unknown CPU'}, {count} {'vCPU' if virtual else 'CPU'}"
