"""Choosing and building the storage backend from settings, and the state the service keeps in it."""

from __future__ import annotations

import secrets

from storage.base import Storage
from storage.local import LocalStorage
from storage.null import NullStorage
from storage.s3 import S3Config, S3Storage
from transfer.errors import Conflict, InvalidRequest, NotFound
from transfer.service.documents import read_document, write_document
from transfer.settings import Settings

SIGNING_KEYS_KEY = "system/signing-keys.json"


def make_storage(settings: Settings) -> Storage:
    """The backend ``settings`` name: local (the embedded default) or S3 (credentials from the AWS chain)."""
    if settings.storage == "s3":
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
            )
        )
    if settings.storage == "null":
        return NullStorage()
    return LocalStorage(settings.data_dir, buffer_size=settings.buffer_size, group_sync=settings.local_sync)


async def load_signing_keys(settings: Settings, storage: Storage) -> tuple[dict[str, bytes], str]:
    """Signing keys from settings, else the ones kept in the backend (created on first start), so that every
    replica sharing the backend verifies every other replica's URLs."""
    if settings.signing_keys:
        keys = {kid: secret.encode() for kid, secret in settings.signing_keys.items()}
        return keys, settings.signing_key_id or next(iter(keys))
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
