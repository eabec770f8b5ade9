"""A wheelhouse made from the distributions already installed in this interpreter: what lets a test install a
built wheel into a fresh venv with ``pip install --no-index`` (no network, no pip cache needed).

Each installed distribution is packed back into a wheel from the files its ``RECORD`` lists, with the tag its
``WHEEL`` file names, so compiled extensions stay the ones that run here. Only the dependency closure of the
requirements asked for is packed (with their extras), never the whole environment.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# written by the installer, not part of a wheel (PEP 376, PEP 610)
INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions these requirements need, transitively (markers evaluated here, extras followed)."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(Requirement(r), "") for r in requirements]
    seen: set[tuple[str, str]] = set()
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        for wanted in [""] + sorted(requirement.extras):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            dist = found.setdefault(name, metadata.distribution(requirement.name))
            pending.extend((Requirement(r), wanted) for r in dist.requires or [])
    return found


def pack(dist: metadata.Distribution, out: Path) -> Path:
    """Write ``dist`` as a wheel into ``out``; the wheel's path."""
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    if not tags:
        raise ValueError(f"{dist.metadata['Name']} has no WHEEL tag: it was not installed from a wheel")
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower()
    interpreters, abis, platforms = (sorted({tag.split("-")[i] for tag in tags}) for i in range(3))
    path = out / f"{name}-{dist.version}-{'.'.join(interpreters)}-{'.'.join(abis)}-{'.'.join(platforms)}.whl"
    record: list[str] = []
    dist_info = ""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for file in dist.files or []:
            parts = file.parts
            if ".." in parts or "__pycache__" in parts:
                continue  # console scripts (pip writes them again from entry_points.txt) and bytecode
            if parts[0].endswith(".dist-info"):
                dist_info = parts[0]
                if parts[-1] in INSTALLER_FILES:
                    continue
            data = Path(str(file.locate())).read_bytes()
            wheel.writestr(str(file), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{file},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        wheel.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


def build_wheelhouse(requirements: list[str], out: Path) -> list[Path]:
    """A wheel for every installed distribution ``requirements`` need, in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return [pack(dist, out) for dist in closure(requirements).values()]
