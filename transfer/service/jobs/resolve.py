"""Resolving descriptors on the server (the MCP ``resolve`` tool): fetch, verify (SHA-256, size) and decode, with
the service's limits. The resolver core is the client's (one implementation of ranges, resume and verification);
front doors reach it only through this service, so none of them imports the client package."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from transfer.client.resolver import ResolveOptions, Resolver
from transfer.core.model.content import FileContent, TransferMode
from transfer.errors import InvalidRequest
from transfer.service.jobs.imports import ImportService
from transfer.settings import Settings


class ResolveService:
    """Resolves descriptors on the service's side (the MCP ``resolve`` tool): a resolver per operation, guarded
    against SSRF when it fetches for a remote caller."""

    def __init__(self, settings: Settings, imports: ImportService) -> None:
        self.settings = settings
        self.imports = imports

    @asynccontextmanager
    async def resolver(self, *, guarded: bool) -> AsyncIterator[Resolver]:
        """A resolver for one operation. ``guarded``: the service fetches on behalf of a remote caller, so every
        connection (and redirect) is checked against the import destination policy (no private addresses)."""
        http = (
            self.imports.http_client()
            if guarded
            else httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=True)
        )
        async with http:
            yield Resolver(http, ResolveOptions(max_decoded_size=self.settings.max_upload_size))

    def check_small(self, descriptor: object) -> None:
        """Content resolved into a reply (no path) must be within the inline threshold: InvalidRequest otherwise
        (before any byte is fetched, when the descriptor says its size)."""
        threshold = self.settings.inline_threshold
        if isinstance(descriptor, FileContent) and descriptor.type is not TransferMode.INLINE:
            size = descriptor.size
            if size is None or size > threshold:
                raise InvalidRequest(
                    f"content of {size if size is not None else 'unknown'} bytes is above the inline threshold "
                    f"({threshold}); give path"
                )
