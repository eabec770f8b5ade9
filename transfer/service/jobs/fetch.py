"""Outbound HTTP for server-side fetches (imports, MCP resolve on the server) with SSRF protection.

Every connection, the first and each redirect hop, goes through :class:`GuardedTransport`: the host name is resolved
once, every address it resolves to must be allowed, and the connection is made to that checked address (the name
stays in the Host header and in TLS SNI/certificate checks), so DNS rebinding between check and connect cannot
redirect it. Refused by default: loopback, private (RFC 1918, ULA), link-local (incl. cloud metadata
169.254.169.254 and fd00:ec2::254), CGNAT, multicast, reserved and unspecified addresses. An IPv6 address that embeds
an IPv4 address (IPv4-mapped or -compatible, NAT64, 6to4, Teredo) must also pass as that IPv4 address, so that
``64:ff9b::a9fe:a9fe`` (the metadata address through a NAT64 gateway) is refused. ``allow_networks`` (CIDRs) opens
chosen ranges, e.g. a private registry.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from transfer.errors import DestinationRefused, RemoteError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """Where a server-side fetch may connect: global unicast addresses, and the networks of ``allow_networks``
    (private or loopback ones an operator lets through); and the URL schemes it accepts."""

    allow_networks: tuple[IPNetwork, ...] = ()
    schemes: tuple[str, ...] = ("http", "https")

    @classmethod
    def from_cidrs(cls, cidrs: Sequence[str]) -> DestinationPolicy:
        """A policy that also allows the networks ``cidrs`` names (host bits allowed)."""
        return cls(tuple(ipaddress.ip_network(c, strict=False) for c in cidrs))

    def allows(self, ip: IPAddress) -> bool:
        """Whether a connection to ``ip`` may be made: an allowed network, or a global unicast address. An IPv6
        address that carries an IPv4 address a gateway would reach (see :func:`embedded_ipv4`) must pass as that
        IPv4 address too."""
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address):
            inner = embedded_ipv4(ip)
            if inner is not None:
                candidates = [inner] if ip.ipv4_mapped is not None else [ip, inner]
        return all(self._allows_one(c) for c in candidates)

    def _allows_one(self, ip: IPAddress) -> bool:
        if any(ip in net for net in self.allow_networks):
            return True
        return ip.is_global and not ip.is_multicast


# IPv6 prefixes whose addresses carry an IPv4 address that a translator or tunnel relays to. The IPv4 address is
# the low 32 bits, except for 6to4 (bits 16-47) and Teredo (the client address, bits 96-127 inverted, RFC 4380 §4).
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052 §2.1
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215 (local-use translation)
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # RFC 4291 §2.5.5.1 (deprecated, still routed by some stacks)
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")  # RFC 3056 §2
_TEREDO = ipaddress.IPv6Network("2001::/32")  # RFC 4380 §4


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, if it is of a form that embeds one: IPv4-mapped
    (``::ffff:0:0/96``), IPv4-compatible (``::/96``), NAT64 (``64:ff9b::/96``, ``64:ff9b:1::/48``), 6to4
    (``2002::/16``) or Teredo (``2001::/32``, the client's address). ``64:ff9b::a9fe:a9fe`` -> ``169.254.169.254``."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # (server, client): the client address is the one traffic is relayed to
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64_WELL_KNOWN or ip in _NAT64_LOCAL:
        return low32
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # not :: (unspecified) nor ::1 (loopback), judged as themselves
        return low32
    return None


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that connects only to addresses the policy allows."""

    def __init__(self, policy: DestinationPolicy, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.policy = policy
        self.inner = inner or httpx.AsyncHTTPTransport(retries=0)

    async def _addresses(self, host: str, port: int) -> list[IPAddress]:
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise RemoteError(f"cannot resolve {host!r}: {exc.strerror or exc}") from None
        out: list[IPAddress] = []
        for info in infos:
            ip = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if ip not in out:
                out.append(ip)
        return out

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` only to a destination the policy allows (DestinationRefused otherwise), checked on the
        address actually connected to."""
        url = request.url
        if url.scheme not in self.policy.schemes:
            raise DestinationRefused(f"scheme {url.scheme!r} is not fetched (only {', '.join(self.policy.schemes)})")
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        if not 0 < port <= 65535:  # e.g. a redirect to one; the socket layer would fail with an OverflowError
            raise DestinationRefused(f"port {port} is not a TCP port", host=host)
        addresses = await self._addresses(host, port)
        refused = [ip for ip in addresses if not self.policy.allows(ip)]
        if refused or not addresses:
            raise DestinationRefused(
                f"{host} resolves to {refused[0] if refused else 'nothing'}, which this service does not fetch from "
                "(loopback, private, link-local and metadata addresses are refused; see TRANSFER_FETCH_ALLOW_NETWORKS)",
                host=host,
            )
        pinned = url.copy_with(host=str(addresses[0]))
        extensions = dict(request.extensions)
        if url.scheme == "https":
            extensions["sni_hostname"] = host
        # a copy, so that httpx builds a redirect from the name, not from the pinned address
        outbound = httpx.Request(request.method, pinned, headers=request.headers, stream=request.stream)
        outbound.extensions = extensions
        return await self.inner.handle_async_request(outbound)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.inner.aclose()
