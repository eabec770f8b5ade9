"""What every request that makes a new file may say about it (sessions, direct-upload plans): one model, one set
of checks; and the JSON number and boolean types of every request body (strict: ``1.0``, ``true`` or ``"1"`` is
not an integer, ``1`` is not a boolean)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from transfer.core.model.content import FileRole, normalize_checksum
from transfer.core.model.mime import validate_media_type
from transfer.core.numerals import JsonBool, JsonInt
from transfer.core.uploads.state import FileIntent

__all__ = ["JsonBool", "JsonInt", "NewFile"]


class NewFile(BaseModel):
    """The file-to-be's name, type, declared SHA-256, role, description and lifetime."""

    name: str | None = Field(default=None, max_length=1024)
    content_type: str | None = Field(default=None, max_length=255)
    checksum: str | None = Field(default=None, description="sha256:<hex> of the whole file, verified at completion")
    role: FileRole | None = None
    description: str | None = None  # its limit is the service's (max_description_length), whatever the door
    expires_in: JsonInt | None = Field(
        default=None, gt=0, description="seconds the finished file lives; above the key's or service's maximum: 400"
    )

    def intent(self) -> FileIntent:
        """What the request asks the file to be (its lifetime as asked: the upload engine grants it)."""
        return FileIntent(
            name=self.name,
            content_type=self.content_type,
            role=self.role,
            description=self.description,
            lifetime=self.expires_in,
        )

    @field_validator("content_type")
    @classmethod
    def _media_type(cls, v: str | None) -> str | None:
        return None if v is None else validate_media_type(v)

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, v: str | None) -> str | None:
        return None if v is None else normalize_checksum(v)
