"""A Debian sid root for the programs the tests need in a newer release than the machine's Debian 12 has: today the
current Ceph (radosgw, monitor, OSD: 20.2 "Tentacle" where Debian 12 carries 16.2 "Pacific").

The root is made once by ``debootstrap`` (minbase) from Debian's own archive, the packages are installed into it
with apt (no recommends; the packages' scripts see ``SYSTEMD_OFFLINE=1`` and a ``policy-rc.d`` that starts nothing),
and it is reused by every later run. It lives in a machine-wide cache, ``/var/cache/transfer-tests/sid-ceph/<recipe
digest>`` (or under ``TRANSFER_SID_ROOT``), not in the checkout: it is about 0.8 GiB and two minutes to make, and every
clone, worktree and CI run of the machine shares one; a machine without it (a fresh one, a clean clone) makes it on
first use. A root is named by the digest of its recipe (:data:`RECIPE`), so a checkout that changes the recipe makes
its own root and never changes one that an older checkout's run is using.

Programs run in it through :meth:`SidRoot.command`: in a mount namespace of their own (``unshare --mount``, private
propagation), where ``/proc``, ``/sys`` and ``/dev`` are mounted into the root, then ``chroot``. Those mounts are
never visible outside that namespace and vanish with its last process, so a killed test run cannot leave a bind
behind, and concurrent runs do not share (or unmount) each other's. Making the root follows the same rule
(debootstrap and apt run in a namespace of their own).

Concurrency, by file locks beside the roots: making one takes ``build.lock`` exclusively, so two pytest-xdist workers
that ask at once make it once (the second waits, then finds it made). A half-made root (a killed build) is never
used: it is built as ``<digest>.new`` and renamed into place once complete. A user holds ``<digest>.lock`` shared
while it runs programs from that root; a build removes the roots of other recipes only when nobody holds theirs.

Run ``python -m devtools.sidroot`` to make (or check) it by hand. Needs root, ``debootstrap`` (``make install``)
and access to Debian's archive: ``TRANSFER_SID_MIRROR``, else the one this machine's apt uses, else debootstrap's
default.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE = Path("/var/cache/transfer-tests/sid-ceph")
PACKAGES = ("ceph-mon", "ceph-osd", "radosgw", "ceph-common")
# what a root holds: roots are kept by its digest, so a changed recipe makes a new root beside the old (raise the
# last field when the build changes in a way the rest does not say)
RECIPE = f"debootstrap --variant=minbase sid; apt-get install --no-install-recommends {' '.join(PACKAGES)}; 1"
STAMP = ".transfer-tests-recipe"
BUILD_TIMEOUT = 1800.0  # seconds: debootstrap and apt on a slow mirror; about two minutes here
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Run in a new mount namespace: mount what programs in the root expect, then chroot. $1 is the root, the rest the
# command. The environment inside is a clean one: nothing of the caller's (a venv, PYTHONPATH) leaks into sid.
_ENTER = """set -e
root=$1; shift
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
exec chroot "$root" /usr/bin/env -i PATH=@PATH@ HOME=/root LANG=C.UTF-8 SYSTEMD_OFFLINE=1 "$@"
""".replace("@PATH@", PATH)

# Make the root at $1 from the mirror $2, in a mount namespace of its own (debootstrap mounts /proc and /sys into its
# target itself; what it leaves mounted on failure goes with the namespace).
_BUILD = """set -e
root=$1; mirror=$2; shift 2
debootstrap --variant=minbase sid "$root" ${mirror:+"$mirror"}
printf '#!/bin/sh\\nexit 101\\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
# a root is made once and kept: an archive (or a snapshot of it) may serve a Release file past its Valid-Until by
# then; the signatures are still checked
echo 'Acquire::Check-Valid-Until "false";' > "$root/etc/apt/apt.conf.d/99transfer-tests"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
inside() { chroot "$root" /usr/bin/env -i PATH=@PATH@ HOME=/root LANG=C.UTF-8 SYSTEMD_OFFLINE=1 \\
    DEBIAN_FRONTEND=noninteractive "$@"; }
inside apt-get update
inside apt-get install -y --no-install-recommends "$@"
inside apt-get clean
""".replace("@PATH@", PATH)


@dataclass(frozen=True)
class SidRoot:
    """A made sid root: where it is, and how to run a program in it."""

    path: Path

    def command(self, *args: str) -> list[str]:
        """The argv that runs ``args`` in the root (a private mount namespace, then chroot); paths in ``args`` are
        as seen from inside (see :meth:`inside`). The program keeps the caller's process: same PID, same signals."""
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _ENTER, "sh", str(self.path), *args]

    def inside(self, path: Path) -> str:
        """``path`` (under the root, as seen from here) as a program in the root sees it."""
        return "/" + str(path.resolve().relative_to(self.path.resolve()))

    def version(self, program: str = "radosgw") -> str:
        """What ``program --version`` says in the root (e.g. ``ceph version 20.2.4 (…) tentacle (stable)``)."""
        out = subprocess.run(self.command(program, "--version"), capture_output=True, text=True, timeout=60, check=True)
        return out.stdout.strip()


def cache_dir() -> Path:
    """Where roots are kept (one per recipe), with their locks and build log."""
    return Path(os.environ.get("TRANSFER_SID_ROOT", DEFAULT_CACHE))


def recipe_digest() -> str:
    """The name of this recipe's root in the cache."""
    return hashlib.sha256(RECIPE.encode()).hexdigest()[:12]


def sid_root_missing() -> str | None:
    """Why this machine cannot make or use the sid root, or None."""
    if os.geteuid() != 0:
        return "the sid root needs root (chroot, mount namespaces)"
    missing = [name for name in ("unshare", "chroot", "mount") if shutil.which(name) is None]
    made = (cache_dir() / recipe_digest() / STAMP).is_file()
    if not made and shutil.which("debootstrap") is None:
        missing.append("debootstrap")
    if missing:
        return f"cannot make or use the sid root (missing {', '.join(missing)}; `make install` installs debootstrap)"
    return None


def _mirror() -> str:
    """``TRANSFER_SID_MIRROR``, else the Debian archive this machine's apt uses (its main one, not the security
    archive), else "" (debootstrap's own default)."""
    if os.environ.get("TRANSFER_SID_MIRROR"):
        return os.environ["TRANSFER_SID_MIRROR"]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        # one-line ("deb [options] URI suite") and deb822 ("URIs: URI ...") entries
        for found in re.finditer(r"^(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", text, flags=re.MULTILINE):
            if found.group(1).rstrip("/").endswith("/debian"):
                return found.group(1)
    return ""


def _made(path: Path) -> bool:
    try:
        return (path / STAMP).read_text() == RECIPE
    except OSError:
        return False


def _drop_unused(cache: Path, keep: str) -> None:
    """Remove the roots of other recipes that nobody holds (their lock free), and half-made ones (we build now)."""
    for entry in cache.iterdir():
        if entry.is_dir() and entry.name != keep:
            lock_path = cache / f"{entry.name.removesuffix('.new')}.lock"
            with open(lock_path, "a+b") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # in use by a run of an older checkout: it goes with a later build
                shutil.rmtree(entry, ignore_errors=True)
            if not entry.name.endswith(".new"):
                lock_path.unlink(missing_ok=True)


def _build(path: Path, log: Path) -> None:
    """Make the root at ``path``: in ``<path>.new``, renamed into place once complete (the caller holds the build
    lock)."""
    fresh = path.with_name(path.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)  # a killed build's
    mirror = _mirror()
    began = time.monotonic()
    with open(log, "wb") as out:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _BUILD, "sh"]
            + [str(fresh), mirror, *PACKAGES],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT,
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        shutil.rmtree(fresh, ignore_errors=True)
        raise RuntimeError(f"making the sid root at {path} failed ({done.returncode}), see {log}:\n{tail}")
    (fresh / STAMP).write_text(RECIPE)
    fresh.rename(path)
    with open(log, "a") as out:
        out.write(f"\nmade in {time.monotonic() - began:.0f} s\n")


@contextmanager
def sid_root() -> Iterator[SidRoot]:
    """The sid root of this recipe, made first if absent, held (a shared lock) for the block's duration."""
    reason = sid_root_missing()
    if reason:
        raise RuntimeError(reason)
    cache, digest = cache_dir(), recipe_digest()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / digest
    with open(cache / f"{digest}.lock", "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # never waits: only a clean-up asks for it exclusively, without waiting
        if not _made(path):
            with open(cache / "build.lock", "a+b") as building:
                fcntl.flock(building, fcntl.LOCK_EX)  # a second worker waits here for the first one's build
                if not _made(path):
                    _drop_unused(cache, keep=digest)
                    _build(path, cache / "build.log")
        yield SidRoot(path)


if __name__ == "__main__":
    with sid_root() as made:
        print(f"{made.path}: {made.version()}", file=sys.stderr if "-q" in sys.argv else sys.stdout)
