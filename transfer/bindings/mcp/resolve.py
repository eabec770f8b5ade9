"""The resolve tool: download, verify and decode content to a confined local path (placed without replacing
what is there unless asked), or small content into the result."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from transfer.bindings.mcp.context import DescriptorArgument, McpContext
from transfer.core.auth import Scope as KeyScope
from transfer.core.model.content import ContentBundle, FileContent, load_descriptor
from transfer.core.model.content import TextContent as SynapseText
from transfer.core.model.mime import is_textual
from transfer.core.numerals import JsonBool
from transfer.errors import Conflict, InvalidRequest


class ResolveTools(McpContext):
    """resolve, and resolve_inline where the tools may not touch local paths."""

    async def resolve(
        self,
        descriptor: DescriptorArgument,
        path: Annotated[
            str | None, Field(description="where to write (a directory for a bundle); omit for small content")
        ] = None,
        overwrite: Annotated[JsonBool, Field(description="replace existing files at path")] = False,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Download, verify (SHA-256, size) and decode content to a local path. Without a path, content within the
        inline threshold comes back in the result (text as text, other bytes as base64). Writing to a path needs
        the upload scope and never replaces an existing file unless ``overwrite`` is true."""
        grant = self.grant(ctx)
        grant(KeyScope.READ)
        if path is not None:
            grant(KeyScope.UPLOAD)  # it writes to the server's disk
        parsed = load_descriptor(descriptor, inline_threshold=self.settings.inline_threshold)
        async with self.services.resolve.resolver(guarded=self.http) as resolver:
            if isinstance(parsed, ContentBundle):
                if path is None:
                    raise InvalidRequest("a bundle resolves into a directory: give path")
                target = self.path(path, must_exist=False)
                target.mkdir(parents=True, exist_ok=True)
                with _staging(target) as staging:
                    resolved = await resolver.bundle_to_dir(parsed, staging)
                    placed = _place_all([(p, target / p.name) for p in resolved], overwrite=overwrite)
                return {"directory": str(target), "files": [str(p) for p in placed]}
            if path is None:
                self.services.resolve.check_small(parsed)
                data = await resolver.to_bytes(parsed, max_size=self.settings.inline_threshold)
                media = parsed.content_type if isinstance(parsed, FileContent) else "text/plain"
                if isinstance(parsed, SynapseText) or is_textual(media or ""):
                    try:
                        return {"content": data.decode("utf-8"), "content_encoding": "utf-8", "size": len(data)}
                    except UnicodeDecodeError:
                        pass
                return {"content": base64.b64encode(data).decode(), "content_encoding": "base64", "size": len(data)}
            dest = self.path(path, must_exist=False)
            if dest.exists() and not overwrite:  # early answer; _place_all checks again when it places the file
                raise Conflict(f"{path!r} exists; pass overwrite=true to replace it")
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _staging(dest.parent) as staging:
                resolved_file = await resolver.to_path(parsed, staging / dest.name)
                (written,) = _place_all([(resolved_file, dest)], overwrite=overwrite)
            out: dict[str, Any] = {"path": str(written), "size": written.stat().st_size}
            if isinstance(parsed, FileContent) and parsed.checksum:
                out["checksum"] = parsed.checksum
            return out

    async def resolve_inline(self, descriptor: DescriptorArgument, ctx: Context | None = None) -> dict[str, Any]:
        """``resolve`` where tools may not touch local paths (HTTP without an allowed directory): small content
        only, returned in the result."""
        return await self.resolve(descriptor, None, False, ctx)


@contextmanager
def _staging(directory: Path) -> Iterator[Path]:
    """A private directory beside the destination (same file system, so placing is a link, not a copy); removed
    with whatever is left in it."""
    staging = directory / f".transfer-{secrets.token_hex(6)}"
    staging.mkdir()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _place_all(moves: list[tuple[Path, Path]], *, overwrite: bool) -> list[Path]:
    """Move verified files to their destinations. Without ``overwrite`` every destination must be free: checked
    for all first, then each placed with link(2), which fails rather than replace a file that appeared meanwhile
    (Conflict; what this call already placed is taken back)."""
    if not overwrite:
        taken = [str(dest) for _, dest in moves if dest.exists()]
        if taken:
            raise Conflict(f"{', '.join(taken)[:200]} exists; pass overwrite=true to replace", existing=taken[:20])
    placed: list[Path] = []
    try:
        for source, dest in moves:
            if overwrite:
                os.replace(source, dest)
            else:
                os.link(source, dest)
            placed.append(dest)
    except FileExistsError as exc:
        for dest in placed:
            dest.unlink(missing_ok=True)
        raise Conflict(f"{exc.filename} appeared while resolving; nothing was replaced") from None
    return placed
