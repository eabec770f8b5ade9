"""The pre-upload hook: before any upload stores a byte, the service asks one HTTP endpoint of the deployment
whether to take it, and the answer may set the file's lifetime and metadata.

    POST <hook_url>                               (Standard Webhooks headers when ``hook_secret`` is set)
    {"type": "upload.requested", "timestamp": "...Z",
     "data": {"upload_id", "owner", "door", "name", "size", "content_type", "checksum", "lifetime", "client"}}

    200 {"allow": true,  "lifetime": 3600, "metadata": {"project": "x"}}    both optional
    200 {"allow": false, "reason": "no .exe files here"}                   403 upload_refused, the reason as message

Anything else (a timeout, a connection refused, a status other than 2xx, a body that is not such an object) is a
failure, answered by ``hook_on_failure``: ``deny`` (the default: 503 hook_unavailable, retryable) or ``allow``.
Every call is counted in ``transfer_hook_calls{outcome}`` and timed in ``transfer_hook_duration_seconds``.

It is called in two places only: :meth:`UploadLifecycle.open` (every resumable door: tus, IETF, chunked sessions,
deduplicating uploads, direct plans, upload authorisations) and :meth:`FileService.upload` (raw, multipart and PUT
uploads, and what comes through them: imports, MCP uploads, A2A parts, TP mounts).

The hook's URL is held to the SSRF guard of server-side fetches (``hooks_allow_networks`` opens private ranges).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from transfer import metrics
from transfer.core.uploads.state import FileIntent
from transfer.errors import DestinationRefused, HookUnavailable, UploadRefused
from transfer.service.events.model import timestamp
from transfer.service.events.signing import webhook_headers
from transfer.service.jobs.fetch import DestinationPolicy, GuardedTransport
from transfer.settings import Settings

log = logging.getLogger("transfer.hooks")

# the address of the client whose request is being served (set by the application for each request)
CLIENT_ADDRESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("transfer_client_address", default=None)

MAX_ANSWER = 64 << 10  # bytes of a hook's answer read at most
MAX_REASON = 500  # characters of a refusal's reason shown to the client
MAX_METADATA = 16  # entries a hook may set
MAX_METADATA_VALUE = 256
# bytes of the metadata as JSON, in all: it travels in the file's record, which S3 keeps in its 2 KB of user metadata
MAX_METADATA_BYTES = 512
METADATA_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RESERVED_METADATA = frozenset({"file_id", "expires_at"})  # the service's own descriptor metadata


@dataclass(frozen=True, slots=True)
class Screening:
    """What the service knows of an upload before its first byte: what the hook is sent."""

    upload_id: str
    owner: str | None
    door: str
    intent: FileIntent
    size: int | None
    checksum: str | None

    def to_json(self, now: float) -> dict[str, Any]:
        """The request body the hook is sent at ``now``."""
        i = self.intent
        data = {
            "upload_id": self.upload_id,
            "owner": self.owner,
            "door": self.door,
            "name": i.name,
            "size": self.size,
            "content_type": i.content_type or i.hinted_type,
            "checksum": None if not self.checksum else "sha256:" + self.checksum.removeprefix("sha256:"),
            "lifetime": i.lifetime,
            "role": None if i.role is None else i.role.value,
            "client": CLIENT_ADDRESS.get(),
        }
        return {"type": "upload.requested", "timestamp": timestamp(now), "data": data}


@dataclass(frozen=True, slots=True)
class Admission:
    """What the hook allowed: the lifetime it set (None: as asked) and the metadata it gives the file."""

    lifetime: int | None = None
    metadata: Mapping[str, str] | None = None


class _Failure(Exception):
    """The hook's answer is not usable (the message says why, for the log)."""


def _clean(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)[:MAX_REASON].strip()


def parse_answer(doc: Any) -> Admission:
    """The admission a hook's JSON answer grants; UploadRefused for a refusal; _Failure for anything unusable."""
    if not isinstance(doc, dict) or not isinstance(doc.get("allow"), bool):
        raise _Failure('the answer is not a JSON object with "allow": true or false')
    if not doc["allow"]:
        reason = doc.get("reason")
        text = _clean(reason) if isinstance(reason, str) else ""
        raise UploadRefused(f"upload refused: {text or 'refused by the upload policy'}", reason=text or None)
    lifetime = doc.get("lifetime")
    if lifetime is not None and (isinstance(lifetime, bool) or not isinstance(lifetime, int) or lifetime <= 0):
        raise _Failure('"lifetime" is a positive whole number of seconds')
    metadata = doc.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA:
            raise _Failure(f'"metadata" is an object of at most {MAX_METADATA} entries')
        for name, value in metadata.items():
            if not METADATA_NAME.fullmatch(name) or name in RESERVED_METADATA:
                raise _Failure(f'"metadata" name {name[:80]!r} is not allowed')
            if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE or not value.isprintable():
                raise _Failure(f'"metadata" value of {name!r} is not printable text of at most {MAX_METADATA_VALUE}')
        if len(json.dumps(metadata, ensure_ascii=True, separators=(",", ":"))) > MAX_METADATA_BYTES:
            raise _Failure(f'"metadata" is longer than {MAX_METADATA_BYTES} bytes as JSON')
    return Admission(lifetime=lifetime, metadata=metadata or None)


class PreUploadHook:
    """The deployment's one pre-upload hook (see the module text); without ``hook_url``, every upload is allowed."""

    def __init__(self, settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.url = settings.hook_url
        self.policy = DestinationPolicy.from_cidrs(settings.hooks_allow_networks)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def enabled(self) -> bool:
        """Whether a hook is configured."""
        return self.url is not None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            transport = self._transport or GuardedTransport(self.policy)
            self._client = httpx.AsyncClient(transport=transport, follow_redirects=False)
            self._loop = loop
        return self._client

    async def ask(self, screening: Screening) -> Admission:
        """The hook's decision on ``screening``: an Admission; UploadRefused when it says no; HookUnavailable when it
        fails and the policy denies (an empty Admission when the policy allows)."""
        assert self.url is not None
        now = time.time()
        body = json.dumps(screening.to_json(now), ensure_ascii=True, separators=(",", ":")).encode()
        headers = {"content-type": "application/json", "user-agent": "agent-transfer-hook"}
        if self.settings.hook_secret:
            headers.update(webhook_headers([self.settings.hook_secret], "req_" + screening.upload_id, int(now), body))
        started = time.monotonic()
        outcome = "error"
        try:
            try:
                async with asyncio.timeout(self.settings.hook_timeout):
                    answer = await self._call(body, headers)
                admission = parse_answer(answer)
                outcome = "allow"
                return admission
            except UploadRefused:
                outcome = "deny"
                raise
            except TimeoutError:
                outcome = "timeout"
                why = f"no answer within {self.settings.hook_timeout} s"
            except (_Failure, httpx.HTTPError, DestinationRefused, OSError) as exc:
                why = str(exc) or type(exc).__name__
        finally:
            metrics.hook_calls.labels(outcome).inc()
            metrics.hook_duration.observe(time.monotonic() - started)
        log.warning("pre-upload hook failed for %s (%s): %s", screening.upload_id, self.settings.hook_on_failure, why)
        if self.settings.hook_on_failure == "allow":
            return Admission()
        raise HookUnavailable(
            "the upload policy could not be consulted; nothing was stored, try again later",
            headers={"retry-after": "5"},
        )

    async def _call(self, body: bytes, headers: dict[str, str]) -> Any:
        assert self.url is not None
        async with self._http().stream("POST", self.url, content=body, headers=headers) as response:
            if not 200 <= response.status_code < 300:
                raise _Failure(f"the hook answered HTTP {response.status_code}")
            raw = bytearray()
            async for chunk in response.aiter_bytes():
                raw += chunk
                if len(raw) > MAX_ANSWER:
                    raise _Failure(f"the answer is longer than {MAX_ANSWER} bytes")
        try:
            return json.loads(raw)
        except ValueError:
            raise _Failure("the answer is not JSON") from None

    async def close(self) -> None:
        """Close the hook's connections."""
        if self._client is not None:
            client, self._client = self._client, None
            try:
                await client.aclose()
            except RuntimeError:  # its loop closed already (a host that ran the services on another loop)
                pass
