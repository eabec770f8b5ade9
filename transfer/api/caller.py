"""Who a request acts as: the grant its route's scope check left on the request (see ``needs`` in the app)."""

from __future__ import annotations

from fastapi import Request

from transfer.core.auth import Grant


def caller_of(request: Request) -> Grant:
    """The request's grant, set by the route's scope dependency. A route without one has no caller: a
    programming error, not a request to serve as anyone."""
    grant = getattr(request.state, "grant", None)
    if not isinstance(grant, Grant):
        raise RuntimeError(f"route {request.url.path} has no scope dependency: nobody to act as")
    return grant
