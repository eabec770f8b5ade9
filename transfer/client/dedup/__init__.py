"""Client side of chunked deduplication: send only the chunks the service lacks, fetch only the chunks a cache lacks.

Upload (:func:`upload_deduplicated`): the file is cut with FastCDC using the service's parameters (``GET
/v1/chunked``), each chunk hashed (SHA-256); the manifest goes to ``POST /v1/chunked``; the service answers which
chunks this key lacks; those are sent as runs of consecutive chunks (one PUT per run, ``connections`` in parallel);
``complete`` publishes once the service has verified the whole SHA-256. A completion that finds chunks missing (a
sweep removed one meanwhile) sends them and completes again. :func:`upload_probed` (the default of ``transfer upload``
and :meth:`AsyncTransferClient.upload_dedup`) asks first, of the file's first chunks only, whether the key holds
any: a new file then goes whole at once by an ordinary upload, and its manifest follows to be indexed.

Resolve with a cache (:class:`ChunkCache`, :func:`resolve_with_cache`): chunks of what was resolved are kept in a
directory, one file per SHA-256. For a descriptor whose manifest the service gives (``/v1/files/{id}/manifest``
with the descriptor's own signature), the chunks found in the cache are copied, only the ranges of the others are
fetched, and the whole file is SHA-256 verified against the descriptor as any resolve; only then is it renamed to
its destination and its new chunks kept.

The modules: ``cutting`` (a file into chunks, chunks into runs), ``upload``, ``cache`` (ChunkCache) and ``resolve``.
"""

from transfer.client.dedup.cache import ChunkCache
from transfer.client.dedup.cutting import PROBE_BYTES, cut_file, cut_head
from transfer.client.dedup.resolve import CachedResolve, fetch_manifest, manifest_url, resolve_with_cache
from transfer.client.dedup.upload import (
    AUTO_DEDUP_THRESHOLD,
    WHOLE_FRACTION,
    DedupOutcome,
    offer,
    upload_deduplicated,
    upload_probed,
)

__all__ = [
    "AUTO_DEDUP_THRESHOLD",
    "PROBE_BYTES",
    "WHOLE_FRACTION",
    "CachedResolve",
    "ChunkCache",
    "DedupOutcome",
    "cut_file",
    "cut_head",
    "fetch_manifest",
    "manifest_url",
    "offer",
    "resolve_with_cache",
    "upload_deduplicated",
    "upload_probed",
]
