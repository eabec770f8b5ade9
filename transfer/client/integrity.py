"""The end-to-end check every resolve ends with: the bytes received are the ones the descriptor declares."""

from __future__ import annotations

from transfer.core.model.content import CodeContent, FileContent, JSONContent, TextContent, checksum_hex
from transfer.errors import ChecksumMismatch, SizeMismatch


def verify_bytes(descriptor: FileContent | TextContent | JSONContent | CodeContent, sha_hex: str, size: int) -> None:
    """Raise SizeMismatch / ChecksumMismatch unless ``size`` and ``sha_hex`` match what the descriptor declares."""
    if descriptor.size is not None and descriptor.size != size:
        raise SizeMismatch(f"content is {size} bytes, descriptor declares {descriptor.size}")
    if descriptor.checksum is not None and checksum_hex(descriptor.checksum) != sha_hex:
        raise ChecksumMismatch(
            "SHA-256 of the content does not match the descriptor's checksum",
            expected=descriptor.checksum,
            actual="sha256:" + sha_hex,
        )
