"""The metrics wrapper of the storage backend (transfer.service.metered), applied at the composition root: it
covers every method of every storage protocol (checked by introspection of storage.base, so a method added to a
protocol and not to the wrapper fails here), answers capability checks as its backend does, and counts each
operation and failure."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import storage.base as base
from storage.errors import ObjectNotFound
from storage.local import LocalStorage
from storage.null import NullStorage
from storage.s3 import S3Storage
from transfer import metrics
from transfer.service.container import Services
from transfer.service.metered import MIXINS, UNCOUNTED, MeteredStorage, metered, metered_class
from transfer.settings import Settings


def _backend_protocols() -> list[type]:
    """Storage and every capability interface a backend may implement (not the readers and writers it returns)."""
    return [
        cls
        for name, cls in vars(base).items()
        if inspect.isclass(cls)
        and getattr(cls, "_is_protocol", False)
        and cls.__module__ == base.__name__
        and (name == "Storage" or name.startswith("Supports"))
    ]


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_protocols_are_found() -> None:
    names = {p.__name__ for p in _backend_protocols()}
    assert {"Storage", "SupportsCompose", "SupportsDirectUpload", "SupportsWriteAtOffset"} <= names


@pytest.mark.parametrize("protocol", _backend_protocols(), ids=lambda p: p.__name__)
def test_every_protocol_method_is_wrapped(protocol: type) -> None:
    """Each method is defined by the wrapper itself (not left to the fall-through to the backend's attributes,
    which would call the backend uncounted)."""
    wrapper = MeteredStorage if protocol is base.Storage else MIXINS.get(protocol)
    assert wrapper is not None, f"{protocol.__name__} has no mixin in transfer.service.metered.MIXINS"
    missing = sorted(name for name in _members(protocol) if name not in vars(wrapper))
    assert not missing, f"{protocol.__name__} methods the metrics wrapper does not cover: {missing}"
    for name in _members(protocol) - UNCOUNTED:
        ours, theirs = inspect.signature(getattr(wrapper, name)), inspect.signature(getattr(protocol, name))
        assert list(ours.parameters) == list(theirs.parameters), f"{protocol.__name__}.{name}: another signature"


@pytest.mark.parametrize("backend", [LocalStorage, S3Storage, NullStorage])
def test_the_wrapper_implements_exactly_the_interfaces_of_its_backend(backend: type) -> None:
    wrapper = metered_class(backend)
    for protocol in _backend_protocols():
        if protocol is base.Storage:
            continue
        assert issubclass(wrapper, protocol) == issubclass(backend, protocol), protocol.__name__


def _count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.anyio
async def test_operations_and_failures_are_counted(tmp_path: Path) -> None:
    backend = LocalStorage(tmp_path)
    await backend.start()
    storage = metered(backend)
    assert metered(storage) is storage
    assert typing.cast(MeteredStorage, storage).root == backend.root  # a backend's own attribute reads through
    assert storage.capabilities == backend.capabilities

    ops = "transfer_storage_operations_total"
    before = {op: _count(ops, operation=op) for op in ("create", "open", "stat", "list", "delete", "compose")}
    errors = _count("transfer_storage_errors_total", operation="stat", kind="ObjectNotFound")
    async with storage.create("a") as writer:
        await writer.write(b"abc")
        await writer.commit({})
    async with await storage.open("a") as reader:
        assert b"".join([piece async for piece in reader.read()]) == b"abc"
    assert (await storage.stat("a")).size == 3
    assert [info.key async for info in storage.list("")] == ["a"]
    assert isinstance(storage, base.SupportsCompose)
    await storage.compose("b", ["a", "a"], {})
    await storage.delete("a")
    with pytest.raises(ObjectNotFound):
        await storage.stat("a")
    for op, was in before.items():
        assert _count(ops, operation=op) == was + (2 if op == "stat" else 1), op
    assert _count("transfer_storage_errors_total", operation="stat", kind="ObjectNotFound") == errors + 1
    await storage.close()


def test_the_composition_root_meters_the_backend(tmp_path: Path) -> None:
    backend = LocalStorage(tmp_path / "data")
    services = Services.build(Settings(data_dir=tmp_path / "data"), backend)
    storage = services.files.storage
    assert isinstance(storage, MeteredStorage) and storage.inner is backend
    assert services.sessions.storage is storage and services.tus.storage is storage
    assert metrics.storage_operations is not None
