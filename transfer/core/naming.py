"""File names and media types: sanitising user-supplied names, sniffing types, and Content-Disposition.

Pure. File names only ever label content; object keys are never derived from them.
"""

from __future__ import annotations

import json
import mimetypes
import re
import unicodedata
from urllib.parse import quote, unquote

import puremagic

from transfer.core import mime

MAX_NAME_LENGTH = 255
_BREAKS = frozenset({"Zl", "Zp"})


def sanitize_filename(name: str | None, default: str = "file") -> str:
    """A display-safe file name: last path segment only, no control characters or line separators, no leading
    dots, at most 255 characters (NFC). Returns ``default`` when nothing usable remains. Every front door's name
    passes through this before anything is stored (REST, multipart, tus metadata, sessions from TP and MCP)."""
    if not name:
        return default
    name = unicodedata.normalize("NFC", name)
    name = re.split(r"[/\\]", name)[-1]
    # controls, format characters, surrogates, unassigned; and line/paragraph separators (U+2028/9), which some
    # consumers treat as line breaks
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C" and unicodedata.category(ch) not in _BREAKS)
    name = name.strip().lstrip(".").strip()
    if len(name) > MAX_NAME_LENGTH:
        stem, dot, ext = name.rpartition(".")
        if dot and 0 < len(ext) <= 16:
            name = stem[: MAX_NAME_LENGTH - len(ext) - 1] + "." + ext
        else:
            name = name[:MAX_NAME_LENGTH]
    return name or default


def sniff_content_type(head: bytes, name: str | None) -> str:
    """Best media type for content starting with ``head``: magic bytes first, then the name's extension, then a
    text heuristic (UTF-8 without NULs; JSON when it parses), else ``application/octet-stream``."""
    if head:
        try:
            found = puremagic.from_string(head, mime=True)
        except (puremagic.PureError, ValueError, IndexError):
            found = ""
        if found and "/" in found:
            return str(found)
    if name:
        guessed, _ = mimetypes.guess_type(name, strict=False)
        if guessed:
            return guessed
    if head and b"\0" not in head:
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(head) - 4:  # not just a multi-byte character cut at the end of the sample
                return mime.MIME_OCTET_STREAM
            text = head[: exc.start].decode("utf-8")
        stripped = text.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                json.loads(text)
                return mime.MIME_JSON
            except ValueError:
                pass
        return mime.MIME_TEXT_PLAIN
    return mime.MIME_OCTET_STREAM


def content_disposition(disposition: str, filename: str) -> str:
    """``Content-Disposition`` with an ASCII fallback ``filename`` and, for non-ASCII or special names, an RFC 8187
    ``filename*`` (RFC 6266 §4.3)."""
    ascii_name = unicodedata.normalize("NFKD", filename).encode("ascii", "ignore").decode("ascii")
    ascii_name = re.sub(r'[^\x20-\x7e]|["\\%]', "_", ascii_name).strip() or "file"
    value = f'{disposition}; filename="{ascii_name}"'
    if ascii_name != filename:
        value += "; filename*=UTF-8''" + quote(filename, safe="!#$&+-.^_`|~")
    return value


def filename_from_content_disposition(value: str) -> str | None:
    """The file name of a ``Content-Disposition`` field (``filename*`` preferred over ``filename``)."""
    star = re.search(r"filename\*\s*=\s*([^;]+)", value, re.IGNORECASE)
    if star:
        charset, _, rest = star.group(1).strip().partition("'")
        _lang, _, encoded = rest.partition("'")
        if charset.lower() in ("utf-8", "iso-8859-1") and encoded:
            return unquote(encoded, encoding="utf-8" if charset.lower() == "utf-8" else "latin-1")
    plain = re.search(r'filename\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]+))', value, re.IGNORECASE)
    if plain:
        return re.sub(r"\\(.)", r"\1", plain.group(1)) if plain.group(1) is not None else plain.group(2)
    return None
