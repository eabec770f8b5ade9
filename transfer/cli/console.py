"""What every command shares: its one-line errors, the options that name the service, progress bars, and
reading a descriptor from a file or stdin."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from transfer.client.client import DEFAULT_SERVER
from transfer.client.resolver import Progress
from transfer.core.model.content import load_descriptor

if TYPE_CHECKING:
    from pydantic import ValidationError

MAX_DESCRIPTOR_BYTES = 16 << 20  # a descriptor (bundles included) is metadata, never content


class CliParser(argparse.ArgumentParser):
    """argparse, but a usage error is the one line every failure prints (exit code 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"transfer: invalid_usage: {message} (see: {self.prog} --help)\n")
        sys.exit(2)


class CliError(Exception):
    def __init__(self, code: str, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


def _progress_bar(enabled: bool, label: str) -> tuple[Progress | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar: Any = None

    def update(done: int, total: int | None) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr)
        bar.update(done - bar.n)

    def close() -> None:
        if bar is not None:
            bar.close()

    return update, close


def _read_descriptor(source: str) -> Any:
    try:
        stream = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115 - closed below
        try:
            raw = stream.read(MAX_DESCRIPTOR_BYTES + 1)
        finally:
            if source != "-":
                stream.close()
        if len(raw) > MAX_DESCRIPTOR_BYTES:
            raise CliError("invalid_descriptor", f"descriptor {source} is larger than {MAX_DESCRIPTOR_BYTES} bytes")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise CliError("invalid_request", f"cannot read descriptor {source}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CliError("invalid_descriptor", f"descriptor {source} is not UTF-8 text") from exc
    return load_descriptor(text)


# the settings' own refusals that get a code of their own (the others are invalid_settings)
_REFUSALS = ("open_mode_refused", "placeholder_secret")


def settings_refused(exc: ValidationError) -> CliError:
    """The one line a refused configuration prints: each problem named by its variable, and the code of the refusal
    (``open_mode_refused``, ``placeholder_secret``) when every problem is one, else ``invalid_settings``. No value
    is repeated (a secret would be)."""
    errors = exc.errors()
    problems = "; ".join(
        (f"TRANSFER_{'_'.join(map(str, e['loc'])).upper()}: " if e["loc"] else "")
        + e["msg"].removeprefix("Value error, ")
        for e in errors
    )
    kinds = {e["type"] for e in errors}
    code = kinds.pop() if len(kinds) == 1 and kinds <= set(_REFUSALS) else "invalid_settings"
    return CliError(code, problems)


def _http_base(host: str, port: int, scheme: str = "http") -> str:
    """The URL of a server bound to ``host:port``: a wildcard address is reached through loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _service_options(p: argparse.ArgumentParser, server_default: str) -> None:
    """The options of every command that talks to a running service: where it is and the key to use."""
    p.add_argument("--server", default=server_default, help=f"service URL (TRANSFER_SERVER, default {DEFAULT_SERVER})")
    p.add_argument("--api-key", help="API key (default: TRANSFER_API_KEY)")
    _ca_cert_option(p)


def _ca_cert_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ca-cert",
        metavar="FILE",
        help="PEM file of the CA certificates to trust for https:// servers, instead of the default bundle (a private "
        "CA; as curl's --cacert). The environment's SSL_CERT_FILE does the same for every command",
    )


def _trust_ca(path: str) -> None:
    """Make ``path`` the CA bundle of every TLS connection this process opens (httpx, and ``ssl`` contexts made with
    the defaults, both read SSL_CERT_FILE), after checking that it holds certificates."""
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise CliError(
            "invalid_usage", f"--ca-cert {path}: not a readable PEM file of CA certificates: {exc}", 2
        ) from exc
    os.environ["SSL_CERT_FILE"] = str(Path(path).resolve())


def _untrusted_certificate(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind a transport error, if that is what it was."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or os.environ.get("TRANSFER_API_KEY") or None


def _size(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"
