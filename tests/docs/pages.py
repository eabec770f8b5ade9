"""The code blocks of the documentation (README.md and docs/**/*.md) as the tests see them.

A fenced block in ``sh``/``bash`` or ``python`` is an example a reader will copy, so the tests run it. A block that
cannot run against a local server (it needs S3, a cluster, a second service with other settings) says so in the page,
on the line before its fence::

    <!-- test: skip "needs an S3 endpoint" -->

and its test is skipped with that reason. A ``text`` block marked ``<!-- test: output -->`` right after a runnable
block is what that block prints: each of its lines must appear in the output (a line ending in ``…`` up to there).
Blocks of other languages (``json``, ``text``, ``yaml``) are shown, not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNNABLE = {"sh": "bash", "bash": "bash", "python": "python"}

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<lang>[\w+-]*)")
_SKIP = re.compile(r'^<!-- test: skip "(?P<reason>[^"]+)" -->$')
_OUTPUT = "<!-- test: output -->"
_MARKER = re.compile(r"^<!-- test: ")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: where it is, its language and code, and what the page says about running it."""

    page: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    skip: str | None  # the reason the page gives for not running it
    output: str | None  # the text block marked as its expected output

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page of the site, in a stable order."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` in order, with their markers; a marker that names no block is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: str | None = None  # the marker line waiting for its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if _MARKER.match(stripped):
            if not (_SKIP.match(stripped) or stripped == _OUTPUT):
                raise ValueError(f"{path}:{i + 1}: unknown test marker {stripped!r}")
            pending = stripped
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if stripped and pending is not None:
                raise ValueError(f"{path}:{i + 1}: the marker {pending!r} is not right before a code block")
            i += 1
            continue
        indent, mark, language = len(fence["indent"]), fence["fence"], fence["lang"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(mark):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1  # the closing fence
        code = "\n".join(body) + "\n"
        skip = _SKIP.match(pending).group("reason") if pending and _SKIP.match(pending) else None  # type: ignore[union-attr]
        if pending == _OUTPUT:
            if not found or not found[-1].runnable or language != "text":
                raise ValueError(f"{path}:{start + 1}: an output marker belongs on a text block after a runnable one")
            previous = found.pop()
            found.append(Block(previous.page, previous.line, previous.language, previous.code, previous.skip, code))
        else:
            relative = str(path.relative_to(ROOT))
            found.append(Block(relative, start + 1, language, code, skip, None))
        pending = None
    return found
