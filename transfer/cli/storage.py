"""``transfer storage check``: probe an S3 endpoint as the backend does at start-up."""

from __future__ import annotations

import argparse
import json

from transfer.cli.console import CliError, settings_refused


async def cmd_storage_check(args: argparse.Namespace) -> int:
    """Probe an S3 endpoint the way the backend does at start-up and print what it saw."""
    from dataclasses import asdict

    from pydantic import ValidationError

    from storage.base import replica_hazards
    from storage.errors import StorageError
    from storage.s3 import S3Config, S3Storage
    from transfer.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise settings_refused(exc) from exc
    bucket = args.bucket or settings.s3_bucket
    if not bucket:
        raise CliError("invalid_request", "name a bucket to probe in: --bucket or TRANSFER_S3_BUCKET")
    endpoint = args.endpoint or settings.s3_endpoint_url
    storage = S3Storage(
        S3Config(
            bucket=bucket,
            endpoint_url=endpoint,
            region=args.region or settings.s3_region,
            addressing_style=args.addressing_style or settings.s3_addressing_style,
            prefix=settings.s3_prefix if args.prefix is None else args.prefix,
            max_attempts=2,
        )
    )
    try:
        await storage.start()
    except StorageError as exc:
        raise CliError("storage_unavailable", str(exc).splitlines()[0]) from exc
    finally:
        await storage.close()
    engine = storage.engine
    assert engine is not None
    hazards = replica_hazards(storage)
    if args.json:
        print(json.dumps({**asdict(engine), "replicas": not hazards, "hazards": hazards}))
        return 0
    rows = [("probe", "outcome", "what the backend does"), *engine.rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    print(f"S3 engine at {endpoint or 'AWS'}, bucket {bucket}")
    for probe, outcome, use in rows:
        print(f"  {probe:<{widths[0]}}  {outcome:<{widths[1]}}  {use}")
    verdict = "safe for several replicas" if not hazards else "ONE replica only: " + "; ".join(hazards)
    print(f"replicas: {verdict}")
    return 0
