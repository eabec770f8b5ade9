"""What a session looks like to callers, whatever the front door: its document and its streaming descriptor."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from transfer.core.model.content import DownloadMethod, FileContent, TransferMode, format_timestamp
from transfer.core.uploads.sessions import Session
from transfer.service.files.records import FileRecord
from transfer.service.files.service import FileService
from transfer.settings import MAX_URL_TTL


def chunks_path(sid: str) -> str:
    """The path of session ``sid``'s chunks, relative to the service's base URL."""
    return f"/v1/sessions/{sid}/chunks"


def streaming_descriptor(
    files: FileService, session: Session, base: str, ttl: int | None, record: FileRecord | None = None
) -> FileContent:
    """A signed streaming-mode FileContent: readers follow the chunks live, or after completion."""
    ttl = min(ttl or files.settings.url_ttl, MAX_URL_TTL)
    if record is not None and record.expires_at is not None:  # no URL claims to outlive the file it reads
        ttl = max(1, min(ttl, int(record.expires_at.timestamp()) - int(files.clock())))
    url, expires_at = files.signed_url_for_path(base, chunks_path(session.id), "GET", ttl)
    return FileContent(
        type=TransferMode.STREAMING,
        content_type=(record.content_type if record else session.content_type) or "application/octet-stream",
        size=session.size,
        checksum=("sha256:" + record.sha256) if record else session.checksum,
        name=session.name,
        role=session.intent.role,
        description=session.intent.description,
        url=url,
        url_expires_at=expires_at,
        download_method=DownloadMethod.GET,
        streaming_session_id=session.id,
        total_chunks=session.total_chunks,
        chunk_size=session.chunk_size,
        metadata={
            "chunk_checksum": "xxh3-128",
            **({"file_id": record.id} if record else {}),
            **({"expires_at": format_timestamp(record.expires_at)} if record and record.expires_at else {}),
        },
    )


def session_document(files: FileService, session: Session, base: str) -> dict[str, Any]:
    """The answer to opening a session: ids, sizes, expiry, where to send chunks, and (size known) a descriptor."""
    doc: dict[str, Any] = {
        "streaming_session_id": session.id,
        "state": session.state.value,
        "name": session.name,
        "size": session.size,
        "chunk_size": session.chunk_size,
        "total_chunks": session.total_chunks,
        "expires_at": format_timestamp(datetime.fromtimestamp(session.expires_at, UTC)),
        "urls": {
            "chunk": f"{base}/v1/sessions/{session.id}/chunks/{{index}}",
            "status": f"{base}/v1/sessions/{session.id}",
            "complete": f"{base}/v1/sessions/{session.id}/complete",
            "events": f"{base}/v1/jobs/{session.id}/events",
        },
    }
    if session.file_id is not None:  # born completed: content the key stores, published without a chunk
        doc["file_id"] = session.file_id
    if session.size is not None:  # a live reader can follow it from now on
        doc["descriptor"] = streaming_descriptor(files, session, base, None).to_json()
    return doc
