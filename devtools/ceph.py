"""A throw-away Ceph cluster on loopback for the tests and the benchmarks: one monitor, one OSD on memstore (RAM, no
disk), and two RADOS Gateways (S3, beast frontend) on that one cluster, so that replicas can talk to different
gateways of one store. No systemd, no mgr: every daemon runs in the foreground as a child of this process, under a
throwaway directory, and is stopped on exit, even on failure; a daemon also dies with the thread that started it
(``PR_SET_PDEATHSIG``), so a killed test run leaves none running.

Two releases, from Debian's packages (``ceph-mon ceph-osd radosgw ceph-common``):

- ``16.2`` (Pacific, end of life): Debian 12's, installed on the machine by ``make install``;
- ``20.2`` (Tentacle, the current release): Debian sid's, in a sid root (:mod:`devtools.sidroot`, made on first use
  and reused), every program run chrooted there; the cluster's directory is under the root's ``/tmp``.

:func:`ceph_missing` says why a machine cannot run a release. Start-up takes a few seconds (keys, monitor map, monitor
mkfs, OSD mkfs, one S3 user, the gateways).

Run ``python -m devtools.ceph [16.2|20.2]`` to keep one running by hand (prints the endpoints and credentials).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from devtools.s3server import S3Endpoint, free_ports
from devtools.sidroot import SidRoot, sid_root, sid_root_missing

ACCESS_KEY = "transfer-ceph"
SECRET_KEY = "transfer-ceph-secret-0123456789"
REGION = "us-east-1"  # RGW's default zonegroup answers to any region in SigV4; boto3 needs one
DAEMONS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph-authtool", "monmaptool", "ceph")
RELEASES = ("16.2", "20.2")  # Debian 12's (on the machine), the current one (in a Debian sid root)
ENGINE_NAMES = {"16.2": "ceph16", "20.2": "ceph20"}  # S3Endpoint.engine of each release's gateways


@dataclass(frozen=True)
class CephCluster:
    """The gateways of one running cluster (same buckets, same user) and where it lives."""

    gateways: tuple[S3Endpoint, ...]
    root: Path  # the cluster's directory, as seen from this process
    started_in: float  # seconds from nothing to every gateway answering
    release: str = "16.2"
    version: str = ""  # what ``radosgw --version`` says

    @property
    def endpoint(self) -> S3Endpoint:
        return self.gateways[0]


def ceph_missing(release: str = "16.2") -> str | None:
    """Why this machine cannot run the test cluster of ``release`` (a program missing), or None."""
    if release == "20.2":
        reason = sid_root_missing()
        return f"Ceph 20.2 runs from a Debian sid root, and {reason}" if reason else None
    if release != "16.2":
        raise ValueError(f"no Ceph release {release!r} here (only {', '.join(RELEASES)})")
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"Ceph is not installed (missing {', '.join(missing)}; `make install` installs Debian's packages)"
    return None


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the thread that started it ends (a test run killed mid-way)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class _Place:
    """Where the programs of one release run: their argv (as is, or chrooted) and paths as they see them."""

    argv: Callable[..., list[str]]
    seen: Callable[[Path], str]
    tmp: str | None  # where the cluster's directory goes (None: the system's temporary directory)


def _host() -> _Place:
    return _Place(argv=lambda *args: list(args), seen=str, tmp=None)


def _chrooted(root: SidRoot) -> _Place:
    return _Place(argv=root.command, seen=root.inside, tmp=str(root.path / "tmp"))


def _process_id(pid: int) -> str:
    """``pid`` and its start time: one process, even after the PID is reused ("" once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"  # field 22, starttime (fields after the command's ")")


def _sweep_leftovers(tmp: Path) -> None:
    """Remove the directories of clusters whose process is gone (a killed run's): the sid root is kept across runs,
    so its ``/tmp`` is not cleaned by the machine's reboots as the system's is."""
    for leftover in tmp.glob("ceph-*"):
        try:
            owner = (leftover / "owner").read_text()
        except OSError:
            owner = ""  # being made right now, or a run's from before owners were written: keep
        if owner and _process_id(int(owner.split()[0])) != owner:
            shutil.rmtree(leftover, ignore_errors=True)


def _conf(root: str, fsid: str, mon_port: int, rgw_ports: list[int]) -> str:
    gateways = "".join(
        f"""
[client.rgw.{i}]
keyring = {root}/rgw.{i}.keyring
rgw frontends = beast endpoint=127.0.0.1:{port}
rgw data = {root}/rgw.{i}
log file = {root}/log/rgw.{i}.log
"""
        for i, port in enumerate(rgw_ports)
    )
    return f"""[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{mon_port}
mon initial members = a
ms bind msgr2 = false
public network = 127.0.0.0/8
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {root}/admin.keyring
run dir = {root}/run
admin socket = {root}/run/$name.asok
log file = {root}/log/$name.log
log to stderr = false
err to stderr = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
auth allow insecure global id reclaim = false
# one monitor commits at once: without these every map change (each RGW pool) waits out a 1-2 s proposal interval
paxos propose interval = 0.01
paxos min wait = 0.001
mon lease = 1
osd heartbeat grace = 20

[mon.a]
mon data = {root}/mon
keyring = {root}/mon.keyring

[osd.0]
osd data = {root}/osd
osd objectstore = memstore
memstore device bytes = 2147483648
osd max object size = 1073741824
keyring = {root}/osd/keyring
{gateways}"""


def _run(place: _Place, *args: str) -> str:
    out = subprocess.run(place.argv(*args), capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return out.stdout


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
        return True
    except httpx.TransportError:
        return False


@contextmanager
def ceph_cluster(gateways: int = 2, release: str = "16.2") -> Iterator[CephCluster]:
    """Start a one-node cluster of ``release`` (see :data:`RELEASES`) with ``gateways`` RADOS Gateways on loopback
    and an S3 user; stop it afterwards."""
    reason = ceph_missing(release)
    if reason:
        raise RuntimeError(reason)
    began = time.monotonic()
    with ExitStack() as stack:
        place = _chrooted(stack.enter_context(sid_root())) if release == "20.2" else _host()
        if place.tmp is not None:
            _sweep_leftovers(Path(place.tmp))
        root = Path(tempfile.mkdtemp(prefix="ceph-", dir=place.tmp))
        (root / "owner").write_text(_process_id(os.getpid()))
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        yield from _cluster(place, root, gateways, release, began)


def _cluster(place: _Place, root: Path, gateways: int, release: str, began: float) -> Iterator[CephCluster]:
    at = place.seen  # a path as the daemons see it
    conf = root / "ceph.conf"
    mon_port, *rgw_ports = free_ports(1 + gateways)
    fsid = str(uuid.uuid4())
    for sub in ("run", "log", "mon", "osd", *(f"rgw.{i}" for i in range(gateways))):
        (root / sub).mkdir()
    conf.write_text(_conf(at(root), fsid, mon_port, rgw_ports))
    c = ("-c", at(conf))
    procs: list[subprocess.Popen[bytes]] = []
    log = open(root / "log" / "daemons.log", "ab")  # noqa: SIM115 - closed below

    def daemon(*args: str) -> None:
        procs.append(
            subprocess.Popen(
                place.argv(*args),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # one prctl, no lock taken: safe between fork and exec
            )
        )

    try:
        mon_keyring, admin_keyring = at(root / "mon.keyring"), at(root / "admin.keyring")
        _run(
            place,
            *("ceph-authtool", "--create-keyring", mon_keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"),
        )
        _run(
            place,
            *("ceph-authtool", "--create-keyring", admin_keyring, "--gen-key", "-n", "client.admin"),
            *("--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *"),
        )
        _run(place, "ceph-authtool", mon_keyring, "--import-keyring", admin_keyring)
        monmap = at(root / "monmap")
        _run(place, "monmaptool", "--create", "--addv", "a", f"[v1:127.0.0.1:{mon_port}]", "--fsid", fsid, monmap)
        _run(place, "ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", mon_keyring)
        daemon("ceph-mon", *c, "-f", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = _run(place, "ceph", *c, "--connect-timeout", "30", "osd", "new", osd_uuid).strip()
        # the OSD's key first, into the keyring its config section names: its mkfs fetches the monitor's config
        _run(
            place,
            *("ceph", *c, "auth", "get-or-create", f"osd.{osd_id}", "osd", "allow *", "mon", "allow profile osd"),
            *("-o", at(root / "osd" / "keyring")),
        )
        _run(place, "ceph-osd", *c, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        daemon("ceph-osd", *c, "-f", "-i", osd_id)
        for i in range(gateways):
            _run(
                place,
                *("ceph", *c, "auth", "get-or-create", f"client.rgw.{i}", "mon", "allow rw", "osd", "allow rwx"),
                *("-o", at(root / f"rgw.{i}.keyring")),
            )
        # the user (and with it RGW's pools) before the gateways, so that they do not race to create the pools
        _run(
            place,
            *("radosgw-admin", *c, "user", "create", "--uid", "transfer", "--display-name", "transfer tests"),
            *("--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY),
        )
        for i in range(gateways):
            daemon("radosgw", *c, "-f", "-n", f"client.rgw.{i}")
        urls = [f"http://127.0.0.1:{port}" for port in rgw_ports]
        deadline = time.monotonic() + 60
        while not all(_answers(url) for url in urls):
            dead = [p.args for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = (root / "log" / "daemons.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Ceph {release} did not start (exited: {dead}):\n{tail}")
            time.sleep(0.05)
        started_in = time.monotonic() - began
        version = _run(place, "radosgw", "--version").strip()
        engine = ENGINE_NAMES[release]
        endpoints = tuple(S3Endpoint(url, ACCESS_KEY, SECRET_KEY, REGION, engine=engine) for url in urls)
        yield CephCluster(endpoints, root, started_in, release, version)
    finally:
        for p in procs:  # throw-away: nothing to flush (memstore would write its RAM to disk on a clean stop)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        log.close()


if __name__ == "__main__":
    with ceph_cluster(release=sys.argv[1] if len(sys.argv) > 1 else "16.2") as cluster:
        print(cluster.version, flush=True)
        for gw in cluster.gateways:
            print(f"gateway {gw.url}  access key {gw.access_key}  secret {gw.secret_key}", flush=True)
        print(f"started in {cluster.started_in:.1f} s", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
