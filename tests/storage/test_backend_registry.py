"""Storage backends are chosen from one registry (storage.registry.BACKENDS), and each backend declares
the limits of its engine (storage.base.StoreRules) that the service applies without naming the engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from storage import registry
from storage.local import LocalStorage
from storage.null import NullStorage
from storage.parts import MIN_PART_SIZE
from storage.registry import BACKENDS, Backend
from storage.rules import DEFAULT_RULES, S3Rules, StoreRules, rules_of
from storage.s3 import S3Storage
from transfer.service.backends import make_storage
from transfer.service.metered import metered
from transfer.settings import Settings


def test_each_registered_backend_is_built_from_its_name(tmp_path: Path) -> None:
    assert list(BACKENDS) == ["local", "s3", "null"]
    assert isinstance(make_storage(Settings(data_dir=tmp_path)), LocalStorage)
    assert isinstance(make_storage(Settings(storage="null")), NullStorage)
    s3 = make_storage(Settings(storage="s3", s3_bucket="b", s3_part_size=16 << 20, s3_abandoned_upload_age=60))
    assert isinstance(s3, S3Storage)
    assert rules_of(s3) == S3Rules(preferred_part_size=16 << 20, abandoned_upload_age=60)


def test_an_unregistered_name_is_refused_by_the_settings() -> None:
    with pytest.raises(ValidationError, match="unknown storage backend 'gcs'"):
        Settings(storage="gcs")


def test_a_new_backend_is_one_registry_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No other file names the backends: an entry makes the name valid in the settings and buildable."""
    entry = Backend("memory", lambda options: NullStorage(), lambda options: "memory")
    monkeypatch.setitem(registry.BACKENDS, "memory", entry)
    assert isinstance(make_storage(Settings(storage="memory")), NullStorage)


def test_the_store_declares_its_rules(tmp_path: Path) -> None:
    assert rules_of(LocalStorage(tmp_path)) is DEFAULT_RULES
    assert DEFAULT_RULES.min_compose_part == 0 and DEFAULT_RULES.abandoned_upload_age is None
    s3 = S3Storage.__new__(S3Storage)  # its rules need no connection
    s3.config = type("C", (), {"part_size": 8 << 20, "abandoned_upload_age": 3600.0})()  # type: ignore[assignment]
    assert rules_of(metered(LocalStorage(tmp_path))) is DEFAULT_RULES  # read through the metrics wrapper
    rules = rules_of(s3)
    assert rules.min_compose_part == MIN_PART_SIZE and rules.abandoned_upload_age == 3600.0
    signed = "https://s3.example/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=600&X-Amz-Signature=ab"
    assert rules.presigned_expires_in(signed, 3600) == 600  # the engine capped it
    assert rules.presigned_expires_in("https://s3.example/b/k", 3600) == 3600
    assert StoreRules().presigned_expires_in(signed, 3600) == 3600


def test_part_sizes_follow_the_declared_limits() -> None:
    s3 = S3Rules()
    assert s3.part_size(100 << 20, max_size=1 << 40) == 8 << 20
    assert s3.part_size(200_000 << 20, max_size=1 << 40) == 20 << 20  # 10,000 parts at most
    few = StoreRules(min_part_size=1 << 20, preferred_part_size=1 << 20, max_parts=10)
    assert few.part_size(100 << 20, max_size=1 << 40) == 10 << 20
