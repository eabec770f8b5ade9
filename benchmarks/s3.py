"""S3 cases: the service on the S3 backend vs boto3's own ``upload_file`` / ``download_file`` against the same
S3-compatible server, alternating, plus the service's peak RSS while a large file passes through it to S3."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.e2e import Case, curl_upload, make_file, peak_rss_bytes, pin, service, timed

BOTO_SCRIPT = """
import sys, boto3
from botocore.config import Config
op, endpoint, key_id, secret, region, bucket, key, path = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
                  region_name=region, config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
if op == "upload":
    s3.upload_file(path, bucket, key)
else:
    s3.download_file(bucket, key, path)
"""


BENCH_SIGNING_KEYS = json.dumps({"bench": secrets.token_urlsafe(32)})


def s3_service_env(endpoint: Any, bucket: str) -> dict[str, str]:
    """The environment of a ``transfer serve`` on ``bucket`` of ``endpoint`` (one process on it)."""
    return {
        **os.environ,
        "TRANSFER_STORAGE": "s3",
        "TRANSFER_S3_BUCKET": bucket,
        "TRANSFER_S3_ENDPOINT_URL": endpoint.url,
        "TRANSFER_S3_ADDRESSING_STYLE": "path",
        # Swift's s3api (the test server) refuses If-Match on PUT; a named endpoint (MinIO, AWS) takes it
        "TRANSFER_S3_ATOMIC_IF_MATCH": "true" if os.environ.get("TRANSFER_TEST_S3_ENDPOINT") else "false",
        "TRANSFER_SINGLE_REPLICA": "true",  # one service process on the bucket (Swift refuses replicas otherwise)
        "AWS_ACCESS_KEY_ID": endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret_key,
        "AWS_REGION": endpoint.region,
        "TRANSFER_SIGNING_KEYS": BENCH_SIGNING_KEYS,  # on a bucket the service never keeps its own
    }


def run_s3(size: int, reps: int, workdir: Path, endpoint: Any = None, memory_size: int = 0) -> dict[str, Any]:
    """Upload/download ``size`` bytes through the service on S3 and with boto3 directly; returns rows + memory."""
    from devtools.s3server import s3_client, swift_s3_server

    with ExitStack() as stack:
        if endpoint is None:
            endpoint = stack.enter_context(swift_s3_server())
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client = s3_client(endpoint)
        client.create_bucket(Bucket=bucket)
        env = s3_service_env(endpoint, bucket)
        src = workdir / "s3-payload.bin"
        make_file(src, size)
        boto = [sys.executable, "-c", BOTO_SCRIPT]
        creds = [endpoint.url, endpoint.access_key, endpoint.secret_key, endpoint.region, bucket]
        up = Case("S3 upload through the service", size, baseline="boto3 upload_file")
        # direct: `transfer upload --direct` sends the parts to presigned URLs; the service only plans, signs and
        # reads the assembled object back to verify its SHA-256 (included in the time)
        direct = Case("S3 direct upload (transfer upload --direct)", size, baseline="boto3 upload_file")
        direct_vs_proxied = Case(
            "S3 direct upload (transfer upload --direct)", size, baseline="upload through the service (curl)"
        )
        down = Case("S3 download through the service", size, baseline="boto3 download_file")
        report: dict[str, Any] = {"endpoint": "swift s3api" if "127.0.0.1" in endpoint.url else endpoint.url}
        (workdir / "s3serve").mkdir(exist_ok=True)
        with service(workdir / "s3serve", env=env) as (url, pid):
            for i in range(reps):
                out = workdir / f"s3up{i}.json"
                up.ours_s.append(timed(curl_upload(src, f"{url}/v1/files", out)))
                up.base_s.append(timed([*pin(1), *boto, "upload", *creds, f"direct-{i}", str(src)]))
                direct_cmd = [sys.executable, "-m", "transfer", "upload", str(src), "--direct", "--no-progress"]
                direct_cmd += ["--server", url, "--connections", "8", "--state-dir", str(workdir / "direct-state")]
                direct.ours_s.append(timed([*pin(1), *direct_cmd]))
                direct.base_s.append(up.base_s[-1])
                direct_vs_proxied.ours_s.append(direct.ours_s[-1])
                direct_vs_proxied.base_s.append(up.ours_s[-1])
                signed = json.loads(out.read_text())["url"]
                down.ours_s.append(timed([*pin(1), "curl", "-sSf", "-o", str(workdir / "s3down.bin"), signed]))
                down.base_s.append(
                    timed([*pin(1), *boto, "download", *creds, f"direct-{i}", str(workdir / "s3direct.bin")])
                )
            report["server_peak_rss_bytes"] = peak_rss_bytes(pid)
        report["cases"] = [up.row(), down.row(), direct.row(), direct_vs_proxied.row()]
        if memory_size:
            big = workdir / "s3-big.bin"
            make_file(big, memory_size)
            (workdir / "s3mem").mkdir(exist_ok=True)
            with service(workdir / "s3mem", env=env) as (url, pid):
                out = workdir / "s3big.json"
                subprocess.run(
                    curl_upload(big, f"{url}/v1/files", out),
                    check=True,
                )
                descriptor = json.loads(out.read_text())
                key = f"data/files/{descriptor['metadata']['file_id']}"
                digest = hashlib.sha256()
                body = client.get_object(Bucket=bucket, Key=key)["Body"]
                while chunk := body.read(1 << 20):
                    digest.update(chunk)
                report["memory"] = {
                    "size": memory_size,
                    "peak_rss_after_upload": peak_rss_bytes(pid),
                    "stored_sha256_matches": "sha256:" + digest.hexdigest() == descriptor["checksum"],
                }
            big.unlink()
        src.unlink()
        return report


def concurrent_memory(
    endpoint: Any, workdir: Path, counts: tuple[int, ...] = (1, 8, 32), size: int = 128 << 20
) -> dict[str, Any]:
    """The service's peak RSS (VmHWM of a fresh process) while ``n`` clients upload ``size`` bytes each into S3 at
    once, for each ``n`` of ``counts``: with the process-wide part-buffer budget (the default) and without it (a
    budget larger than every upload together, what each upload had before: its own ten parts), the latter at the
    largest count only. Files of 128 MiB
    hold more than one upload's ten 8 MiB parts, so each upload fills its buffers as a 1 GiB one would."""
    from benchmarks.replicas import serve_unpinned
    from devtools.s3server import s3_client

    bucket = f"benchmem-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    env = {
        **os.environ,
        "TRANSFER_STORAGE": "s3",
        "TRANSFER_S3_BUCKET": bucket,
        "TRANSFER_S3_ENDPOINT_URL": endpoint.url,
        "TRANSFER_S3_ADDRESSING_STYLE": "path",
        "TRANSFER_SINGLE_REPLICA": "true",
        "TRANSFER_S3_ATOMIC_IF_MATCH": "true" if endpoint.engine != "swift" else "false",
        "AWS_ACCESS_KEY_ID": endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret_key,
        "AWS_REGION": endpoint.region,
        "TRANSFER_SIGNING_KEYS": BENCH_SIGNING_KEYS,  # on a bucket the service never keeps its own
    }
    src = workdir / "s3-concurrent.bin"
    make_file(src, size)
    rows = []
    for budget, runs in (("default", counts), (str(64 << 30), counts[-1:])):
        for n in runs:
            run_env = dict(env) if budget == "default" else {**env, "TRANSFER_S3_BUFFER_BUDGET": budget}
            where = workdir / f"s3conc-{budget}-{n}"
            where.mkdir(exist_ok=True)
            with serve_unpinned(where, run_env) as (url, pid):
                start = time.monotonic()
                clients = [subprocess.Popen(curl_upload(src, f"{url}/v1/files", where / f"{i}.json")) for i in range(n)]
                codes = [c.wait() for c in clients]
                seconds = time.monotonic() - start
                rows.append(
                    {
                        "budget": budget,
                        "budget_bytes": int(run_env.get("TRANSFER_S3_BUFFER_BUDGET", _default_budget())),
                        "clients": n,
                        "size": size,
                        "peak_rss": peak_rss_bytes(pid),
                        "seconds": seconds,
                        "MBps": n * size / seconds / 1e6,
                        "failed": sum(code != 0 for code in codes),
                    }
                )
    src.unlink()
    from benchmarks.summary import host_cpu

    return {"engine": endpoint.engine, "cpu": host_cpu(), "rows": rows}


def _default_budget() -> int:
    from transfer.settings import Settings

    return int(Settings.model_fields["s3_buffer_budget"].default)


def concurrent_memory_table(report: dict[str, Any]) -> str:
    lines = [
        f"Concurrent uploads into S3 ({report['engine']}), peak RSS of a fresh service"
        f" ({report.get('cpu', 'CPU not recorded')}):",
        "",
        "| part buffers | clients × size | peak RSS | aggregate MB/s | failed |",
        "|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        budget = (
            f"one budget ({r.get('budget_bytes', 96 << 20) >> 20} MiB)"  # reports from before budget_bytes: 96
            if r["budget"] == "default"
            else "per upload (no budget)"
        )
        lines.append(
            f"| {budget} | {r['clients']} × {r['size'] >> 20} MiB | {r['peak_rss'] / 1e6:.0f} MB | "
            f"{r['MBps']:.0f} | {r['failed']} |"
        )
    return "\n".join(lines)


def s3_table(report: dict[str, Any]) -> str:
    lines = [
        f"S3 endpoint: {report['endpoint']}; service peak RSS {report['server_peak_rss_bytes'] / (1 << 20):.0f} MiB",
        "",
        "| case | ours MB/s | baseline | baseline MB/s | ratio median (min-max) |",
        "|---|---|---|---|---|",
    ]
    for row in report["cases"]:
        lines.append(
            f"| {row['case']} | {row['ours_MBps']:.0f} | {row['baseline']} | {row['baseline_MBps']:.0f} | "
            f"{row['ratio_median']:.2f}× ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) |"
        )
    if "memory" in report:
        m = report["memory"]
        lines.append("")
        lines.append(
            f"{m['size'] >> 20} MiB through the service into S3: peak RSS {m['peak_rss_after_upload'] / (1 << 20):.0f}"
            f" MiB, stored object's SHA-256 matches the descriptor: {m['stored_sha256_matches']}"
        )
    return "\n".join(lines)
