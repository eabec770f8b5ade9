"""The S3 client of one backend: boto3 calls in a thread pool, retried by botocore within a time budget per
call, their errors translated; where data and metadata objects live under the prefix."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Literal, TypeVar

import boto3
import botocore.exceptions
from botocore.config import Config

from storage.base import validate_key
from storage.s3.config import S3Config
from storage.s3.errors import translate_error

T = TypeVar("T")


def _checksum_calculation(endpoint_url: str | None) -> Literal["when_supported", "when_required"]:
    """botocore's ``request_checksum_calculation`` for an endpoint. Over plain HTTP SigV4 signs every request body's
    SHA-256 (``X-Amz-Content-SHA256``), which the engine checks: a CRC32 of each part beside it (botocore's default
    since 1.36) proves nothing more and costs ~0.27 s of CPU per GiB uploaded (AMD EPYC). Over HTTPS the body is
    sent unsigned and the CRC32 is its only per-part check, so it stays. An endpoint named only in botocore's own
    configuration files is not seen here and keeps the default: the same bytes, a little more CPU."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return "when_required" if endpoint.lower().startswith("http://") else "when_supported"


class S3Client:
    """A boto3 S3 client and the pool its blocking calls run in; ``call`` is the one way to use it."""

    def __init__(self, config: S3Config) -> None:
        if config.connect_timeout + config.read_timeout > config.call_budget:
            raise ValueError("one attempt (connect_timeout + read_timeout) must fit in call_budget")
        self.config = config
        self.executor = ThreadPoolExecutor(max_workers=config.max_concurrency, thread_name_prefix="s3")
        session = boto3.session.Session(
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_access_key,
            aws_session_token=config.session_token,
            region_name=config.region,
        )
        self.session = session
        self.client = session.client(
            "s3",
            endpoint_url=config.endpoint_url,
            config=Config(
                request_checksum_calculation=_checksum_calculation(config.endpoint_url),
                signature_version="s3v4",
                s3={"addressing_style": config.addressing_style},
                retries={"mode": "standard", "max_attempts": config.max_attempts},
                max_pool_connections=config.max_concurrency,
                connect_timeout=config.connect_timeout,
                read_timeout=config.read_timeout,
            ),
        )
        # Retries happen inside botocore (standard mode); each attempt after the first builds a new request whose
        # context carries the attempt number. Whoever runs this storage may count them (``on_retry(operation)``).
        self.on_retry: Callable[[str], None] | None = None
        self.client.meta.events.register("request-created.s3", self._request_created)
        self.client.meta.events.register("before-call.s3", self._call_started)
        # runs before the standard retry handler: a False here is the first non-None answer, so no retry
        self.client.meta.events.register_first("needs-retry.s3", self._retry_fits)

    def _call_started(self, context: dict[str, Any], **_: Any) -> None:
        context["transfer_call_started"] = time.monotonic()

    def _retry_fits(self, attempts: int, request_dict: dict[str, Any], **_: Any) -> bool | None:
        """False (no retry) when the next attempt could not end within the call's budget: the longest backoff
        standard mode may pick before attempt ``attempts + 1`` (2^(attempts-1) s, at most 20) plus one whole
        attempt. None leaves the decision to botocore's retry handler."""
        started = request_dict.get("context", {}).get("transfer_call_started")
        if started is None:
            return None
        c = self.config
        longest = time.monotonic() - started + min(20.0, 2.0 ** (attempts - 1)) + c.connect_timeout + c.read_timeout
        return False if longest > c.call_budget else None

    def _request_created(self, request: Any, operation_name: str = "", **_: Any) -> None:
        attempt = getattr(request, "context", {}).get("retries", {}).get("attempt", 1)
        if attempt > 1 and self.on_retry is not None:
            self.on_retry(operation_name)

    def data_key(self, key: str) -> str:
        return f"{self.config.prefix}data/{validate_key(key)}"

    def meta_key(self, key: str) -> str:
        return f"{self.config.prefix}meta/{validate_key(key)}.json"

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking boto3 call in the pool; translate its errors."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, partial(fn, *args, **kwargs))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise translate_error(exc, what) from exc
