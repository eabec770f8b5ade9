"""The listener's TLS: one :class:`ssl.SSLContext` with modern defaults, whose certificate can be replaced while the
server runs.

Defaults (Mozilla's "intermediate" profile, and what RFC 9113 §9.2 requires of HTTP/2 over TLS 1.2): TLS 1.2 or
1.3 only; on TLS 1.2 only ephemeral ECDHE key exchange with AEAD ciphers (AES-GCM, ChaCha20-Poly1305), no
compression (CRIME), no renegotiation, no session tickets that outlive a key rotation; ALPN offers ``h2`` then
``http/1.1`` (RFC 7301), so a client that speaks HTTP/2 gets it and every other client gets HTTP/1.1.

Reloading (:meth:`ListenerTLS.reload`, on SIGHUP, and by :meth:`ListenerTLS.check_files` when either file changes:
a new inode, size or modification time, polled about once a second on the server's loop, which catches the atomic
rename that certbot and cert-manager do as well as a write in place): the new chain and key are loaded into a
scratch context first, so a broken or mismatched pair is refused with the old certificate still served; then they
are loaded into the live context. OpenSSL copies the certificate into each connection at its handshake, so
connections already open keep theirs and are not dropped; every handshake after the reload presents the new one.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

log = logging.getLogger("transfer.ops")

FileStamp = tuple[int, int, int, int] | None  # (device, inode, size, mtime in ns) of a file; None when missing

ALPN = ["h2", "http/1.1"]
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"  # TLS 1.3's suites are OpenSSL's defaults (all AEAD)


def _context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= ssl.OP_NO_TICKET
    context.set_alpn_protocols(ALPN)
    context.load_cert_chain(cert, key)
    return context


class ListenerTLS:
    """The TLS context of a listener, made from ``cert`` and ``key`` (PEM files); :meth:`reload` reads them again."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key
        self.context = _context(cert, key)
        self._seen = self._stamps()

    def _stamps(self) -> tuple[FileStamp, FileStamp]:
        def stamp(path: Path) -> FileStamp:
            try:
                st = os.stat(path)  # follows symlinks: a Kubernetes secret swaps its ..data link
            except OSError:
                return None
            return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

        return stamp(self.cert), stamp(self.key)

    async def check_files(self) -> None:
        """Reload when the certificate or key file changed since the last look (called about once a second on the
        server's loop, so the live context changes between handshakes, never during one). A pair caught half
        replaced (the new certificate, the old key) is refused like any bad pair and tried again at the next
        change, so a certificate renamed into place before its key is served once the key follows."""
        stamps = self._stamps()
        if stamps != self._seen:
            self._seen = stamps
            self.reload()

    def reload(self) -> bool:
        """Read the certificate chain and key again; new handshakes present them, open connections are untouched.
        A pair that does not load (missing file, bad PEM, key of another certificate) is refused and logged, and
        the certificate served so far stays. Returns whether the new pair is served."""
        try:
            _context(self.cert, self.key)  # all checks first, on a context nobody uses
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.error(
                "TLS certificate not reloaded (%s, %s): %s; still serving the previous one", self.cert, self.key, exc
            )
            return False
        log.warning("TLS certificate reloaded from %s", self.cert)
        return True
