"""``multipart/form-data`` uploads (the seed's ``multipart`` mode, for browsers), parsed as a stream.

The first part that carries a file name (or is named ``file``) is the content; its bytes flow straight into the
upload pipeline. Other parts are small form fields (``name``, ``content_type``, ``role``, ``description``,
``checksum``) and may come before or after the file part: :func:`parse_form` yields them as :class:`FormFields`,
complete once the file stream has ended, and the pipeline applies them then (:meth:`FormFields.apply`, a new
request: the one being consumed is never changed). The publisher checks them like any other door's fields.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from python_multipart.exceptions import FormParserError, MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from transfer.core.model.content import FileRole, normalize_checksum
from transfer.core.model.naming import filename_from_content_disposition
from transfer.errors import MalformedBody
from transfer.service.files.ingest import UploadRequest

MAX_FIELD_BYTES = 64 << 10
FIELDS = ("name", "content_type", "role", "description", "checksum")


# RFC 2046 §5.1.1: boundary := 0*69<bchars> bcharsnospace, bchars := DIGIT / ALPHA / "'" / "(" / ")" / "+" / "_" /
# "," / "-" / "." / "/" / ":" / "=" / "?" / " " (RFC 7578 §4.1 takes it for multipart/form-data)
MAX_BOUNDARY = 70
_BOUNDARY_RE = re.compile(rb"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")


def multipart_boundary(content_type: str) -> bytes | None:
    """The boundary of a ``multipart/form-data`` Content-Type, or None when it is another type; MalformedBody (400
    malformed_body) when it has none or one RFC 2046 does not allow (more than 70 characters, others than its
    ``bchars``, a trailing space), before a byte of the body is read."""
    ctype, params = parse_options_header(content_type)
    if ctype != b"multipart/form-data":
        return None
    boundary = params.get(b"boundary")
    if not boundary:
        raise MalformedBody("multipart/form-data without a boundary parameter")
    if len(boundary) > MAX_BOUNDARY:
        raise MalformedBody(f"the multipart boundary has {len(boundary)} characters; RFC 2046 allows {MAX_BOUNDARY}")
    if not _BOUNDARY_RE.fullmatch(boundary):
        raise MalformedBody(
            "the multipart boundary may hold only letters, digits, spaces (not last) and '()+_,-./:=? (RFC 2046 §5.1.1)"
        )
    return boundary


def _header_text(raw: bytes) -> str:
    """A part header's value: UTF-8, as browsers send file names (RFC 7578 §4.2); latin-1 only for bytes that are
    not UTF-8 (a legacy client), so that no byte sequence makes the upload fail here."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


@dataclass(slots=True)
class FormFields:
    """What the form's parts said about the file (complete once the file stream has ended)."""

    name: str | None = None  # a ``name`` field or the file part's file name, whichever came first
    content_type: str | None = None
    hinted_type: str | None = None  # the file part's own Content-Type
    role: FileRole | None = None
    description: str | None = None
    checksum: str | None = None

    def apply(self, request: UploadRequest) -> UploadRequest:
        """``request`` with the form's fields where it has none (the query's word wins), as a new request."""
        asked = request.intent
        intent = replace(
            asked,
            name=asked.name if asked.name is not None else self.name,
            content_type=asked.content_type or self.content_type,
            hinted_type=self.hinted_type or asked.hinted_type,
            role=asked.role or self.role,
            description=asked.description if asked.description is not None else self.description,
        )
        return replace(request, intent=intent, checksum=request.checksum or self.checksum)


class _PartState:
    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.field = b""
        self.value = b""
        self.field_data = bytearray()
        self.is_file = False


def parse_form(body: AsyncIterator[bytes], boundary: bytes) -> tuple[FormFields, AsyncIterator[bytes]]:
    """The form's fields and the stream of its file part's bytes; the fields are complete once the stream ends."""
    fields = FormFields()
    return fields, _file_part_stream(body, boundary, fields)


async def _file_part_stream(body: AsyncIterator[bytes], boundary: bytes, fields: FormFields) -> AsyncIterator[bytes]:
    """Yield the bytes of the file part of a multipart body; fill ``fields`` from the other parts."""
    out: list[bytes] = []
    state = _PartState()
    seen_file = False
    file_done = False
    ended = False

    def on_part_begin() -> None:
        nonlocal state
        state = _PartState()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state.field += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state.value += data[start:end]

    def on_header_end() -> None:
        state.headers[state.field.lower()] = state.value
        state.field, state.value = b"", b""

    def on_headers_finished() -> None:
        nonlocal seen_file
        raw_disposition = state.headers.get(b"content-disposition", b"")
        disposition = _header_text(raw_disposition)
        _, params = parse_options_header(raw_disposition)  # bytes: it maps them 1:1 (latin-1) and back
        field_name = params.get(b"name", b"").decode("utf-8", "replace")
        filename = filename_from_content_disposition(disposition)
        if filename is not None or field_name == "file":
            if seen_file:
                raise MalformedBody("only one file part per upload")
            seen_file = state.is_file = True
            if fields.name is None and filename:
                fields.name = filename
            part_type = _header_text(state.headers.get(b"content-type", b"")).strip()
            if part_type:  # a hint (browsers and curl -F derive it from the extension); a content_type field wins
                fields.hinted_type = part_type
        state.field = field_name.encode()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if state.is_file:
            out.append(data[start:end])
        else:
            state.field_data += data[start:end]
            if len(state.field_data) > MAX_FIELD_BYTES:
                raise MalformedBody(f"form field larger than {MAX_FIELD_BYTES} bytes")

    def on_part_end() -> None:
        nonlocal file_done
        if state.is_file:
            file_done = True
            return
        name = state.field.decode()
        value = state.field_data.decode("utf-8", "replace")
        if name == "name" and fields.name is None:
            fields.name = value
        elif name == "content_type" and fields.content_type is None:
            fields.content_type = value
        elif name == "description" and fields.description is None:
            fields.description = value
        elif name == "checksum" and fields.checksum is None:
            try:
                fields.checksum = normalize_checksum(value)
            except ValueError as exc:
                raise MalformedBody(f"checksum field: {exc}") from None
        elif name == "role" and fields.role is None:
            try:
                fields.role = FileRole(value)
            except ValueError:
                raise MalformedBody(f"unknown role {value!r}") from None

    def on_end() -> None:
        nonlocal ended
        ended = True

    try:
        parser = MultipartParser(
            boundary,
            {
                "on_part_begin": on_part_begin,
                "on_header_field": on_header_field,
                "on_header_value": on_header_value,
                "on_header_end": on_header_end,
                "on_headers_finished": on_headers_finished,
                "on_part_data": on_part_data,
                "on_part_end": on_part_end,
                "on_end": on_end,
            },
        )
    except FormParserError as exc:  # what multipart_boundary lets through, the parser may still refuse
        raise MalformedBody(f"malformed multipart body: {exc}") from None
    async for chunk in body:
        try:
            parser.write(chunk)
        except MultipartParseError as exc:
            raise MalformedBody(f"malformed multipart body: {exc}") from exc
        if out:
            yield b"".join(out)
            out.clear()
    try:
        parser.finalize()
    except MultipartParseError as exc:
        raise MalformedBody(f"malformed multipart body: {exc}") from exc
    if out:
        yield b"".join(out)
    if not seen_file:
        raise MalformedBody("multipart body has no file part")
    if not file_done or not ended:
        raise MalformedBody("multipart body is truncated")
