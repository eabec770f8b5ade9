"""What the service persists about a stored file, and how it travels in a backend's flat string metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime

from transfer.core.ids import is_id, new_id, owner_folder
from transfer.core.model.content import ContentEncoding, FileRole
from transfer.errors import StorageUnavailable

RECORD_KEY = "transfer-record"
RECORD_VERSION = 1


def new_file_id() -> str:
    """A fresh, unguessable file id (128 random bits); object keys derive from it, never from user input."""
    return new_id("f_")


def object_key(file_id: str) -> str:
    """The storage key of a file's bytes."""
    return f"files/{file_id}"


def owner_files_prefix(owner: str) -> str:
    """The per-key file index: one empty object ``owners/<key hash>/files/<file id>`` per file the key stored,
    so listing a key's files reads that key's folder, in file-id order, not every file stored."""
    return f"{owner_folder(owner)}files/"


def is_file_id(value: str) -> bool:
    """Whether ``value`` has the form of a file id (``f_…``)."""
    return is_id(value, "f_")


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A stored file: identity, what the original bytes are, and how they are stored."""

    id: str
    name: str
    content_type: str
    size: int  # original bytes
    sha256: str  # hex, of the original bytes
    encoding: ContentEncoding  # of the stored bytes
    encoded_size: int  # stored bytes
    encoded_sha256: str  # hex, of the stored bytes (the ETag and Repr-Digest)
    created_at: datetime
    role: FileRole | None = None
    description: str | None = None
    owner: str | None = None  # the API key that stored it (None: stored in open mode); other keys get 404
    expires_at: datetime | None = None  # when it goes (service clock); None: kept until deleted
    # a file sharing bytes another file of its key stored: the content record saying where they are (its own
    # object has no body); None: its bytes are its object's (see transfer.service.files.shared)
    content: str | None = None
    # a file with bytes of its own large enough to share them: the content record those bytes may be the location
    # of, fixed at publication (its scope then), so that its removal finds the record even after its key changed
    # sharing group; None: not shared, or published before this field (its key's own scope)
    shared_as: str | None = None
    # what the deployment's pre-upload hook gave the file (descriptors carry it in their metadata); None: nothing
    metadata: dict[str, str] | None = None

    def to_metadata(self) -> dict[str, str]:
        """ASCII-only string metadata (fits S3 user metadata)."""
        # every field is a plain value: a shallow copy (asdict deep-copies each one, a tenth of a small upload's CPU)
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["encoding"] = self.encoding.value
        doc["role"] = self.role.value if self.role else None
        doc["created_at"] = self.created_at.isoformat()
        doc["expires_at"] = None if self.expires_at is None else self.expires_at.isoformat()
        if self.content is None:
            del doc["content"]  # the records of files with bytes of their own stay as they were
        if self.shared_as is None:
            del doc["shared_as"]
        if self.metadata is None:
            del doc["metadata"]
        doc["v"] = RECORD_VERSION
        return {RECORD_KEY: json.dumps(doc, ensure_ascii=True, separators=(",", ":"))}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> FileRecord:
        """The record kept in an object's ``metadata`` (StorageUnavailable when it holds none or an unreadable one)."""
        try:
            doc = json.loads(metadata[RECORD_KEY])
            doc.pop("v", None)
            doc["encoding"] = ContentEncoding(doc["encoding"])
            doc["role"] = FileRole(doc["role"]) if doc.get("role") else None
            doc["created_at"] = datetime.fromisoformat(doc["created_at"])
            expiry = doc.get("expires_at")
            doc["expires_at"] = None if expiry is None else datetime.fromisoformat(expiry)
            return cls(**doc)
        except (KeyError, ValueError, TypeError) as exc:
            raise StorageUnavailable("stored object has no readable file record") from exc
