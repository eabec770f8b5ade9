"""The server's protocol work (transfer.api.protocol) subclasses private classes of uvicorn and Hypercorn, so it is
tested against one minor version of each: the installed versions, the pins in pyproject.toml and the range the
package names must agree, or a dependency upgrade would slip in untested."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from transfer.api import protocol

ROOT = Path(__file__).resolve().parents[2]


def _pin(name: str) -> SpecifierSet:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        if req.name == name:
            return req.specifier
    raise AssertionError(f"{name} is not a dependency in pyproject.toml")


@pytest.mark.parametrize(
    ("name", "tested"), [("uvicorn", protocol.UVICORN_TESTED), ("hypercorn", protocol.HYPERCORN_TESTED)]
)
def test_installed_version_is_the_tested_range_and_the_pin(name: str, tested: tuple[str, str]) -> None:
    low, high = tested
    assert _pin(name) == SpecifierSet(f">={low},<{high}"), f"pyproject.toml's {name} pin differs from the tested range"
    installed = Version(version(name))
    assert Version(low) <= installed < Version(high), f"{name} {installed} is outside the tested range [{low}, {high})"
    assert f"{name} {low}" in (protocol.__doc__ or "").replace("Hypercorn", "hypercorn"), "the docstring names it"
