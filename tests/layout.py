"""Where local storage keeps objects on disk, for tests that look at a data directory from outside the service.

The layout is the storage's own business (storage/local/layout.py: shards inside each folder of keys); a test that needs
a file's path or the keys present asks here, so a change of layout changes one place.
"""

from __future__ import annotations

from pathlib import Path

from storage.local import LocalStorage


def object_file(data_dir: Path, key: str) -> Path:
    """The file holding the bytes of object ``key`` in the data directory ``data_dir``."""
    return LocalStorage(data_dir).object_path(key)


def stored_keys(data_dir: Path, prefix: str = "") -> list[str]:
    """The keys of every object published in ``data_dir`` whose key starts with ``prefix``, sorted, read from the
    files on disk (not through the storage's listing, which the tests of listing check)."""
    storage = LocalStorage(data_dir)
    root = storage.objects_dir
    if not root.exists():
        return []
    keys = (storage.key_of_path(path) for path in root.rglob("*") if path.is_file())
    return sorted(key for key in keys if key.startswith(prefix))
