"""Choosing and building the storage backend from settings, and the state the service keeps in it."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from storage.base import Storage
from transfer.errors import Conflict, InvalidRequest, NotFound, SigningKeysRequired
from transfer.service.files.documents import read_document, write_document
from transfer.settings import Settings

SIGNING_KEYS_KEY = "system/signing-keys.json"


@dataclass(frozen=True, slots=True)
class Backend:
    """One storage backend the settings may name (``TRANSFER_STORAGE``): how to build it, and where it keeps
    things (for ``transfer serve``'s first line). A backend's module is imported only when it is built."""

    name: str
    build: Callable[[Settings], Storage]
    where: Callable[[Settings], str]
    # whether only this host can read what it keeps (a directory of this machine, nothing at all), so that a signing
    # key generated into it is as private as the files themselves; a bucket is read with credentials of its own
    private: bool = False


def _local(settings: Settings) -> Storage:
    from storage.local import LocalStorage

    return LocalStorage(settings.data_dir, buffer_size=settings.buffer_size, group_sync=settings.local_sync)


def _s3(settings: Settings) -> Storage:
    from storage.s3 import S3Config, S3Storage

    if not settings.s3_bucket:
        raise InvalidRequest("storage=s3 needs TRANSFER_S3_BUCKET")
    return S3Storage(
        S3Config(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            addressing_style=settings.s3_addressing_style,
            prefix=settings.s3_prefix,
            part_size=settings.s3_part_size,
            part_buffers=settings.s3_part_buffers,
            buffer_budget=settings.s3_buffer_budget,
            max_concurrency=settings.s3_max_concurrency,
            atomic_if_absent=settings.s3_atomic_if_absent,
            atomic_if_match=settings.s3_atomic_if_match,
            max_object_size=settings.max_upload_size,
            buffer_size=settings.buffer_size,
            max_attempts=settings.s3_max_attempts,
            connect_timeout=settings.s3_connect_timeout,
            read_timeout=settings.s3_read_timeout,
            call_budget=settings.s3_call_budget,
            abandoned_upload_age=settings.s3_abandoned_upload_age,
        )
    )


def _null(settings: Settings) -> Storage:
    from storage.null import NullStorage

    return NullStorage()


# the registry: a new backend is its module in storage/ plus one entry here (and its conformance test)
BACKENDS: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("local", _local, lambda settings: str(settings.data_dir.resolve()), private=True),
        Backend("s3", _s3, lambda settings: f"s3://{settings.s3_bucket}"),
        Backend("null", _null, lambda settings: "nothing (null storage: benchmarks only)", private=True),
    )
}


def make_storage(settings: Settings) -> Storage:
    """The backend ``settings`` name: local (the embedded default), S3 (credentials from the AWS chain), null."""
    backend = BACKENDS.get(settings.storage)
    if backend is None:
        raise InvalidRequest(f"unknown storage backend {settings.storage!r}; one of {', '.join(BACKENDS)}")
    return backend.build(settings)


def require_signing_keys_kept_apart(settings: Settings) -> None:
    """SigningKeysRequired unless the signing keys are configured or the backend is private to this host.

    A key kept in a bucket is read by whoever holds the bucket's credentials (a backup job, a read-only role, a
    leaked pair), who could then sign URLs the service honours, for any path and any expiry. So on such a backend the
    keys come from the deployment's secrets (TRANSFER_SIGNING_KEYS), which the bucket never sees. Encrypting the
    stored key would not spare that: its encryption key would be one more secret every replica is given the same way.
    """
    backend = BACKENDS.get(settings.storage)
    if settings.signing_keys or (backend is not None and backend.private):
        return
    raise SigningKeysRequired(
        f"storage {settings.storage!r} needs TRANSFER_SIGNING_KEYS: a signing key kept in the bucket would be "
        'readable with the bucket\'s credentials. Give every replica the same one: {"k1": "<the output of `openssl '
        'rand -base64 32`>"}. A key an earlier version generated is in the bucket at '
        f"{SIGNING_KEYS_KEY}: configure it under its id to keep the URLs already handed out valid, then delete it there"
    )


async def load_signing_keys(settings: Settings, storage: Storage) -> tuple[dict[str, bytes], str]:
    """Signing keys from settings, else (on a private backend only, see :func:`require_signing_keys_kept_apart`)
    the ones kept in it, created on first start."""
    if settings.signing_keys:
        keys = {kid: secret.encode() for kid, secret in settings.signing_keys.items()}
        return keys, settings.signing_key_id or next(iter(keys))
    require_signing_keys_kept_apart(settings)
    try:
        stored = await read_document(storage, SIGNING_KEYS_KEY)
    except NotFound:
        try:
            await write_document(storage, SIGNING_KEYS_KEY, {"k1": secrets.token_urlsafe(32)}, if_absent=True)
        except Conflict:
            pass  # another replica created them first
        stored = await read_document(storage, SIGNING_KEYS_KEY)
    keys = {kid: secret.encode() for kid, secret in stored.items()}
    return keys, settings.signing_key_id or next(iter(keys))
