"""The storage backends by name: how each is built from plain options, and where it keeps things.

A backend's module is imported only when it is built (``transfer --help`` and the settings' validation import no
S3 client). The service maps its settings to :class:`StorageOptions` (``transfer.service.backends``); this module
knows nothing of them. A new backend is its module in ``storage/``, its entry in :data:`BACKENDS` (and the options it
reads, if new), and its run of the conformance suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from storage.base import Storage
from storage.errors import StorageError


class MissingOption(StorageError):
    """The backend named cannot be built without an option that was not given (``option``: its field name)."""

    def __init__(self, backend: str, option: str) -> None:
        super().__init__(f"storage backend {backend!r} needs the option {option}")
        self.backend = backend
        self.option = option


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """Everything a registered backend is built from. Each backend reads its own fields (``s3_*``: the S3 backend's,
    as :class:`storage.s3.S3Config` names them); the defaults are the backends' own."""

    data_dir: Path = Path("transfer-data")
    buffer_size: int = 1 << 20  # bytes per read call
    local_sync: Literal["syncfs", "fsync", "off"] = "syncfs"  # how local storage makes small objects durable together
    max_object_size: int = 64 << 30
    s3_bucket: str | None = None
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_addressing_style: str = "auto"
    s3_prefix: str = ""
    s3_part_size: int = 8 << 20
    s3_part_buffers: int = 10
    s3_buffer_budget: int = 64 << 20
    s3_max_concurrency: int = 16
    s3_atomic_if_absent: bool = True
    s3_atomic_if_match: bool = True
    s3_max_attempts: int = 5
    s3_connect_timeout: float = 5.0
    s3_read_timeout: float = 20.0
    s3_call_budget: float = 30.0
    s3_abandoned_upload_age: float = 24 * 3600


@dataclass(frozen=True, slots=True)
class Backend:
    """One storage backend the service may name: how to build it, and where it keeps things (for the first line of
    ``transfer serve``)."""

    name: str
    build: Callable[[StorageOptions], Storage]
    where: Callable[[StorageOptions], str]
    # whether only this host can read what it keeps (a directory of this machine, nothing at all), so that a signing
    # key generated into it is as private as the files themselves; a bucket is read with credentials of its own
    private: bool = False


def _local(options: StorageOptions) -> Storage:
    from storage.local import LocalStorage

    return LocalStorage(options.data_dir, buffer_size=options.buffer_size, group_sync=options.local_sync)


def _s3(options: StorageOptions) -> Storage:
    from storage.s3 import S3Config, S3Storage

    if not options.s3_bucket:
        raise MissingOption("s3", "s3_bucket")
    return S3Storage(
        S3Config(
            bucket=options.s3_bucket,
            endpoint_url=options.s3_endpoint_url,
            region=options.s3_region,
            addressing_style=options.s3_addressing_style,
            prefix=options.s3_prefix,
            part_size=options.s3_part_size,
            part_buffers=options.s3_part_buffers,
            buffer_budget=options.s3_buffer_budget,
            max_concurrency=options.s3_max_concurrency,
            atomic_if_absent=options.s3_atomic_if_absent,
            atomic_if_match=options.s3_atomic_if_match,
            max_object_size=options.max_object_size,
            buffer_size=options.buffer_size,
            max_attempts=options.s3_max_attempts,
            connect_timeout=options.s3_connect_timeout,
            read_timeout=options.s3_read_timeout,
            call_budget=options.s3_call_budget,
            abandoned_upload_age=options.s3_abandoned_upload_age,
        )
    )


def _null(options: StorageOptions) -> Storage:
    from storage.null import NullStorage

    return NullStorage()


BACKENDS: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("local", _local, lambda options: str(options.data_dir.resolve()), private=True),
        Backend("s3", _s3, lambda options: f"s3://{options.s3_bucket}"),
        Backend("null", _null, lambda options: "nothing (null storage: benchmarks only)", private=True),
    )
}
