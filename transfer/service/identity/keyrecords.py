"""API keys as records, managed at run time (``transfer keys create/list/revoke/rotate``, ``/v1/admin/keys``).

Two kinds of small JSON records in the storage backend, changed with its compare-and-set (the record store):

    identity/owners/<sha256(name)[:40]>   one per key name, the authority: scopes, TP identities, limits, who made
                                          it and when, and its live keys ``{"<key id>": {"sha256", "created_at",
                                          "created_by", "expires_at"}}`` (a rotation holds two for its grace)
    identity/keys/<sha256(token)>         one per token: ``{"name", "key_id"}``, so that a request finds its name
                                          from the hash of what it presented, without a listing

A request's key is found by the token's hash: its key record names the owner record, and the key counts only while
the owner record lists that hash (revocation is one compare-and-set write of the owner record; the key record is
deleted after it, as a cleanup). Each process keeps what it read for ``TRANSFER_KEY_CACHE_SECONDS`` (5 by default):
a key created on one replica works on another at once (nothing cached refuses it... unless the same token was
tried there in the last seconds), a revoked one is refused everywhere within that bound. The cache is bounded in
entries; a token that is no key costs at most one record read per bound, and one for each new random token.

The token itself is never stored, nor logged: only its SHA-256 (as for ``TRANSFER_API_KEYS``), and its id, the
first 12 hex digits of that hash, by which it is listed and revoked.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transfer.core.auth import ApiKey, new_token, parse_keys, token_hash
from transfer.errors import InvalidRequest, KeyExpired, KeyNameTaken, NotFound, TransferError
from transfer.service.accounting.recordstore import RecordStore

OWNERS = "identity/owners/"
KEYS = "identity/keys/"
CACHE_ENTRIES = 10_000  # per cache: tokens seen, names seen (an entry is a few hundred bytes)
MAX_NAME = 200
KEY_ID_LENGTH = 12


def owner_key(name: str) -> str:
    """The owner record of key name ``name`` (hashed: names are free text)."""
    return OWNERS + hashlib.sha256(name.encode("utf-8")).hexdigest()[:40]


def key_record(digest: str) -> str:
    """The key record of the token whose SHA-256 is ``digest``."""
    return KEYS + digest


def key_id_of(digest: str) -> str:
    """The public id of a key: a prefix of its token's hash (it says nothing of the token)."""
    return digest[:KEY_ID_LENGTH]


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key just made: the token (shown once, never stored) and its record as listed."""

    token: str
    entry: dict[str, Any]


def check_name(name: str) -> str:
    """A key name as accepted: 1-200 printable characters, not starting with a space."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or not name.isprintable() or name != name.strip():
        raise InvalidRequest(f"a key name is 1 to {MAX_NAME} printable characters without surrounding spaces")
    return name


def check_spec(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The key's scopes, TP identities and limits, validated by the one parser of keys (InvalidRequest)."""
    names = ("scopes", "tp_identities", "max_bytes", "default_file_ttl", "max_file_ttl")
    fields: dict[str, Any] = {k: spec[k] for k in names if k in spec}
    try:
        parse_keys({name: {"sha256": "0" * 64, **fields}})
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return {"scopes": sorted(set(fields.get("scopes", []))), "tp_identities": list(fields.get("tp_identities", []))} | {
        k: fields.get(k) for k in ("max_bytes", "default_file_ttl", "max_file_ttl")
    }


def _owner_api_key(doc: dict[str, Any], digest: str, expires_at: float | None) -> ApiKey:
    spec = {k: doc.get(k) for k in ("scopes", "tp_identities", "max_bytes", "default_file_ttl", "max_file_ttl")}
    spec = {k: v for k, v in spec.items() if v is not None}
    # the one parser of keys checks the record's fields (a name's limits are read without a token: no hash)
    key = parse_keys({doc["name"]: {"sha256": digest or "0" * 64, **spec}})[doc["name"]]
    return ApiKey(
        key.name,
        digest,
        key.scopes,
        key.tp_identities,
        key.max_bytes,
        key.default_file_ttl,
        key.max_file_ttl,
        via="record",
        expires_at=expires_at,
    )


class KeyRecords:
    """Run-time API keys over one record store, with the per-process cache that bounds how late a revocation is
    seen (``ttl`` seconds)."""

    def __init__(
        self,
        records: RecordStore,
        *,
        ttl: float,
        reserved: Callable[[str], bool] = lambda name: False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.records = records
        self.storage = records.storage
        self.ttl = ttl
        self.reserved = reserved  # names that are not free (the keys of TRANSFER_API_KEYS)
        self.clock = clock
        self._by_hash: OrderedDict[str, tuple[float, ApiKey | None]] = OrderedDict()
        self._by_name: OrderedDict[str, tuple[float, ApiKey | None]] = OrderedDict()
        self._reading: dict[str, asyncio.Future[ApiKey | None]] = {}
        self.reads = 0  # record reads on the request path (what the cache saves; the tests and benchmark read it)

    # -- the request path ----------------------------------------------------------------------------------------

    async def lookup(self, digest: str) -> ApiKey | None:
        """The key whose token hashes to ``digest`` (None: no such key, or revoked); KeyExpired past its expiry.
        At most one read of each record per ``ttl`` and process, shared by concurrent callers."""
        now = time.monotonic()
        cached = self._by_hash.get(digest)
        if cached is not None and now - cached[0] < self.ttl:
            key = cached[1]
        else:
            pending = self._reading.get(digest)
            if pending is None:
                pending = asyncio.ensure_future(self._read_key(digest))
                self._reading[digest] = pending
                pending.add_done_callback(lambda _: self._reading.pop(digest, None))
            key = await asyncio.shield(pending)
        if key is not None and key.expires_at is not None and self.clock() >= key.expires_at:
            raise KeyExpired(
                f"the key {key_id_of(digest)} of {key.name!r} expired; an admin makes a new one (transfer keys rotate)",
                headers={"www-authenticate": 'Bearer realm="transfer", error="invalid_token"'},
            )
        return key

    async def _read_key(self, digest: str) -> ApiKey | None:
        self.reads += 1
        key: ApiKey | None = None
        try:
            pointer, _ = await self.records.read(key_record(digest))
            name = pointer.get("name") if isinstance(pointer, dict) else None
            if isinstance(name, str):
                self.reads += 1
                doc, _ = await self.records.read(owner_key(name))
                live = doc.get("keys", {}).get(key_id_of(digest)) if isinstance(doc, dict) else None
                if isinstance(live, dict) and live.get("sha256") == digest and doc.get("name") == name:
                    key = _owner_api_key(doc, digest, live.get("expires_at"))
                    self._remember(self._by_name, name, key)
        except NotFound:
            key = None
        self._remember(self._by_hash, digest, key)
        return key

    def _remember(self, cache: OrderedDict[str, tuple[float, ApiKey | None]], k: str, v: ApiKey | None) -> None:
        cache[k] = (time.monotonic(), v)
        cache.move_to_end(k)
        while len(cache) > CACHE_ENTRIES:
            cache.popitem(last=False)

    async def owner(self, name: str) -> ApiKey | None:
        """The scopes and limits of key name ``name`` (None: no key record of that name), cached like lookups."""
        cached = self._by_name.get(name)
        if cached is not None and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        try:
            doc, _ = await self.records.read(owner_key(name))
        except NotFound:
            doc = None
        key = _owner_api_key(doc, "", None) if isinstance(doc, dict) and doc.get("name") == name else None
        self._remember(self._by_name, name, key)
        return key

    def forget(self, *digests: str, name: str | None = None) -> None:
        """Drop what this process cached of ``digests`` and ``name`` (after it changed them itself)."""
        for digest in digests:
            self._by_hash.pop(digest, None)
        if name is not None:
            self._by_name.pop(name, None)

    # -- administration (admin scope; never on a request path of another caller) -------------------------------

    def _entry(self, doc: dict[str, Any]) -> dict[str, Any]:
        """An owner record as listed: everything but the hashes."""
        keys = [
            {"key_id": kid, **{k: v for k, v in live.items() if k != "sha256"}}
            for kid, live in sorted(doc.get("keys", {}).items(), key=lambda item: item[1].get("created_at", 0))
        ]
        shown = ("name", "scopes", "tp_identities", "max_bytes", "default_file_ttl", "max_file_ttl")
        return {k: doc.get(k) for k in shown} | {
            "created_at": doc.get("created_at"),
            "created_by": doc.get("created_by"),
            "keys": keys,
        }

    def _new_live(self, created_by: str | None, expires_in: int | None) -> tuple[str, str, dict[str, Any]]:
        if expires_in is not None and (type(expires_in) is not int or expires_in <= 0):
            raise InvalidRequest("expires_in must be a positive whole number of seconds")
        token = new_token()
        digest = token_hash(token)
        now = self.clock()
        live = {
            "sha256": digest,
            "created_at": round(now, 3),
            "created_by": created_by,
            "expires_at": None if expires_in is None else round(now + expires_in, 3),
        }
        return token, digest, live

    async def create(
        self, name: str, spec: dict[str, Any], *, created_by: str | None, expires_in: int | None = None
    ) -> NewKey:
        """A new key named ``name`` (KeyNameTaken when the name has a live key, or is a key of the environment):
        its owner record first, then its key record (a crash between them leaves a key that no request finds)."""
        check_name(name)
        if self.reserved(name):
            raise KeyNameTaken(f"{name!r} is a key of TRANSFER_API_KEYS (read-only): choose another name")
        fields = check_spec(name, spec)
        token, digest, live = self._new_live(created_by, expires_in)
        now = self.clock()

        def change(doc: dict[str, Any]) -> dict[str, Any]:
            if doc.get("keys"):
                raise KeyNameTaken(f"a key named {name!r} exists: rotate it, or revoke it first")
            kid = key_id_of(digest)
            return {"name": name, **fields, "created_at": round(now, 3), "created_by": created_by, "keys": {kid: live}}

        doc = await self.records.update(owner_key(name), _as_doc, change, _as_doc, absent={})
        await self.records.create(key_record(digest), {"name": name, "key_id": key_id_of(digest)})
        self.forget(digest, name=name)
        return NewKey(token, self._entry(doc) | {"key_id": key_id_of(digest)})

    async def rotate(
        self, name: str, *, created_by: str | None, grace: int = 0, expires_in: int | None = None
    ) -> NewKey:
        """A new key for ``name`` with the same scopes and limits; its other keys stop working after ``grace``
        seconds (0: at once). NotFound when the name has no live key."""
        check_name(name)
        if grace < 0:
            raise InvalidRequest("grace must be 0 or more seconds")
        token, digest, live = self._new_live(created_by, expires_in)
        until = round(self.clock() + grace, 3)
        gone: list[str] = []

        def change(doc: dict[str, Any]) -> dict[str, Any]:
            if not doc.get("keys"):
                raise NotFound(f"no key named {name!r}")
            keys: dict[str, Any] = {}
            gone.clear()
            for kid, old in doc["keys"].items():
                if grace == 0:
                    gone.append(old["sha256"])
                    continue
                expiry = old.get("expires_at")
                keys[kid] = old | {"expires_at": until if expiry is None else min(expiry, until)}
            keys[key_id_of(digest)] = live
            return doc | {"keys": keys}

        doc = await self.records.update(owner_key(name), _as_doc, change, _as_doc)
        await self.records.create(key_record(digest), {"name": name, "key_id": key_id_of(digest)})
        await self._drop_key_records(gone)
        self.forget(digest, *gone, name=name)
        return NewKey(token, self._entry(doc) | {"key_id": key_id_of(digest)})

    async def revoke(self, name: str, key_id: str | None = None) -> list[str]:
        """Revoke every key of ``name``, or the one with ``key_id``: refused on this replica at once, on every other
        within the cache bound. The ids revoked (NotFound when there was none)."""
        check_name(name)
        gone: dict[str, str] = {}

        def change(doc: dict[str, Any]) -> dict[str, Any]:
            keys = dict(doc.get("keys", {}))
            gone.clear()
            for kid in list(keys):
                if key_id is None or kid == key_id:
                    gone[kid] = keys.pop(kid)["sha256"]
            if not gone:
                raise NotFound(f"no key {key_id!r} of {name!r}" if key_id else f"no key named {name!r}")
            return doc | {"keys": keys}

        await self.records.update(owner_key(name), _as_doc, change, _as_doc)
        await self._drop_key_records(list(gone.values()))
        self.forget(*gone.values(), name=name)
        return sorted(gone)

    async def _drop_key_records(self, digests: list[str]) -> None:
        for digest in digests:
            try:
                await self.storage.delete(key_record(digest))
            except Exception:  # noqa: BLE001 - a cleanup: the owner record no longer lists it, so it admits nobody
                pass

    async def list(self) -> list[dict[str, Any]]:
        """Every key name with its live keys (ids, expiry, who made them), by name: an admin listing."""
        out = []
        async for info in self.storage.list(OWNERS):
            try:
                doc, _ = await self.records.read(info.key)
            except (NotFound, TransferError):
                continue
            if isinstance(doc, dict) and doc.get("keys"):
                out.append(self._entry(doc))
        return sorted(out, key=lambda e: str(e["name"]))


def _as_doc(raw: Any) -> dict[str, Any]:
    return dict(raw) if isinstance(raw, dict) else {}
