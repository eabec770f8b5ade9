"""The tree shows the architecture: every import runs down the layers, and no modules import each other in a circle.

The layers, bottom to top (docs/ARCHITECTURE.md draws them)::

    storage                                   backends; never imports transfer
    transfer (its version), errors, metrics   the error tree, the metric families
    transfer.core                             pure protocol logic: no I/O, no storage
    transfer.settings | transfer.client       the service's settings | the client library, which knows no settings
    transfer.service                          every operation, once (it may resolve content with the client)
    transfer.api | transfer.web               the HTTP door, the browser page
    transfer.bindings                         MCP, A2A, TP: they answer with the HTTP door's responses
    transfer.hosts                            what one process serves
    transfer.cli                              the `transfer` command
    transfer.__main__                         `python -m transfer`

A module may import its own group and any group of a lower layer; groups that share a layer do not import each
other. Every import counts wherever it is written: at the top, inside a function, under ``TYPE_CHECKING``. A circle
is looked for in ``benchmarks`` and ``devtools`` too, which sit above everything and below nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("storage", "transfer", "benchmarks", "devtools")

LAYERS: list[tuple[str, ...]] = [
    ("storage",),
    ("transfer", "transfer.errors", "transfer.metrics"),
    ("transfer.core",),
    ("transfer.settings", "transfer.client"),
    ("transfer.service",),
    ("transfer.api", "transfer.web"),
    ("transfer.bindings",),
    ("transfer.hosts",),
    ("transfer.cli",),
    ("transfer.__main__",),
]

# besides the order: imports a lower layer must still not be made, (importing group, imported group, why)
BESIDES = [
    ("transfer.core", "storage", "the core is pure: no I/O"),
    ("transfer.api", "transfer.client", "front doors use the services, not the client"),
    ("transfer.bindings", "transfer.client", "front doors use the services, not the client"),
]

# groups that name themselves alone, not the modules below them (the root package holds only its version)
ALONE = ("transfer",)

# what the shipped packages must never import, whatever the layer
OUTSIDE = ("benchmarks", "devtools", "tests")


@dataclass(frozen=True, slots=True)
class Arrow:
    """One import: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int


def modules(root: Path = REPO) -> dict[str, Path]:
    """Every module of the checked packages, by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The module ``name`` is in (itself, or the package or module that defines it), if it is one of ours."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def arrows(known: Mapping[str, Path], outside: Iterable[str] = ()) -> list[Arrow]:
    """Every import of the ``known`` modules, at any depth of their code, to a known module or to a package named
    in ``outside`` (``from a.b import c`` is an arrow to ``a.b.c`` when that is a module, else to ``a.b``)."""
    found = []
    outside = tuple(outside)
    for source, path in known.items():
        package = source.split(".") if path.name == "__init__.py" else source.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for name in names:
                target = _resolve(name, known)
                if target is None and name.split(".")[0] in outside:
                    target = name
                if target is not None and target != source:
                    found.append(Arrow(source, target, node.lineno))
    return found


def group_of(module: str) -> tuple[str, int] | None:
    """The group (the longest prefix named in LAYERS) ``module`` belongs to, and its layer's index."""
    best: tuple[str, int] | None = None
    for index, layer in enumerate(LAYERS):
        for group in layer:
            inside = module == group or (module.startswith(group + ".") and group not in ALONE)
            if inside and (best is None or len(group) > len(best[0])):
                best = (group, index)
    return best


def arrows_up(found: Iterable[Arrow]) -> list[str]:
    """The arrows that break the layering: to a higher layer, across one layer, or named in BESIDES."""
    broken = []
    for arrow in found:
        source, target = group_of(arrow.source), group_of(arrow.target)
        if source is None or target is None or source[0] == target[0]:
            continue
        where = f"{arrow.source}:{arrow.line} imports {arrow.target}"
        if target[1] > source[1]:
            broken.append(f"{where}: {target[0]} is above {source[0]}")
        elif target[1] == source[1]:
            broken.append(f"{where}: {target[0]} and {source[0]} share a layer")
        for importer, imported, why in BESIDES:
            if source[0] == importer and target[0] == imported:
                broken.append(f"{where}: {why}")
    return broken


def circles(found: Iterable[Arrow]) -> list[list[str]]:
    """The sets of modules that import each other, directly or through others (Tarjan's strongly connected
    components of more than one module), each sorted."""
    graph: dict[str, set[str]] = {}
    for arrow in found:
        graph.setdefault(arrow.source, set()).add(arrow.target)
        graph.setdefault(arrow.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is the longest import chain: tens
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def test_every_module_has_a_layer() -> None:
    """A new top-level module of transfer/ (or storage/) is placed in LAYERS before it is imported anywhere."""
    shipped = [name for name in modules() if name.split(".")[0] in ("transfer", "storage")]
    assert [name for name in shipped if group_of(name) is None] == []


def test_no_arrow_runs_up() -> None:
    known = modules()
    shipped = {name: path for name, path in known.items() if name.split(".")[0] in ("transfer", "storage")}
    found = [arrow for arrow in arrows(known) if arrow.source in shipped]
    assert arrows_up(found) == []


def test_no_circle() -> None:
    assert circles(arrows(modules())) == []


def test_shipped_code_imports_no_tools_or_tests() -> None:
    """transfer/ and storage/ run without the repository's benchmarks, dev tools and tests (the wheel has none)."""
    known = modules()
    shipped = {name: path for name, path in known.items() if name.split(".")[0] in ("transfer", "storage")}
    stray = [
        f"{arrow.source}:{arrow.line} imports {arrow.target}"
        for arrow in arrows(shipped, outside=OUTSIDE)
        if arrow.target.split(".")[0] in OUTSIDE
    ]
    assert stray == []


def test_benchmarks_do_not_import_the_tests() -> None:
    known = modules()
    found = arrows({name: path for name, path in known.items() if name.startswith("benchmarks")}, outside=("tests",))
    assert [arrow for arrow in found if arrow.target.split(".")[0] == "tests"] == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """On a small tree of their own: a lazy import running up, a circle through a ``TYPE_CHECKING`` import, and a
    relative import across a layer are each found; a tree without them passes."""
    files = {
        "storage/__init__.py": "",
        "storage/base.py": "def f():\n    from transfer.errors import E\n",
        "transfer/__init__.py": "",
        "transfer/errors.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from transfer import metrics\n",
        "transfer/metrics.py": "from .errors import E\n",
        "transfer/core/__init__.py": "",
        "transfer/core/ranges.py": "from ..settings import S\nimport storage.base\n",
        "transfer/settings.py": "from transfer.core import ranges\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = arrows(modules(tmp_path))
    assert sorted(arrows_up(found)) == [
        "storage.base:2 imports transfer.errors: transfer.errors is above storage",
        "transfer.core.ranges:1 imports transfer.settings: transfer.settings is above transfer.core",
        "transfer.core.ranges:2 imports storage.base: the core is pure: no I/O",
        "transfer.errors:3 imports transfer.metrics: transfer.metrics and transfer.errors share a layer",
        "transfer.metrics:1 imports transfer.errors: transfer.errors and transfer.metrics share a layer",
    ]
    assert circles(found) == [
        ["transfer.core.ranges", "transfer.settings"],
        ["transfer.errors", "transfer.metrics"],
    ]
    (tmp_path / "transfer/core/ranges.py").write_text("from transfer.errors import E\n")
    for name in ("transfer/errors.py", "transfer/metrics.py", "storage/base.py"):
        (tmp_path / name).write_text("")
    assert arrows_up(arrows(modules(tmp_path))) == [] and circles(arrows(modules(tmp_path))) == []
