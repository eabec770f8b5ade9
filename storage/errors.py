"""Errors raised by storage backends. The service translates them with one table (``transfer.errors``).

StorageError
├── ObjectNotFound       the key does not exist (or is not yet published)
├── InvalidKey           the key is not a valid object key
├── ObjectTooLarge       the backend refuses an object of this size
├── StorageFull          no space left on the device / quota exceeded
└── BackendUnavailable   the backend cannot be reached or failed in a way a retry may fix
    └── ObjectChanged    the object is not (or no longer) the version the caller named: a conditional write
                         (``if_match``) lost to another writer, or a pinned reader's object was replaced
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


class BackendUnavailable(StorageError):
    pass


class ObjectChanged(BackendUnavailable):
    """The compare of a compare-and-set failed (the key now has another version, or none): read again, retry."""
