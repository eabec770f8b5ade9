"""Storage backends for the transfer service. This package never imports ``transfer``."""

from storage.base import Capability, ObjectInfo, ObjectReader, ObjectWriter, Storage, SupportsPresign, validate_key
from storage.errors import (
    BackendUnavailable,
    InvalidKey,
    ObjectNotFound,
    ObjectTooLarge,
    StorageError,
    StorageFull,
)

__all__ = [
    "BackendUnavailable",
    "Capability",
    "InvalidKey",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectReader",
    "ObjectTooLarge",
    "ObjectWriter",
    "Storage",
    "StorageError",
    "StorageFull",
    "SupportsPresign",
    "validate_key",
]
