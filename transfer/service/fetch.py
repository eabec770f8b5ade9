"""Outbound HTTP for server-side fetches (imports, MCP resolve on the server) with SSRF protection.

Every connection, the first and each redirect hop, goes through :class:`GuardedTransport`: the host name is resolved
once, every address it resolves to must be allowed, and the connection is made to that checked address (the name
stays in the Host header and in TLS SNI/certificate checks), so DNS rebinding between check and connect cannot
redirect it. Refused by default: loopback, private (RFC 1918, ULA), link-local (incl. cloud metadata
169.254.169.254 and fd00:ec2::254), CGNAT, multicast, reserved and unspecified addresses; IPv4-mapped IPv6 is judged
as the IPv4 it maps. ``allow_networks`` (CIDRs) opens chosen ranges, e.g. a private registry.
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
    allow_networks: tuple[IPNetwork, ...] = ()
    schemes: tuple[str, ...] = ("http", "https")

    @classmethod
    def from_cidrs(cls, cidrs: Sequence[str]) -> DestinationPolicy:
        return cls(tuple(ipaddress.ip_network(c, strict=False) for c in cidrs))

    def allows(self, ip: IPAddress) -> bool:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.allow_networks):
            return True
        return ip.is_global and not ip.is_multicast


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
        url = request.url
        if url.scheme not in self.policy.schemes:
            raise DestinationRefused(f"scheme {url.scheme!r} is not fetched (only {', '.join(self.policy.schemes)})")
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
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
        await self.inner.aclose()
