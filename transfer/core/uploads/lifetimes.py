"""File lifetimes and byte quotas: the rules, without I/O.

Lifetime of a new file (``expires_in``, seconds from publication):

    asked for            -> that, unless above the maximum: LifetimeTooLong (400), never shortened silently
    not asked for        -> the key's ``default_file_ttl``, else the service's ``default_file_ttl``, else none
                            (a default above the maximum is cut to the maximum: nobody asked for it)
    maximum              -> the smaller of the key's ``max_file_ttl`` and the service's ``max_file_ttl``

Quota (a key's ``max_bytes``): the original bytes (descriptor ``size``) of the files the key has published plus
what its unfinished uploads have reserved must stay at or below it.

Expiry index: each file that expires has an entry ``expiry/<yyyymmddhh>/<file id>`` (the UTC hour it expires
in), so a sweep lists only the hours that have passed: its cost follows the number of expired files, not the
number stored. Bundles have an index of their own, ``bundle-expiry/<yyyymmddhh>/<bundle id>``, of the same form.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from transfer.core.numerals import parse_count
from transfer.errors import InvalidRequest, LifetimeTooLong, QuotaExceeded

EXPIRY_PREFIX = "expiry/"
MAX_LIFETIME = 100 * 365 * 24 * 3600  # a bound for parsing; configured maxima are usually far lower


def parse_expires_in(value: str | int | None, field: str = "expires_in") -> int | None:
    """An ``expires_in`` as it arrives (query parameter, header field, tus metadata, JSON): whole seconds > 0;
    None when absent or empty."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidRequest(f"{field} must be a whole number of seconds", field=field)
    seconds = value if isinstance(value, int) else parse_count(str(value), field)
    if seconds <= 0:
        raise InvalidRequest(f"{field} must be a positive number of seconds", field=field)
    if seconds > MAX_LIFETIME:
        raise LifetimeTooLong(f"{field} is longer than {MAX_LIFETIME} seconds", maximum=MAX_LIFETIME)
    return seconds


@dataclass(frozen=True, slots=True)
class LifetimePolicy:
    """The defaults and maxima that apply to one key's uploads (None: not set at that level)."""

    key_default: int | None = None
    key_max: int | None = None
    service_default: int | None = None
    service_max: int | None = None

    @property
    def maximum(self) -> int | None:
        """The longest lifetime allowed (the smaller of the key's and the service's), None: no maximum."""
        limits = [m for m in (self.key_max, self.service_max) if m is not None]
        return min(limits) if limits else None

    def lifetime(self, requested: int | None) -> int | None:
        """Seconds the new file lives (None: until deleted). LifetimeTooLong when ``requested`` is above the
        maximum."""
        requested = parse_expires_in(requested)  # the one validator of every door: whole seconds, bounded
        maximum = self.maximum
        if requested is not None:
            if maximum is not None and requested > maximum:
                raise LifetimeTooLong(
                    f"expires_in {requested} is longer than the {maximum} seconds allowed", maximum=maximum
                )
            return requested
        default = self.key_default if self.key_default is not None else self.service_default
        if default is None:
            return maximum  # files must go within the maximum even when nobody asked
        return default if maximum is None else min(default, maximum)


def expires_at(published: float, lifetime: int | None) -> datetime | None:
    """When a file published at ``published`` (Unix seconds) with ``lifetime`` goes, to the second."""
    if lifetime is None:
        return None
    return datetime.fromtimestamp(int(published) + lifetime, UTC)


def is_expired(expiry: datetime | None, now: float) -> bool:
    """Whether a file with ``expiry`` is gone at ``now`` (the instant itself included)."""
    return expiry is not None and now >= expiry.timestamp()


def expiry_bucket(moment: datetime | float) -> str:
    """The UTC hour of ``moment`` as ``yyyymmddhh``: these sort in time order as strings."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    return moment.astimezone(UTC).strftime("%Y%m%d%H")


def expiry_key(expiry: datetime, file_id: str, prefix: str = EXPIRY_PREFIX) -> str:
    """The index entry of ``file_id`` expiring at ``expiry`` (``prefix``: the index, files' by default)."""
    return f"{prefix}{expiry_bucket(expiry)}/{file_id}"


def parse_expiry_key(key: str, prefix: str = EXPIRY_PREFIX) -> tuple[str, str] | None:
    """``(bucket, id)`` of an expiry index key; None for anything else under the prefix."""
    rest = key[len(prefix) :] if key.startswith(prefix) else ""
    bucket, _, file_id = rest.partition("/")
    if len(bucket) != 10 or not bucket.isdigit() or not file_id or "/" in file_id:
        return None
    return bucket, file_id


@dataclass(frozen=True, slots=True)
class Usage:
    """One key's bytes: published (``used``, in ``files`` files) and reserved by unfinished uploads."""

    used: int
    files: int
    reserved: int
    quota: int | None

    @property
    def available(self) -> int | None:
        """Bytes a new upload may still take (None: no quota)."""
        return None if self.quota is None else max(0, self.quota - self.used - self.reserved)

    def require_room(self, nbytes: int) -> None:
        """QuotaExceeded unless ``nbytes`` more fit under the quota."""
        if self.quota is not None and self.used + self.reserved + nbytes > self.quota:
            raise QuotaExceeded(
                f"{nbytes} more bytes would exceed this key's quota of {self.quota} bytes "
                f"({self.used} used, {self.reserved} reserved by unfinished uploads)",
                quota=self.quota,
                used=self.used,
                reserved=self.reserved,
                requested=nbytes,
            )

    def to_json(self) -> dict[str, int | None]:
        """The usage as the API shows it."""
        return {
            "bytes_used": self.used,
            "files": self.files,
            "bytes_reserved": self.reserved,
            "quota_bytes": self.quota,
            "bytes_available": self.available,
        }
