"""File names and media types: sanitising user-supplied names, sniffing types, and Content-Disposition.

Pure. File names only ever label content; object keys are never derived from them.
"""

from __future__ import annotations

import mimetypes
import re
import unicodedata
from typing import Final
from urllib.parse import quote, unquote

import puremagic

from transfer.core.jsontext import parse_json
from transfer.core.model import mime, signatures
from transfer.errors import JsonTooDeep

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


# Content-Type values tools send whatever the body is: curl's --data default, HTTPie's default for a body on stdin
# (application/json), fetch/XHR for a string body (text/plain), and the generic one. They say nothing about the bytes.
TOOL_DEFAULT_TYPES: Final = frozenset(
    {mime.MIME_OCTET_STREAM, "application/x-www-form-urlencoded", mime.MIME_JSON, mime.MIME_TEXT_PLAIN}
)
# puremagic names some types by older or vendor aliases: the seed's constants (or the registered type) instead
_ALIASES: Final = {
    "application/x-gzip": mime.MIME_GZIP,
    "audio/wave": mime.MIME_AUDIO_WAV,
    "audio/x-wav": mime.MIME_AUDIO_WAV,
    "video/avi": mime.MIME_VIDEO_AVI,
    "image/x-ms-bmp": mime.MIME_IMAGE_BMP,
    "application/x-sqlite3": signatures.SQLITE,
    "application/ogg": mime.MIME_AUDIO_OGG,
}
_STRONG_MATCH: Final = 0.3  # puremagic's confidence grows with the matched length; 2-byte matches score 0.2


def resolve_content_type(head: bytes, name: str | None, *, declared: str | None, hinted: str | None) -> str:
    """The media type to store content under, from what the client said and what the bytes show.

    ``declared`` is the client's own word (a ``content_type`` query parameter or form field, a descriptor's
    type) and always wins. ``hinted`` is a type that came with the body (the ``Content-Type`` header, a form
    part's type), which a tool may have sent by default: a tool default (:data:`TOOL_DEFAULT_TYPES`) gives way to
    what :func:`sniff_content_type` finds, and any type that claims text gives way to a clear binary signature
    (HTTPie's ``application/json`` on a Parquet body would have been served gzipped as JSON). Other hints stand:
    ``application/vnd.ms-excel`` on a ZIP is the client knowing better than the container."""
    if declared:
        return declared
    sniffed = sniff_content_type(head, name)
    if not hinted:
        return sniffed
    hint = mime.essence(hinted)
    if hint in TOOL_DEFAULT_TYPES:
        if mime.essence(sniffed) == hint:
            return hinted  # agreed: keep the client's parameters (charset)
        if hint == mime.MIME_JSON and sniffed == mime.MIME_TEXT_PLAIN and _opens_json(head):
            return hinted  # JSON longer than the sample, which then does not parse whole
        return sniffed
    if mime.is_textual(hinted):
        signature = signatures.signature_type(head, name)
        if signature is not None and not mime.is_textual(signature):
            return signature
    return hinted


def sniff_content_type(head: bytes, name: str | None) -> str:
    """Best media type for content starting with ``head``: a clear signature first (transfer.core.model.signatures),
    then a strong puremagic match (for a text sample, only a textual type), then the name's extension, then a
    weak binary match, then a text heuristic (UTF-8 without NULs; JSON when it parses), else
    ``application/octet-stream``."""
    found = signatures.signature_type(head, name)
    if found is not None:
        return found
    text = _as_text(head)
    magic, strength = _puremagic(head)
    if magic is not None and strength >= _STRONG_MATCH and (text is None or mime.is_textual(magic)):
        return magic
    by_name = _extension_type(name)
    if by_name is not None:
        return by_name
    if text is None:
        return magic if magic is not None and head else mime.MIME_OCTET_STREAM
    if text.lstrip()[:1] in ("{", "["):
        try:
            parse_json(text)
            return mime.MIME_JSON
        except (ValueError, JsonTooDeep):  # json.loads would recurse into a head of "[[[…" until RecursionError
            pass
    return mime.MIME_TEXT_PLAIN if head else mime.MIME_OCTET_STREAM


def _as_text(head: bytes) -> str | None:
    """``head`` as text when it is UTF-8 without NULs (a multi-byte character cut at the end allowed), else None."""
    if not head or b"\0" in head:
        return None
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a multi-byte character cut at the end of the sample
            return None
        return head[: exc.start].decode("utf-8")


def _opens_json(head: bytes) -> bool:
    text = _as_text(head)
    return text is not None and text.lstrip()[:1] in ("{", "[")


class _MagicIndex:
    """puremagic's signatures indexed by offset and first byte, to tell in a few dozen look-ups that none of them
    can match: puremagic itself compares all ~1,400 one by one (about a millisecond per 4 KiB head), and most
    small uploads (text, JSON) match none. Built from puremagic's own tables, so it follows its version; when they
    are not where expected, every head goes to puremagic."""

    def __init__(self) -> None:
        self.ready = False
        self.last: tuple[bytes | None, bool] = (None, True)
        try:
            from puremagic import main as tables

            headers, footers = tables.magic_header_array, tables.magic_footer_array
            self.max_head, self.max_foot = int(tables.max_head), int(tables.max_foot)
        except (ImportError, AttributeError, TypeError, ValueError):
            return
        self.by_offset: dict[int, dict[int, list[bytes]]] = {}
        for row in headers:
            match, offset = bytes(row.byte_match), int(row.offset)
            if not match or offset < 0:
                return  # a row this index does not model: leave every head to puremagic
            self.by_offset.setdefault(offset, {}).setdefault(match[0], []).append(match)
        self.footers = [(int(row.offset), bytes(row.byte_match)) for row in footers]
        self.ready = True

    def may_match(self, head: bytes) -> bool:
        """False only when puremagic would find no signature in ``head`` (it compares the same slices: the first
        ``max_head`` bytes against header rows, the last ``max_foot`` against footer rows; every other match it
        reports extends one of these)."""
        if not self.ready:
            return True
        last = self.last  # one answer kept: an upload asks about its head twice (sniff_is_cheap, then the sniff)
        if last[0] is head:
            return last[1]
        found = self._may_match(head)
        self.last = (head, found)
        return found

    def _may_match(self, head: bytes) -> bool:
        header, footer = head[: self.max_head], head[-self.max_foot :]
        for offset, by_first in self.by_offset.items():
            if offset < len(header) and (candidates := by_first.get(header[offset])):
                if any(header[offset : offset + len(match)] == match for match in candidates):
                    return True
        for offset, match in self.footers:
            end = offset + len(match)
            if (footer[offset:end] if end != 0 else footer[offset:]) == match:
                return True
        return False


_MAGIC = _MagicIndex()


def sniff_is_cheap(head: bytes) -> bool:
    """True when :func:`resolve_content_type` on ``head`` costs microseconds: puremagic's full scan (about a
    millisecond) would find nothing, so it is skipped. A caller on an event loop may then sniff in place rather
    than in a worker thread."""
    return not _MAGIC.may_match(head)


def _puremagic(head: bytes) -> tuple[str | None, float]:
    """puremagic's best-named match for ``head`` and its confidence; (None, 0) when it knows none."""
    if not head or not _MAGIC.may_match(head):
        return None, 0.0
    return _puremagic_scan(head)


def _puremagic_scan(head: bytes) -> tuple[str | None, float]:
    """:func:`_puremagic` without the signature index: puremagic's whole scan of ``head``."""
    try:
        matches = puremagic.magic_string(head)
    except (puremagic.PureError, ValueError, IndexError):
        return None, 0.0
    for match in matches:
        found = str(match.mime_type)
        if "/" in found and mime.is_media_type(found):
            return _ALIASES.get(found, found), float(match.confidence)
    return None, 0.0


def _extension_type(name: str | None) -> str | None:
    if not name:
        return None
    known = signatures.extension_type(name)
    if known is not None:
        return known
    guessed, _ = mimetypes.guess_type(name, strict=False)
    return guessed


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
