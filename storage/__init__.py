"""Storage backends for the transfer service. This package never imports ``transfer``."""

from storage.base import (
    Capability,
    ObjectInfo,
    ObjectReader,
    ObjectWriter,
    Storage,
    SupportsCompose,
    SupportsPresign,
    validate_key,
)
from storage.errors import (
    BackendUnavailable,
    InvalidKey,
    ObjectChanged,
    ObjectExists,
    ObjectNotFound,
    ObjectTooLarge,
    StorageError,
    StorageFull,
)

__all__ = [
    "BackendUnavailable",
    "Capability",
    "InvalidKey",
    "ObjectChanged",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectReader",
    "ObjectTooLarge",
    "ObjectWriter",
    "Storage",
    "StorageError",
    "StorageFull",
    "SupportsCompose",
    "SupportsPresign",
    "validate_key",
]
