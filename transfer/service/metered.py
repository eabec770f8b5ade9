"""The storage backend as the services see it: every operation counted in the metrics, applied once, at the
composition root (:meth:`transfer.service.container.Services.build`).

:func:`metered` wraps a backend in a :class:`MeteredStorage` that delegates every method of the storage protocols
of :mod:`storage.base` (the core :class:`~storage.base.Storage` and each ``Supports*`` capability interface) to the
backend and counts it: ``transfer_storage_operations{operation}`` when it is called, and
``transfer_storage_errors{operation, kind}`` when it fails with a :class:`~storage.errors.StorageError` (a writer's
failures are counted when it commits). S3 retries are counted through the backend's ``on_retry`` hook.

The wrapper implements exactly the capability interfaces its backend implements (one mixin per interface, the
class built once per backend class), so ``isinstance(storage, SupportsDirectUpload)`` answers as for the backend
itself, and any other attribute (a backend's own: ``engine``, ``root``) is read from the backend. A method added to
one of the protocols must be added to its mixin here: ``tests/storage/test_metered_storage.py`` fails until it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar, cast

from storage.base import (
    Capability,
    ObjectInfo,
    ObjectReader,
    ObjectWriter,
    PartUrl,
    RegionWriter,
    Storage,
    StoredPart,
    SupportsAbandonedUploads,
    SupportsCompose,
    SupportsDirectUpload,
    SupportsPresign,
    SupportsPresignPut,
    SupportsWriteAtOffset,
)
from storage.errors import StorageError
from transfer import metrics

T = TypeVar("T")

# operations that are the backend's life cycle, not work it does for a request: delegated, not counted
UNCOUNTED = frozenset({"capabilities", "start", "close"})


def _failed(operation: str, exc: StorageError) -> None:
    metrics.storage_errors.labels(operation, type(exc).__name__).inc()


class _Counted:
    """What every mixin shares: the backend, and the counters by operation."""

    inner: Any

    def __init__(self, inner: Storage) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        # a backend's own attributes (not part of a protocol): read from the backend. Only reached for names the
        # wrapper does not define, so every protocol method stays counted.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def _call(self, operation: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        metrics.storage_operations.labels(operation).inc()
        try:
            return await method(*args, **kwargs)
        except StorageError as exc:
            _failed(operation, exc)
            raise

    async def _iterate(self, operation: str, items: AsyncIterator[T]) -> AsyncIterator[T]:
        metrics.storage_operations.labels(operation).inc()
        try:
            async for item in items:
                yield item
        except StorageError as exc:
            _failed(operation, exc)
            raise


def _count_commit_failures(writer: ObjectWriter) -> ObjectWriter:
    """``writer`` itself (its type and attributes unchanged), its commit failures counted under ``create``."""
    commit = writer.commit

    async def counted_commit(metadata: Mapping[str, str]) -> ObjectInfo:
        try:
            return await commit(metadata)
        except StorageError as exc:
            _failed("create", exc)
            raise

    writer.commit = counted_commit  # type: ignore[method-assign]
    return writer


class MeteredStorage(_Counted):
    """The core protocol (:class:`~storage.base.Storage`), counted."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The backend's capabilities, as it declares them."""
        return cast(frozenset[Capability], self.inner.capabilities)

    async def start(self) -> None:
        """Start the backend (not counted: its life cycle, not an operation)."""
        await self.inner.start()

    async def close(self) -> None:
        """Close the backend."""
        await self.inner.close()

    def create(
        self,
        key: str,
        *,
        size_hint: int | None = None,
        if_absent: bool = False,
        if_match: str | None = None,
        durable: bool = True,
    ) -> ObjectWriter:
        """The backend's writer for ``key``, counted; its commit failures are counted under ``create``."""
        metrics.storage_operations.labels("create").inc()
        writer = self.inner.create(key, size_hint=size_hint, if_absent=if_absent, if_match=if_match, durable=durable)
        return _count_commit_failures(writer)

    async def open(self, key: str) -> ObjectReader:
        """The backend's reader of ``key``, counted."""
        return cast(ObjectReader, await self._call("open", self.inner.open, key))

    async def stat(self, key: str) -> ObjectInfo:
        """The backend's info of ``key``, counted."""
        return cast(ObjectInfo, await self._call("stat", self.inner.stat, key))

    async def delete(self, key: str) -> None:
        """Delete ``key`` on the backend, counted."""
        await self._call("delete", self.inner.delete, key)

    def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None, metadata: bool = False
    ) -> AsyncIterator[ObjectInfo]:
        """The backend's listing, counted once per listing."""
        listing = self.inner.list(prefix, start_after=start_after, limit=limit, metadata=metadata)
        return self._iterate("list", listing)


class _MeteredCompose(_Counted):
    async def compose(self, key: str, sources: list[str], metadata: Mapping[str, str]) -> ObjectInfo:
        return cast(ObjectInfo, await self._call("compose", self.inner.compose, key, sources, metadata))


class _MeteredWriteAtOffset(_Counted):
    async def create_staged(self, staged: str, size: int | None) -> None:
        await self._call("create_staged", self.inner.create_staged, staged, size)

    def write_region(self, staged: str, offset: int, length: int) -> RegionWriter:
        metrics.storage_operations.labels("write_region").inc()
        return cast(RegionWriter, self.inner.write_region(staged, offset, length))

    def read_staged(self, staged: str, start: int, end: int) -> AsyncIterator[bytes]:
        return self._iterate("read_staged", self.inner.read_staged(staged, start, end))

    async def publish_staged(self, staged: str, key: str, size: int, metadata: Mapping[str, str]) -> ObjectInfo:
        publish = self.inner.publish_staged
        return cast(ObjectInfo, await self._call("publish_staged", publish, staged, key, size, metadata))

    async def discard_staged(self, staged: str) -> None:
        await self._call("discard_staged", self.inner.discard_staged, staged)


class _MeteredAbandonedUploads(_Counted):
    async def abort_abandoned_uploads(self, older_than: float) -> int:
        return cast(int, await self._call("abort_abandoned_uploads", self.inner.abort_abandoned_uploads, older_than))


class _MeteredPresignPut(_Counted):
    async def presign_put(
        self, key: str, *, expires_in: int, content_type: str | None = None, content_length: int | None = None
    ) -> str:
        presign = self.inner.presign_put
        kwargs = {"expires_in": expires_in, "content_type": content_type, "content_length": content_length}
        return cast(str, await self._call("presign_put", presign, key, **kwargs))


class _MeteredPresign(_Counted):
    async def presign_get(
        self,
        key: str,
        *,
        expires_in: int,
        content_type: str | None = None,
        content_encoding: str | None = None,
        content_disposition: str | None = None,
    ) -> str:
        kwargs = {
            "expires_in": expires_in,
            "content_type": content_type,
            "content_encoding": content_encoding,
            "content_disposition": content_disposition,
        }
        return cast(str, await self._call("presign_get", self.inner.presign_get, key, **kwargs))


class _MeteredDirectUpload(_Counted):
    async def begin_direct_upload(self, key: str) -> str:
        return cast(str, await self._call("begin_direct_upload", self.inner.begin_direct_upload, key))

    async def presign_part(
        self, key: str, upload_id: str, number: int, *, sha256_b64: str, size: int, expires_in: int
    ) -> PartUrl:
        presign = self.inner.presign_part
        kwargs = {"sha256_b64": sha256_b64, "size": size, "expires_in": expires_in}
        return cast(PartUrl, await self._call("presign_part", presign, key, upload_id, number, **kwargs))

    async def list_direct_parts(self, key: str, upload_id: str) -> list[StoredPart]:
        parts = await self._call("list_direct_parts", self.inner.list_direct_parts, key, upload_id)
        return cast(list[StoredPart], parts)

    async def assemble_direct_upload(self, key: str, upload_id: str, parts: list[StoredPart]) -> None:
        await self._call("assemble_direct_upload", self.inner.assemble_direct_upload, key, upload_id, parts)

    def read_assembled(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        return self._iterate("read_assembled", self.inner.read_assembled(key, start, end))

    async def publish_assembled(self, key: str, metadata: Mapping[str, str]) -> ObjectInfo:
        info = await self._call("publish_assembled", self.inner.publish_assembled, key, metadata)
        return cast(ObjectInfo, info)

    async def discard_direct_upload(self, key: str, upload_id: str | None) -> None:
        await self._call("discard_direct_upload", self.inner.discard_direct_upload, key, upload_id)


# every capability interface of storage.base and the mixin that counts it (the test checks none is missing)
MIXINS: Mapping[type, type[_Counted]] = {
    SupportsCompose: _MeteredCompose,
    SupportsWriteAtOffset: _MeteredWriteAtOffset,
    SupportsAbandonedUploads: _MeteredAbandonedUploads,
    SupportsPresignPut: _MeteredPresignPut,
    SupportsPresign: _MeteredPresign,
    SupportsDirectUpload: _MeteredDirectUpload,
}

_CLASSES: dict[type, type[MeteredStorage]] = {}


def metered_class(backend_class: type) -> type[MeteredStorage]:
    """The wrapper class for backends of ``backend_class``: :class:`MeteredStorage` plus the mixin of every
    capability interface that class implements (built once per class)."""
    cls = _CLASSES.get(backend_class)
    if cls is None:
        bases = tuple(mixin for interface, mixin in MIXINS.items() if _implements(backend_class, interface))
        cls = type(f"Metered{backend_class.__name__}", (*bases, MeteredStorage), {})
        _CLASSES[backend_class] = cls
    return cls


def _implements(backend_class: type, interface: type) -> bool:
    names = [name for name in vars(interface) if not name.startswith("_")]
    return all(callable(getattr(backend_class, name, None)) for name in names)


def metered(storage: Storage) -> Storage:
    """``storage`` with every operation counted (idempotent: a metered backend is returned as it is)."""
    if isinstance(storage, MeteredStorage):
        return storage
    if hasattr(storage, "on_retry"):
        storage.on_retry = metrics.s3_retried
    return cast(Storage, metered_class(type(storage))(storage))
