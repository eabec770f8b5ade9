"""The wheel's build hook: it adds the browser files the service serves (``transfer/web/vendor.py``) to the wheel.

Everything else is in ``pyproject.toml``. At ``build_py`` time each npm package named there is fetched from the npm
registry at the version and integrity ``transfer/web/package-lock.json`` pins (its ``resolved`` URL when the lock has
one, else the registry's own tarball URL for that version), its SHA-512 checked against the lock before anything is
read, and only the served files and their licences are written to ``transfer/web/assets/`` in the build tree — never
into the source tree, so nothing fetched is ever committed. An editable install (``pip install -e``, what ``make``
does) skips this: a checkout serves ``transfer/web/node_modules`` from ``npm ci``.

``TRANSFER_NPM_REGISTRY`` names another registry (a mirror); ``TRANSFER_NPM_CACHE`` a folder that keeps the verified
tarballs between builds (they are checked again on every read).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import runpy
import tarfile
import urllib.request
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
WEB = HERE / "transfer" / "web"
REGISTRY = os.environ.get("TRANSFER_NPM_REGISTRY", "https://registry.npmjs.org").rstrip("/")


def tarball_url(name: str, entry: dict[str, str]) -> str:
    """Where the lock says the package is, or where the registry keeps that version's tarball."""
    if entry.get("resolved"):
        return entry["resolved"]
    return f"{REGISTRY}/{name}/-/{name.rsplit('/', 1)[-1]}-{entry['version']}.tgz"


def verified(data: bytes, integrity: str, what: str) -> bytes:
    """``data`` if its digest is the lock's Subresource-Integrity value (``sha512-<base64>``), else an error."""
    algorithm, _, expected = integrity.partition("-")
    if algorithm not in ("sha512", "sha384", "sha256"):
        raise RuntimeError(f"{what}: the lock's integrity {integrity!r} uses no digest this build checks")
    actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if actual != expected:
        raise RuntimeError(f"{what}: {algorithm} {actual} is not the lock's {expected}: refusing the tarball")
    return data


def fetch_tarball(name: str, entry: dict[str, str]) -> bytes:
    """The package's tarball, integrity checked, from the cache folder or the registry."""
    what = f"{name}@{entry['version']}"
    cache = os.environ.get("TRANSFER_NPM_CACHE")
    cached = Path(cache) / f"{name.replace('/', '+')}-{entry['version']}.tgz" if cache else None
    if cached is not None and cached.is_file():
        try:
            return verified(cached.read_bytes(), entry["integrity"], what)
        except RuntimeError:
            cached.unlink()
    url = tarball_url(name, entry)
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 (the registry's https URL)
        data = verified(response.read(), entry["integrity"], f"{what} from {url}")
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(data)
    return data


def write_assets(target: Path) -> list[Path]:
    """Write the served files and their licences under ``target`` (node_modules layout); return what was written."""
    vendor = runpy.run_path(str(WEB / "vendor.py"))
    wanted = [path for path, _ in vendor["VENDOR"].values()] + list(vendor["LICENCES"])
    lock = json.loads((WEB / "package-lock.json").read_text(encoding="utf-8"))["packages"]
    written: list[Path] = []
    for name in sorted({vendor["package_of"](path) for path in wanted}):
        entry = lock.get(f"node_modules/{name}")
        if entry is None:
            raise RuntimeError(f"{name} is served but not pinned in transfer/web/package-lock.json")
        members = {f"package/{path[len(name) + 1 :]}": path for path in wanted if vendor["package_of"](path) == name}
        with tarfile.open(fileobj=io.BytesIO(fetch_tarball(name, entry)), mode="r:gz") as tar:
            for member in tar.getmembers():
                if member.name in members and member.isfile():
                    source = tar.extractfile(member)
                    assert source is not None
                    out = target / members.pop(member.name)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(source.read())
                    written.append(out)
        if members:
            raise RuntimeError(f"{name}@{entry['version']} has no {', '.join(sorted(members.values()))}")
    return written


class build_py_with_assets(build_py):  # noqa: N801 (setuptools' command naming)
    """``build_py`` that also writes the pinned browser files into the build tree (not for editable installs)."""

    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False) and not self.dry_run:
            bundled = runpy.run_path(str(WEB / "vendor.py"))["BUNDLED"]
            self._assets = write_assets(Path(self.build_lib) / "transfer" / "web" / bundled)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *(str(p) for p in getattr(self, "_assets", []))]


if __name__ == "__main__":  # how build backends run this file; tests import its functions without building
    setup(cmdclass={"build_py": build_py_with_assets})
