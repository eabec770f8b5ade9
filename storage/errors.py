"""Errors raised by storage backends. The service translates them with one table (``transfer.errors``).

StorageError
├── ObjectNotFound       the key does not exist (or is not yet published)
├── InvalidKey           the key is not a valid object key
├── ObjectTooLarge       the backend refuses an object of this size
├── StorageFull          no space left on the device / quota exceeded
├── ChecksumRejected     the backend refused the bytes: they do not match the digest sent with them
├── Unsupported          the backend does not implement the request (S3 501 NotImplemented): retrying is no use
└── BackendUnavailable   the backend cannot be reached or failed in a way a retry may fix
    └── ObjectChanged    the object is not (or no longer) the version the caller named: a conditional write
                         (``if_match``) lost to another writer, or a pinned reader's object was replaced

Each refusal is raised at once, by the backend's own translation table (S3: ``storage.s3.translate_error``), never
after a retry loop: only transport failures and the engine's own "slow down" are retried, a bounded number of times.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every storage backend error."""


class ObjectNotFound(StorageError):
    pass


class ObjectExists(StorageError):
    pass


class InvalidKey(StorageError):
    pass


class ObjectTooLarge(StorageError):
    pass


class StorageFull(StorageError):
    pass


class ChecksumRejected(StorageError):
    pass


class Unsupported(StorageError):
    pass


class BackendUnavailable(StorageError):
    pass


class ObjectChanged(BackendUnavailable):
    """The compare of a compare-and-set failed (the key now has another version, or none): read again, retry."""
