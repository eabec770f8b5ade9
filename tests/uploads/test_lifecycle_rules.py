"""The one upload lifecycle, held by reading the code (so a new door cannot slip past it):

- no upload state is set or compared as a string outside the transition table (``transfer/core/uploads/state.py``)
  and the engine (``transfer/service/uploads/lifecycle.py``): a state moves only by ``UploadRecord.after`` (the
  table), and nobody passes ``state=`` to a record or to ``replace``;
- no upload record is written or deleted outside the engine: every kind registers a key function with the
  lifecycle, and nothing but the engine calls one; no door module holds the record store;
- every door's record is an ``UploadRecord`` and every door registers its kind.

The client side (``transfer/client``, ``transfer/cli``) reads the states of the wire's JSON and is not held here.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER = [p for p in sorted((REPO / "transfer").rglob("*.py")) if "client" not in p.parts and "cli" not in p.parts]
TABLE = REPO / "transfer/core/uploads/state.py"
ENGINE = REPO / "transfer/service/uploads/lifecycle.py"
DOORS = REPO / "transfer/service/uploads"
STATES = {"open", "completed", "aborted", "expired"}
# modules of the upload folder that are not doors: the engine, the parts engine, and the chunk store (its index
# shards are records of chunks, not of uploads)
NOT_DOORS = {"lifecycle.py", "engine.py", "chunkstore.py", "chunkassembly.py", "chunkbodies.py", "__init__.py"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"


def _is_state(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "state") or (
        isinstance(node, ast.Name) and node.id == "state"
    )


def _state_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STATES


def _record_classes() -> set[str]:
    """The names of every class that subclasses UploadRecord (the records of the doors)."""
    names = {"UploadRecord"}
    for path in SERVER:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id in names for b in node.bases):
                names.add(node.name)
    return names


def _key_functions() -> set[str]:
    """The functions the doors register as their kind's ``key`` (a name, or the name a lambda calls)."""
    names: set[str] = set()
    for path in DOORS.glob("*.py"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "UploadKind":
                for kw in node.keywords:
                    if kw.arg != "key":
                        continue
                    value = kw.value
                    if isinstance(value, ast.Lambda) and isinstance(value.body, ast.Call):
                        value = value.body.func
                    assert isinstance(value, ast.Name), _where(path, kw)
                    names.add(value.id)
    return names


def test_states_are_moved_and_compared_by_the_table_alone() -> None:
    records = _record_classes()
    offences: list[str] = []
    for path in SERVER:
        if path in (TABLE, ENGINE):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_state(s) for s in sides) and any(_state_string(s) for s in sides):
                    offences.append(f"{_where(path, node)} compares a state with a string")
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in {"replace", "with_changes"} | records and any(kw.arg == "state" for kw in node.keywords):
                    offences.append(f"{_where(path, node)} sets a state by hand ({name}(state=...))")
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "state" and path.is_relative_to(DOORS):
                        offences.append(f"{_where(path, node)} assigns a state")
    assert offences == []


def test_no_upload_record_is_written_or_deleted_outside_the_engine() -> None:
    keys = _key_functions()
    assert len(keys) == 5, keys  # one per registered kind (tus, sessions, plans, authorisations, chunked)
    offences: list[str] = []
    for path in SERVER:
        if path == ENGINE:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in keys:
                offences.append(f"{_where(path, node)} calls the record key function {node.func.id}")
    for path in DOORS.glob("*.py"):
        if path.name in NOT_DOORS:
            continue
        text = path.read_text()
        for held in ("RecordStore", "write_record", ".records.", "write_document"):
            if held in text:
                offences.append(f"{path.relative_to(REPO)} holds the record store ({held})")
    assert offences == []


def test_every_door_registers_its_kind_and_its_record_is_an_upload_record() -> None:
    doors = [p for p in DOORS.glob("*.py") if p.name not in NOT_DOORS and "UploadKind(" in p.read_text()]
    assert {p.name for p in doors} == {"tus.py", "sessions.py", "direct.py", "authorizations.py", "chunked.py"}
    records = _record_classes()
    for path in doors:
        tree = _tree(path)
        registered = [
            kw.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "UploadKind"
            for kw in node.keywords
            if kw.arg == "decode"
        ]
        assert len(registered) == 1, path
        decode = registered[0]
        assert isinstance(decode, ast.Attribute) and isinstance(decode.value, ast.Name), path
        assert decode.value.id in records, f"{path.name}: {decode.value.id} is not an UploadRecord"


def test_the_rules_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checks above, on code that breaks them (so they cannot pass by reading nothing)."""
    bad = ast.parse('plan.state == "open"\nreplace(plan, state=UploadState.COMPLETED)\n')
    compares = [n for n in ast.walk(bad) if isinstance(n, ast.Compare)]
    assert compares and _is_state(compares[0].left) and _state_string(compares[0].comparators[0])
    calls = [n for n in ast.walk(bad) if isinstance(n, ast.Call)]
    assert any(kw.arg == "state" for c in calls for kw in c.keywords)
    assert "Session" in _record_classes() and "Plan" in _record_classes()
