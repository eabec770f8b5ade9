"""The storage backend the settings name (built by the registry, ``storage.registry``), and the signing keys the
service keeps in it."""

from __future__ import annotations

import secrets

from storage.base import Storage
from storage.registry import BACKENDS, MissingOption, StorageOptions
from transfer.errors import Conflict, InvalidRequest, NotFound, SigningKeysRequired
from transfer.service.files.documents import read_document, write_document
from transfer.settings import Settings

SIGNING_KEYS_KEY = "system/signing-keys.json"


def storage_options(settings: Settings) -> StorageOptions:
    """The options the storage registry builds backends from, as the settings give them."""
    return StorageOptions(
        data_dir=settings.data_dir,
        buffer_size=settings.buffer_size,
        local_sync=settings.local_sync,
        max_object_size=settings.max_upload_size,
        s3_bucket=settings.s3_bucket,
        s3_endpoint_url=settings.s3_endpoint_url,
        s3_region=settings.s3_region,
        s3_addressing_style=settings.s3_addressing_style,
        s3_prefix=settings.s3_prefix,
        s3_part_size=settings.s3_part_size,
        s3_part_buffers=settings.s3_part_buffers,
        s3_buffer_budget=settings.s3_buffer_budget,
        s3_max_concurrency=settings.s3_max_concurrency,
        s3_atomic_if_absent=settings.s3_atomic_if_absent,
        s3_atomic_if_match=settings.s3_atomic_if_match,
        s3_max_attempts=settings.s3_max_attempts,
        s3_connect_timeout=settings.s3_connect_timeout,
        s3_read_timeout=settings.s3_read_timeout,
        s3_call_budget=settings.s3_call_budget,
        s3_abandoned_upload_age=settings.s3_abandoned_upload_age,
    )


def make_storage(settings: Settings) -> Storage:
    """The backend ``settings`` name: local (the embedded default), S3 (credentials from the AWS chain), null."""
    backend = BACKENDS.get(settings.storage)
    if backend is None:
        raise InvalidRequest(f"unknown storage backend {settings.storage!r}; one of {', '.join(BACKENDS)}")
    try:
        return backend.build(storage_options(settings))
    except MissingOption as exc:
        raise InvalidRequest(f"storage={exc.backend} needs TRANSFER_{exc.option.upper()}") from exc


def storage_location(settings: Settings) -> str:
    """Where the backend ``settings`` name keeps things, as ``transfer serve`` says it on its first line."""
    return BACKENDS[settings.storage].where(storage_options(settings))


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
