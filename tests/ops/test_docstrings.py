"""Every public function and method of the service and core layers says what it promises (STYLE.md: a docstring
on every public function). Read from the source with ast, so it holds for code no test imports."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("transfer/service", "transfer/core")


def undocumented(source: str, where: str) -> list[str]:
    """``where:line name`` of each public function (a method of a public class included) without a docstring."""
    missing: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                setter = any(isinstance(d, ast.Attribute) and d.attr == "setter" for d in child.decorator_list)
                if not child.name.startswith("_") and not setter and ast.get_docstring(child) is None:
                    missing.append(f"{where}:{child.lineno} {prefix}{child.name}")
            elif isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return missing


def test_every_public_function_of_service_and_core_has_a_docstring() -> None:
    missing = [
        entry
        for layer in LAYERS
        for path in sorted((REPO / layer).rglob("*.py"))
        for entry in undocumented(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert missing == []


def test_the_check_sees_a_missing_docstring() -> None:
    source = '''
def documented():
    """Yes."""

def bare():
    return 1

def _private():
    return 2

class Public:
    def method(self): ...

class _Hidden:
    def method(self): ...
'''
    assert undocumented(source, "m.py") == ["m.py:5 bare", "m.py:12 Public.method"]
