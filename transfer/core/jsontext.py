"""JSON text from clients, parsed one way: nesting bounded, RFC 8259 numbers only. Pure: no I/O.

Python's ``json`` module recurses once per level of nesting, in C, until the interpreter's recursion limit: a body of
a few kilobytes of ``[`` raises ``RecursionError``, which no handler expects (a 500), and a structure parsed just
below the limit can make the next recursive step (validation, ``json.dumps``) fail the same way. The parser of
pydantic-core (jiter, in Rust, already a dependency through pydantic) stops at a fixed depth with a ``ValueError``
instead, refuses ``NaN``/``Infinity`` (RFC 8259 §6) and lone surrogates (§8.2: text that cannot be UTF-8 later), and
is faster than ``json.loads`` on the largest body parsed whole here (a 200,000-chunk manifest, 23.8 MB: 0.16–0.23 s
against 0.28–0.30 s, AMD EPYC).

    parse_json(raw)  -> the value; JsonTooDeep (400 json_too_deep) past MAX_DEPTH levels; ValueError when the text
                        is not JSON (each door reports that with its own code: invalid_manifest, invalid_descriptor)
"""

from __future__ import annotations

from typing import Any, Final

import pydantic_core

from transfer.errors import JsonTooDeep

# jiter's fixed limit: 200 nested objects or arrays parse, deeper ones do not (tests/test_hostile_input.py pins it)
MAX_DEPTH: Final = 200
_TOO_DEEP: Final = "recursion limit exceeded"  # jiter's message for it


def parse_json(raw: bytes | bytearray | str) -> Any:
    """The value of the JSON text ``raw`` (UTF-8 when bytes). Nested deeper than :data:`MAX_DEPTH`: JsonTooDeep;
    not JSON (syntax, encoding, ``NaN``, trailing bytes): ValueError with the parser's message and position."""
    try:
        return pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        if _TOO_DEEP in str(exc):
            raise JsonTooDeep(f"JSON nested deeper than {MAX_DEPTH} levels is not accepted") from None
        raise
