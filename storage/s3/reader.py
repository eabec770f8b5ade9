"""Reading one version of an object: ranged GetObject calls pinned by ``If-Match`` to the ETag seen at open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from storage.base import ObjectInfo, ReaderContext
from storage.errors import BackendUnavailable
from storage.s3.bucket import S3Bucket


class S3Reader(ReaderContext):
    def __init__(self, storage: S3Bucket, info: ObjectInfo, etag: str) -> None:
        self._s = storage
        self._info = info
        self._etag = etag

    @property
    def info(self) -> ObjectInfo:
        return self._info

    @property
    def storage(self) -> S3Bucket:
        return self._s

    @property
    def etag(self) -> str:
        """The ETag of the version open: every read (and a copy_range from it) is of that version."""
        return self._etag

    async def read(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        stop = self._info.size if end is None else min(end, self._info.size)
        if start >= stop:
            return
        s = self._s
        response = await s.call(
            f"reading {self._info.key}",
            s.client.get_object,
            Bucket=s.config.bucket,
            Key=s.data_key(self._info.key),
            Range=f"bytes={start}-{stop - 1}",
            **s.get_if_match(self._etag),
        )
        body = response["Body"]
        try:
            remaining = stop - start
            while remaining > 0:
                chunk: bytes = await s.call(
                    f"reading {self._info.key}", body.read, min(s.config.buffer_size, remaining)
                )
                if not chunk:
                    raise BackendUnavailable(f"S3 response for {self._info.key} ended early")
                remaining -= len(chunk)
                yield chunk
        finally:
            await asyncio.get_running_loop().run_in_executor(s.executor, body.close)
