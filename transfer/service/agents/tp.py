"""TP resource messages (seed 002) over the one service layer: every binding (REST, native HTTP, WebSocket, A2A
JSON-RPC, MCP, prompt embedding) hands a validated :class:`Envelope` to :meth:`TPService.handle`.

``resource_mount``   offer a file; ``payload`` is one of
                     ``{"resource_id": "f_…"}``            a stored file: a fresh descriptor
                     ``{"resource": FileContent}``          inline: stored; url of this service: described afresh;
                                                            a foreign url: imported in the background (202, job)
                     ``{"upload": {name, content_type, size, chunk_size?, checksum?}}``
                                                            open a chunked session (streaming descriptor)
                     optional ``ttl``, ``download_method``  for the descriptor
                     -> 200 reply ``{"status": "mounted"|"open", "resource_id", "resource": FileContent, …}``,
                        or 202 ``{"correlation_id"}`` when imported (progress: ``/v1/jobs/{id}/events`` and a
                        ``resource_notify`` to the sender when it ends)
``resource_unmount`` ``{"resource_id"}``: a file is deleted (every URL to it stops working), a session aborted
``resource_notify``  relayed: kept in the mailbox of ``receiver`` (``tp_poll_messages``) and pushed to WebSocket
                     subscribers of ``payload.resource_id`` and of the receiver; the relayed bytes are the
                     sender's with only ``trace_info`` advanced -> 202 ``{"correlation_id": message_id}``

Mailboxes live in the storage backend (``tp/mailbox/<receiver hash>/…``), so any replica can deliver them.

A message waiting in a mailbox is bytes stored, and they are charged to the key that sent it (the receiver may have
no key here, and a key must not be able to fill a quota that is not its own): its length is charged to the sender's
usage before it is kept (413 ``quota_exceeded`` when it does not fit; a service announcement of an import's end is
charged to the key that started the import), and refunded exactly once when it goes, delivered by a poll or
removed by the sweep past its lifetime: the taker claims it in the payer's usage record by compare-and-set
(:meth:`UsageLedger.claim_removal`), so of several pollers and sweeps on several replicas only one delivers it and
refunds it. The payer and the charge travel in the message's object metadata.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from storage.base import Storage
from storage.errors import ObjectNotFound, StorageError
from transfer.core.agents.tp import (
    RESOURCE_TYPES,
    Binding,
    Envelope,
    forward,
    make_envelope,
    validate_envelope,
)
from transfer.core.auth import Grant, Scope
from transfer.core.model.content import DownloadMethod, FileContent, TransferMode
from transfer.core.uploads.state import FileIntent
from transfer.errors import (
    BridgeFailed,
    InvalidEnvelope,
    MailboxFull,
    NotFound,
    QuotaExceeded,
    TransferError,
    UnsupportedMessageType,
    storage_errors_translated,
)
from transfer.service.agents.subscriptions import SubscriptionLedger
from transfer.service.files.records import FileRecord, is_file_id
from transfer.service.files.service import FileService
from transfer.service.jobs.imports import ImportService
from transfer.service.jobs.progress import Job
from transfer.service.uploads.session_views import session_document
from transfer.service.uploads.sessions import SessionService, is_session_id

log = logging.getLogger("transfer.tp")

MAILBOX = "tp/mailbox/"
LEDGER_PREFIX = "tp:"  # a waiting message's id in its payer's usage record: ``tp:<receiver hash>/<name>``


def message_ledger_id(key: str) -> str:
    """The id under which the message stored at mailbox ``key`` is charged."""
    return LEDGER_PREFIX + key[len(MAILBOX) :]


def _payer_metadata(owner: str | None, nbytes: int) -> dict[str, str]:
    """Object metadata naming who pays for a message (percent-encoded: key names are free text, S3 metadata is
    ASCII) and what was charged."""
    return {"charged": str(nbytes), **({"payer": quote(owner, safe="")} if owner is not None else {})}


def _payer(metadata: Mapping[str, str]) -> tuple[bool, str | None, int]:
    """``(charged?, payer, bytes)`` from a message's metadata (a message kept before messages were charged: not)."""
    charged = metadata.get("charged")
    if charged is None or not charged.isdigit():
        return False, None, 0
    payer = metadata.get("payer")
    return True, None if payer is None else unquote(payer), int(charged)


@dataclass(slots=True)
class TPOutcome:
    """200 with a reply envelope, or 202 with a correlation id."""

    status: int
    reply: Envelope | None = None
    correlation_id: str | None = None

    def body(self) -> dict[str, Any]:
        """The HTTP body of the outcome: the reply envelope, else the correlation id."""
        if self.reply is not None:
            return self.reply.doc
        return {"correlation_id": self.correlation_id}


@dataclass(slots=True)
class Subscription:
    """What a ``resource_notify`` with ``payload.subscribe`` asks for, as the service allows it: the topics to
    hear, the jobs whose events are pushed, the ids accepted (for the acknowledgement) and those refused, each
    with its error (said per id; the others go on)."""

    topics: list[str] = field(default_factory=list)
    follow: list[str] = field(default_factory=list)
    subscribed: list[str] = field(default_factory=list)
    refused: list[tuple[str, TransferError]] = field(default_factory=list)


MAX_SUBSCRIBE = 100  # resource ids one subscription may name; more are ignored


def receiver_topic(receiver: Any) -> str:
    """The topic on which messages for ``receiver`` are pushed (WebSocket, long poll)."""
    return f"receiver:{identity_key(receiver)}"


def identity_text(identity: Any) -> str:
    """A TP identity (a string, or an object) as one string: itself, or its canonical JSON."""
    return identity if isinstance(identity, str) else json.dumps(identity, sort_keys=True, separators=(",", ":"))


def identity_key(identity: Any) -> str:
    """A stable mailbox / topic name for a sender or receiver (a string or an object)."""
    return hashlib.sha256(identity_text(identity).encode("utf-8")).hexdigest()[:32]


class TPService:
    """The TP transport bindings' service: resource mounts (uploads and imports), message envelopes and their
    mailboxes, each owned by the key that made it."""

    def __init__(
        self,
        files: FileService,
        sessions: SessionService,
        imports: ImportService,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.files = files
        self.sessions = sessions
        self.imports = imports
        self.settings = files.settings
        self.clock = clock
        # each topic's subscribers: a long poll's queue, or a WebSocket connection's delivery into its outbox
        self._topics: dict[str, set[asyncio.Queue[bytes] | Callable[[bytes], None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.ledger = SubscriptionLedger.from_settings(self.settings)  # WebSocket subscribers across connections

    @property
    def storage(self) -> Storage:
        """The storage backend (the file service's)."""
        return self.files.storage

    # -- dispatch -----------------------------------------------------------------------------------------------

    async def handle(self, envelope: Envelope, binding: Binding, authorize: Grant, base_url: str) -> TPOutcome:
        """Run one resource message; TransferErrors leave for the binding to render as TPError."""
        kind = envelope.message_type
        if kind not in RESOURCE_TYPES:
            raise UnsupportedMessageType(
                f"this service handles {', '.join(RESOURCE_TYPES)}; not {kind!r}", supported=list(RESOURCE_TYPES)
            )
        if kind == "resource_mount":
            return await self._mount(envelope, binding, authorize, base_url)
        if kind == "resource_unmount":
            authorize(Scope.ADMIN)
            self._require_sender(envelope, authorize)
            return await self._unmount(envelope, binding, authorize)
        authorize(Scope.UPLOAD)
        self._require_sender(envelope, authorize)
        return await self._notify(envelope, binding, authorize)

    @staticmethod
    def _require_sender(envelope: Envelope, authorize: Grant) -> None:
        """A key speaks only as the identities it owns (its ``tp_identities``; admin: any): 403 otherwise. Checked
        after the scope, so a key lacking the scope hears about that first."""
        if envelope.sender is not None:
            authorize.require_identity(identity_text(envelope.sender), speaking=True)

    def as_envelope(self, outcome: TPOutcome, request: Envelope, binding: Binding) -> Envelope:
        """The outcome as one envelope, for bindings that answer only with envelopes (WebSocket, prompt): the
        reply, or an acknowledgement carrying the correlation id."""
        accepted = {"status": "accepted", "correlation_id": outcome.correlation_id}
        return outcome.reply or self._reply(request, binding, accepted)

    def _reply(self, request: Envelope, binding: Binding, payload: dict[str, Any]) -> Envelope:
        return make_envelope(
            request.message_type,
            {**payload, "in_reply_to": request.message_id},
            sender=self.settings.tp_identity,
            receiver=request.sender,
            contract_ref=request.contract_ref,
            binding=binding,
            timestamp=self.clock(),
            in_reply_to=request.message_id,
        )

    @staticmethod
    def _resource_id(payload: dict[str, Any]) -> str:
        rid = payload.get("resource_id")
        if not isinstance(rid, str) or not rid:
            raise InvalidEnvelope("payload.resource_id must be a non-empty string")
        return rid

    # -- mount ---------------------------------------------------------------------------------------------------

    async def _mount(self, envelope: Envelope, binding: Binding, authorize: Grant, base_url: str) -> TPOutcome:
        payload = envelope.payload
        ttl = payload.get("ttl")
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0):
            raise InvalidEnvelope("payload.ttl must be a positive integer (seconds)")
        method_name = payload.get("download_method")
        try:
            method = DownloadMethod(method_name) if method_name is not None else None
        except ValueError:
            raise InvalidEnvelope("payload.download_method must be GET, POST or signed_url") from None

        if "resource_id" in payload:
            authorize(Scope.READ)
            self._require_sender(envelope, authorize)
            rid = self._resource_id(payload)
            record = await self.files.record(rid, authorize)  # the caller's own file (any, for admin)
            descriptor = await self.files.describe(record, base_url, download_method=method, ttl=ttl)
            return self._mounted(envelope, binding, rid, descriptor)
        if "upload" in payload:
            authorize(Scope.UPLOAD)
            self._require_sender(envelope, authorize)
            spec = payload["upload"]
            if not isinstance(spec, dict):
                raise InvalidEnvelope("payload.upload must be an object")
            session = await self.sessions.create(
                intent=FileIntent(name=_opt_str(spec, "name"), content_type=_opt_str(spec, "content_type")),
                size=_opt_int(spec, "size"),
                chunk_size=_opt_int(spec, "chunk_size"),
                checksum=_opt_str(spec, "checksum"),
                ttl=ttl,
                owner=authorize.owner,
            )
            doc = session_document(self.files, session, base_url)
            reply = {"status": "open", "resource_id": session.id, "upload": doc}
            if "descriptor" in doc:
                reply["resource"] = doc["descriptor"]
            return TPOutcome(200, self._reply(envelope, binding, reply))
        if "resource" in payload:
            authorize(Scope.UPLOAD)
            self._require_sender(envelope, authorize)
            descriptor = self.imports.parse(payload["resource"], self.settings.inline_threshold)
            own = (descriptor.metadata or {}).get("file_id")
            if descriptor.type is TransferMode.URL and isinstance(own, str) and is_file_id(own):
                known: FileRecord | None
                try:
                    known = await self.files.record(own, authorize)
                except NotFound:
                    known = None
                if known is not None and "sha256:" + known.sha256 == descriptor.checksum:
                    fresh = await self.files.describe(known, base_url, download_method=method, ttl=ttl)
                    return self._mounted(envelope, binding, own, fresh)
            if descriptor.type is TransferMode.INLINE:
                record = await self.imports.fetch_and_store(descriptor, authorize)
                fresh = await self.files.describe(record, base_url, download_method=method, ttl=ttl)
                return self._mounted(envelope, binding, record.id, fresh)
            job = await self.imports.start(descriptor, base_url, authorize)
            self._spawn(self._announce_when_done(job, envelope, binding))
            return TPOutcome(202, correlation_id=job.id)
        raise InvalidEnvelope("resource_mount payload needs resource_id, resource or upload")

    def _mounted(self, envelope: Envelope, binding: Binding, rid: str, descriptor: FileContent) -> TPOutcome:
        payload = {"status": "mounted", "resource_id": rid, "resource": descriptor.to_json()}
        return TPOutcome(200, self._reply(envelope, binding, payload))

    async def _announce_when_done(self, job: Job, request: Envelope, binding: Binding) -> None:
        """When a background import ends, tell the sender (mailbox + live subscribers) with a resource_notify."""
        async for event in job.follow():
            if event is None or event.kind not in ("result", "error"):
                continue
            if event.kind == "result":
                payload = {"event": "available", "resource_id": event.data["file_id"]}
                payload["resource"] = event.data["descriptor"]
            else:
                payload = {"event": "failed", "error": event.data}
            payload["correlation_id"] = job.id
            note = make_envelope(
                "resource_notify",
                {**payload, "in_reply_to": request.message_id},
                sender=self.settings.tp_identity,
                receiver=request.sender,
                contract_ref=request.contract_ref,
                binding=binding,
                timestamp=self.clock(),
                in_reply_to=request.message_id,
            )
            if request.sender is not None:
                try:
                    await self.deliver(request.sender, note.raw, payer=job.owner)
                except TransferError as exc:  # the mailbox is full or the key's quota used up: live listeners hear it
                    log.warning("the end of import %s is not kept for its sender: %s", job.id, exc.message)
                    self.publish(receiver_topic(request.sender), note.raw)
            self.publish(f"job:{job.id}", note.raw)
            return

    # -- unmount -------------------------------------------------------------------------------------------------

    async def _unmount(self, envelope: Envelope, binding: Binding, authorize: Grant) -> TPOutcome:
        rid = self._resource_id(envelope.payload)
        if is_session_id(rid):
            await self.sessions.abort(rid, authorize)
        else:
            await self.files.delete(rid, authorize)
        return TPOutcome(200, self._reply(envelope, binding, {"status": "unmounted", "resource_id": rid}))

    # -- notify (relay) ------------------------------------------------------------------------------------------

    async def _notify(self, envelope: Envelope, binding: Binding, authorize: Grant) -> TPOutcome:
        relayed = forward(envelope, binding)  # TP-TRA001 when it would be a sixth hop
        rid = envelope.payload.get("resource_id")
        if envelope.receiver is None and not isinstance(rid, str):
            raise InvalidEnvelope("resource_notify needs a receiver or payload.resource_id to deliver to")
        if envelope.receiver is not None:
            try:
                await self.deliver(envelope.receiver, relayed, payer=authorize.owner)
            except (MailboxFull, QuotaExceeded):
                raise  # not a bridge failure: the receiver has this many waiting, or the sender no room
            except TransferError as exc:  # §9.8: a bridge that cannot pass a message on says so with TP-TRA002
                raise BridgeFailed(f"could not relay the message: {exc.message}", cause=exc.code) from exc
        if isinstance(rid, str):
            self.publish(f"resource:{rid}", relayed)
        return TPOutcome(202, correlation_id=envelope.message_id)

    # -- mailboxes (storage) and live topics (this process) --------------------------------------------------------

    async def deliver(self, receiver: Any, raw: bytes, *, payer: str | None) -> None:
        """Keep ``raw`` for ``receiver`` until polled (or ``tp_mailbox_ttl``), and push it to live subscribers.
        MailboxFull when ``tp_mailbox_max_messages`` wait for the receiver already: a receiver that never polls
        holds that many at most, each for at most its lifetime (then the sweep removes it). Its bytes are charged
        to ``payer``'s key while it waits (QuotaExceeded, and nothing kept, when they do not fit)."""
        box = identity_key(receiver)
        now = self.clock()
        key = f"{MAILBOX}{box}/{_stamp(now)}-{hashlib.sha256(raw).hexdigest()[:16]}"
        prefix, limit = f"{MAILBOX}{box}/", self.settings.tp_mailbox_max_messages
        with storage_errors_translated():
            # keys sort by delivery time: the listing starts after the last expired one and stops at the limit,
            # so it costs at most the limit's worth of keys (one LIST on S3) whatever the mailbox held before
            start = f"{prefix}{_stamp(now - self.settings.tp_mailbox_ttl)}"
            waiting = [info async for info in self.storage.list(prefix, start_after=start, limit=limit)]
            if len(waiting) >= limit:
                raise MailboxFull(
                    f"{limit} messages are waiting for this receiver already; it must poll them first",
                    limit=limit,
                    headers={"retry-after": "60"},
                )
        usage = self.files.lifecycle.usage
        # a fresh key (time and digest): nothing else charges it, so no once-only entry is needed
        await usage.charge(payer, message_ledger_id(key), len(raw), files=0)
        try:
            with storage_errors_translated():
                async with self.storage.create(key, size_hint=len(raw)) as writer:
                    await writer.write(raw)
                    expires = {"expires": str(int(now) + self.settings.tp_mailbox_ttl)}
                    await writer.commit({**expires, **_payer_metadata(payer, len(raw))})
        except BaseException:
            await usage.refund(payer, len(raw), files=0, rid=message_ledger_id(key))
            raise
        self.publish(receiver_topic(receiver), raw)

    async def _take(self, key: str, metadata: Mapping[str, str]) -> bool:
        """Remove the message at ``key`` (its ``metadata`` read before): True for the one taker, of however many
        pollers and sweeps race on however many replicas, that removed it; its payer is refunded then, once. The
        take is claimed in the payer's usage record first; the claimer checks the message is still there."""
        charged, payer, nbytes = _payer(metadata)
        if not charged:  # kept before messages were charged: nothing to refund (a race may deliver it twice)
            with storage_errors_translated():
                try:
                    await self.storage.delete(key)
                except ObjectNotFound:
                    return False
            return True
        return await self.files.lifecycle.remove_charged(key, payer, message_ledger_id(key), nbytes, files=0)

    async def charged(self) -> AsyncIterator[tuple[str | None, str, int]]:
        """``(payer, ledger id, bytes)`` of every waiting message that was charged, for ``transfer usage repair``
        (one listing of the mailboxes with metadata: an admin count, never a request path)."""
        with storage_errors_translated():
            async for info in self.storage.list(MAILBOX, metadata=True):
                charged, payer, nbytes = _payer(info.metadata)
                if charged:
                    yield payer, message_ledger_id(info.key), nbytes

    async def poll(self, receiver: Any, grant: Grant, limit: int = 50) -> list[dict[str, Any]]:
        """Take up to ``limit`` waiting messages for ``receiver``, oldest first (each delivered once); the key must
        list the receiver among its ``tp_identities`` (or be admin)."""
        grant(Scope.READ)
        grant.require_identity(identity_text(receiver))
        prefix = f"{MAILBOX}{identity_key(receiver)}/"
        now = self.clock()
        out: list[dict[str, Any]] = []
        after: str | None = None
        # Keys sort by delivery time; read a page of at most what is still wanted, so a poll costs the messages it
        # takes (plus expired ones it clears), however many others are stored.
        while len(out) < limit:
            want = limit - len(out)
            with storage_errors_translated():
                keys = [info.key async for info in self.storage.list(prefix, start_after=after, limit=want)]
            # the page's messages are taken together: their refunds share the usage record's group-commit writes
            taken = await asyncio.gather(*(self._poll_one(key, now) for key in keys))
            out.extend(doc for doc in taken if doc is not None)
            if len(keys) < want:
                break
            after = keys[-1]
        return out

    async def _poll_one(self, key: str, now: float) -> dict[str, Any] | None:
        """The message at ``key`` if this poll delivers it: read, then taken (:meth:`_take`); None when another
        poller took it, or it was past its lifetime (removed all the same)."""
        try:
            async with await self.storage.open(key) as reader:
                metadata = dict(reader.info.metadata)
                expired = float(metadata.get("expires", "0")) < now
                raw = b"" if expired else b"".join([piece async for piece in reader.read()])
        except ObjectNotFound:
            return None  # another poller took it
        except StorageError as exc:
            raise TransferError(f"mailbox read failed: {exc}") from exc
        # delivered only by the one poller whose take removed it (and refunded its sender)
        if await self._take(key, metadata) and not expired:
            return validate_envelope(json.loads(raw), raw).doc
        return None

    async def sweep_mailboxes(self) -> int:
        """Delete every TP message kept past its lifetime, polled or not, and refund its sender; returns how many
        this sweep removed. Lists the mailboxes (a sweep, not a request path); the delivery time is in each key, so
        only the expired messages' metadata is read (who paid)."""
        now = self.clock()
        removed = 0
        with storage_errors_translated():
            expired = [
                info.key
                async for info in self.storage.list(MAILBOX)
                if _delivered_at(info.key) + self.settings.tp_mailbox_ttl < now
            ]
        for key in expired:
            try:
                with storage_errors_translated():
                    try:
                        metadata = (await self.storage.stat(key)).metadata
                    except ObjectNotFound:
                        continue  # polled meanwhile
                if await self._take(key, metadata):
                    removed += 1
            except TransferError as exc:
                log.warning("mailbox sweep could not remove %s; retrying at the next interval: %s", key, exc.message)
        return removed

    async def resource_topics(self, rid: str, caller: Grant) -> list[str]:
        """The topics a subscriber to resource ``rid`` hears: notifies relayed about it and, for an import, its
        outcome. Ids this service made (files, sessions, import jobs) only for a caller who may see them (NotFound
        otherwise, as for an unknown file or session: their notifies carry signed URLs); any other id is a relay
        channel that peers name as they like."""
        if is_file_id(rid):
            await self.files.record(rid, caller)
        elif is_session_id(rid):
            await self.sessions.load(rid, caller)
        elif rid.startswith("j_"):
            try:
                job = self.imports.hub.find(rid)
            except NotFound:  # ended, or at another replica: its 128-bit id is not guessable ahead of time
                job = None
            if job is not None and not caller.sees(job.owner):
                raise NotFound(f"no job {rid!r} in this process")
        return [f"resource:{rid}", f"job:{rid}"]

    async def subscription(self, envelope: Envelope, caller: Grant) -> Subscription | None:
        """The subscription ``envelope`` asks for (None: it is not one, handle it as a message). Subscribing needs
        the read scope; each id is checked as :meth:`resource_topics` does, and the jobs among them are followed."""
        subscribe = envelope.payload.get("subscribe")
        if envelope.message_type != "resource_notify" or subscribe is None:
            return None
        caller(Scope.READ)
        if not isinstance(subscribe, list) or not all(isinstance(s, str) for s in subscribe):
            raise InvalidEnvelope("payload.subscribe must be a list of resource ids")
        out = Subscription()
        for rid in subscribe[:MAX_SUBSCRIBE]:
            try:
                topics = await self.resource_topics(rid, caller)
            except TransferError as exc:  # not the caller's to follow
                out.refused.append((rid, exc))
                continue
            out.topics.extend(topics)
            out.subscribed.append(rid)
            out.follow.append(rid)
        return out

    @staticmethod
    def inbox_topic(sender: Any, caller: Grant) -> str | None:
        """The topic of messages for ``sender``, if the caller may receive as that identity (its connection then
        hears them too), else None."""
        if sender is not None and caller.may_receive_as(identity_text(sender)):
            return receiver_topic(sender)
        return None

    @staticmethod
    def job_of(outcome: TPOutcome) -> str | None:
        """The job a message started (an import answered 202), whose events its sender's connection hears."""
        cid = outcome.correlation_id
        return cid if outcome.status == 202 and cid is not None and cid.startswith("j_") else None

    def subscribe(self, topic: str) -> asyncio.Queue[bytes]:
        """A queue of the raw envelopes published on ``topic`` from now on (at most 1000 waiting)."""
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1000)
        self._topics.setdefault(topic, set()).add(queue)
        return queue

    def listen(self, topic: str, deliver: Callable[[bytes], None]) -> None:
        """Call ``deliver`` with each raw envelope published on ``topic`` from now on (it must not block: a
        WebSocket connection puts it in its outbox). One set entry per topic, no queue or task of its own."""
        self._topics.setdefault(topic, set()).add(deliver)

    def unsubscribe(self, topic: str, subscriber: asyncio.Queue[bytes] | Callable[[bytes], None]) -> None:
        """Stop delivering ``topic`` to ``subscriber`` (a queue of :meth:`subscribe`, a ``deliver`` of
        :meth:`listen`)."""
        subscribers = self._topics.get(topic)
        if subscribers is not None:
            subscribers.discard(subscriber)
            if not subscribers:
                del self._topics[topic]

    def publish(self, topic: str, raw: bytes) -> None:
        """Hand ``raw`` to every subscriber of ``topic``; a full queue loses its oldest envelope."""
        for subscriber in list(self._topics.get(topic, ())):
            if not isinstance(subscriber, asyncio.Queue):
                subscriber(raw)
                continue
            try:
                subscriber.put_nowait(raw)
            except asyncio.QueueFull:  # a subscriber that does not read loses the oldest, not the service
                subscriber.get_nowait()
                subscriber.put_nowait(raw)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel the background tasks and wait until they have stopped."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _opt_str(spec: dict[str, Any], name: str) -> str | None:
    value = spec.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidEnvelope(f"payload.upload.{name} must be a string")
    return value


def _opt_int(spec: dict[str, Any], name: str) -> int | None:
    value = spec.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise InvalidEnvelope(f"payload.upload.{name} must be a non-negative integer")
    return value


def _stamp(moment: float) -> str:
    """The delivery-time part of a mailbox key (microseconds, fixed width: keys sort by time)."""
    return f"{int(max(0.0, moment) * 1e6):020d}"


def _delivered_at(key: str) -> float:
    """When the message under mailbox ``key`` was delivered (0: a key not made by :meth:`TPService.deliver`)."""
    stamp = key.rsplit("/", 1)[-1].split("-", 1)[0]
    return int(stamp) / 1e6 if stamp.isdigit() else 0.0
