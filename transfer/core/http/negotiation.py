"""Proactive content negotiation on ``Accept`` (RFC 9110 §12.5.1), for the one place that offers two
representations at one URL: a tus upload URL serves the uploaded bytes, or the file's descriptor to a client that
asks for JSON by name."""

from __future__ import annotations

MAX_ACCEPT_MEMBERS = 64  # a longer list is read no further: a header is not a place to make us loop


def explicitly_accepts(accept: str | None, media_type: str) -> bool:
    """Whether ``accept`` names ``media_type`` itself (not through ``*/*`` or ``type/*``) with a non-zero weight.

    ``Accept: application/json`` or ``application/json, */*;q=0.1`` ask for JSON; ``*/*``, a browser's
    ``text/html,…,*/*;q=0.8`` and a missing field do not. A member with a malformed weight is skipped."""
    if not accept:
        return False
    wanted = media_type.lower()
    for member in accept.split(",")[:MAX_ACCEPT_MEMBERS]:
        name, *params = (piece.strip() for piece in member.split(";"))
        if name.lower() != wanted:
            continue
        weight = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":  # RFC 9110 §12.4.2: 0 to 1, at most three decimals
                try:
                    weight = float(value.strip()) if len(value.strip()) <= 5 else -1.0
                except ValueError:
                    weight = -1.0
        if 0 < weight <= 1:
            return True
    return False


def preference(prefer: str | None, name: str) -> str | None:
    """The value of preference ``name`` (lowercase) in a ``Prefer`` field (RFC 7240 §2: comma-separated
    ``token [= word] *(; parameter)``): ``""`` when it has none, None when it is absent. Only the first instance
    counts (§2); parameters are ignored, as any the server does not understand, and so are members past
    :data:`MAX_ACCEPT_MEMBERS`."""
    if not prefer:
        return None
    for member in prefer.split(",")[:MAX_ACCEPT_MEMBERS]:
        token, _, value = member.split(";", 1)[0].partition("=")
        if token.strip().lower() == name:
            return value.strip().strip('"')
    return None
