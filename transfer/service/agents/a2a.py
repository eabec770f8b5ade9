"""A2A tasks: a message's file parts become the caller's stored files, recorded as one task.

The task record is one small JSON document in the storage backend (``a2a/tasks/<id>.json``: owner, context, file
ids), so any replica answers ``GetTask``; the files are described afresh on every read (new signed URLs). A task
belongs to the key that created it: any other key gets TaskNotFound, as for an id that never existed.

Storing is all or nothing: when a part fails (bad base64, checksum or size mismatch, a URL the SSRF guard refuses,
an upstream error, a full disk), the files already stored for the message are deleted and no task is recorded.
URL parts go through :meth:`ImportService.fetch_and_store` (SSRF-guarded, size-capped, verified); inline bytes are
decoded off the event loop and go through the same upload pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from transfer.core.agents.a2a_protocol import FilePart, IncomingMessage, InlinePart, TaskView, decode_inline
from transfer.core.auth import TRUSTED, Grant, Scope
from transfer.core.model.content import FileContent
from transfer.core.uploads.state import FileIntent
from transfer.errors import Conflict, FileExpired, NotFound, TaskNotFound, TooLarge, TransferError
from transfer.service.files.documents import read_document, write_document
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.records import FileRecord
from transfer.service.files.service import FileService
from transfer.service.jobs.imports import ImportService

log = logging.getLogger("transfer.a2a")

_TASK_ID_RE = re.compile(r"t_[0-9a-f]{32}")
PIECE = 1 << 20  # decoded inline bytes are handed to the upload pipeline in pieces of this size


def task_key(task_id: str) -> str:
    """The storage key of A2A task ``task_id``'s record."""
    return f"a2a/tasks/{task_id}.json"


def is_task_id(value: str) -> bool:
    """Whether ``value`` has the form of an A2A task id (anything else is refused before storage)."""
    return _TASK_ID_RE.fullmatch(value) is not None


class A2AService:
    """SendMessage (store the file parts, record a task) and GetTask (the task with fresh URLs)."""

    def __init__(self, files: FileService, imports: ImportService, *, clock: Callable[[], float] = time.time) -> None:
        self.files = files
        self.imports = imports
        self.clock = clock

    async def send(self, message: IncomingMessage, caller: Grant, base_url: str) -> TaskView:
        """Store every file part as the caller's file and record a completed task owned by the caller's key.
        Nothing stays behind when any part fails. A message naming an existing task (``taskId``) is refused:
        tasks here are completed, hence terminal (A2A: no further messages)."""
        caller(Scope.UPLOAD)
        if message.task_id is not None:
            await self.load(message.task_id, caller)  # TaskNotFound unless the caller's
            raise Conflict(f"task {message.task_id} is completed; send the files in a new message (no taskId)")
        stored: list[FileRecord] = []
        try:
            for part in message.parts:
                stored.append(await self._store(part, caller))
            task_id = "t_" + secrets.token_hex(16)
            created = datetime.fromtimestamp(self.clock(), UTC).replace(microsecond=0)
            doc = {
                "id": task_id,
                "context_id": message.context_id or "c_" + secrets.token_hex(16),
                "message_id": message.message_id,
                "owner": caller.owner,
                "created_at": created.isoformat(),
                "files": [record.id for record in stored],
            }
            await write_document(self.files.storage, task_key(task_id), doc, if_absent=True)
        except BaseException:
            await self._discard(stored)
            raise
        return await self._view(doc, base_url, caller)

    async def get(self, task_id: str, caller: Grant, base_url: str) -> TaskView:
        """The caller's task with fresh signed URLs; TaskNotFound for unknown ids and other keys' tasks alike."""
        caller(Scope.READ)
        return await self._view(await self.load(task_id, caller), base_url, caller)

    async def load(self, task_id: str, caller: Grant) -> dict[str, Any]:
        """The task record, if the caller may see it (its own; any for admin)."""
        if not is_task_id(task_id):
            raise TaskNotFound(f"no task {task_id[:80]!r}")
        try:
            doc: dict[str, Any] = await read_document(self.files.storage, task_key(task_id))
        except NotFound:
            raise TaskNotFound(f"no task {task_id!r}") from None
        if not caller.sees(doc.get("owner")):
            raise TaskNotFound(f"no task {task_id!r}")
        return doc

    async def _view(self, doc: dict[str, Any], base_url: str, caller: Grant) -> TaskView:
        described: list[FileContent] = []
        missing = 0
        for file_id in doc["files"]:
            try:
                record = await self.files.record(file_id, caller)
            except (NotFound, FileExpired):
                missing += 1  # deleted or expired since (its owner or an admin may delete files)
                continue
            described.append(await self.files.describe(record, base_url, inline=False))
        return TaskView(
            id=doc["id"],
            context_id=doc["context_id"],
            created_at=datetime.fromisoformat(doc["created_at"]),
            files=tuple(described),
            missing=missing,
        )

    async def _store(self, part: FilePart, caller: Grant) -> FileRecord:
        if not isinstance(part, InlinePart):
            return await self.imports.fetch_and_store(part.descriptor, caller)
        limit = self.files.settings.max_upload_size
        if len(part.data) // 4 * 3 > limit + 2:
            raise TooLarge(f"the inline part is larger than {limit} bytes", limit=limit)
        data = await asyncio.to_thread(decode_inline, part.data)
        request = UploadRequest(
            owner=caller.owner,
            intent=FileIntent(name=part.name, content_type=part.media_type),
            checksum=part.checksum,
            expected_size=part.size,
        )
        return await self.files.upload(_pieces(data), request, source="a2a")

    async def _discard(self, stored: list[FileRecord]) -> None:
        for record in stored:
            try:
                await self.files.delete(record.id, TRUSTED)
            except TransferError:
                log.warning("could not delete %s after a failed A2A message; it stays as an orphan", record.id)


async def _pieces(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), PIECE):
        yield bytes(view[start : start + PIECE])
    if not data:
        yield b""
