"""The Debian sid root that Ceph 20.2 runs from (devtools/sidroot.py) and the clusters started in it: two processes
that ask for a root at once make it once, a half-made root is never used, and a test run killed mid-way leaves no
daemon running and no mount behind (every mount lives in a namespace that dies with its last process).

The first two tests stand a one-line script in for debootstrap and apt (the locking and the renaming are what they
test; making the real root takes two minutes and a gigabyte); the others use the real root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools import sidroot
from devtools.ceph import _sweep_leftovers, ceph_missing

REPO = Path(__file__).resolve().parents[2]
# a stand-in for the build: what a made root needs to be found made, one line in a log per build, a second's work
FAKE_BUILD = """
import sys, time
from pathlib import Path
from devtools import sidroot
sidroot._BUILD = 'set -e; echo "$1" >> "$BUILDS"; sleep 1; mkdir -p "$1"'
with sidroot.sid_root() as root:
    print(root.path)
"""


def ask_for_a_root(cache: Path, builds: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TRANSFER_SID_ROOT": str(cache), "BUILDS": str(builds), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", FAKE_BUILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def needs_root() -> None:
    reason = sidroot.sid_root_missing()
    if reason:
        pytest.skip(reason)


def test_two_workers_asking_at_once_make_the_root_once(tmp_path: Path) -> None:
    needs_root()
    cache, builds = tmp_path / "cache", tmp_path / "builds"
    askers = [ask_for_a_root(cache, builds) for _ in range(3)]
    roots = []
    for asker in askers:
        out, err = asker.communicate(timeout=60)
        assert asker.returncode == 0, err
        roots.append(out.strip())
    made = cache / sidroot.recipe_digest()
    assert roots == [str(made)] * 3
    assert builds.read_text().splitlines() == [f"{made}.new"]  # built once, under its temporary name
    assert (made / sidroot.STAMP).read_text() == sidroot.RECIPE
    out, err = ask_for_a_root(cache, builds).communicate(timeout=60)
    assert out.strip() == str(made) and len(builds.read_text().splitlines()) == 1  # and then reused


def test_a_half_made_root_is_never_used_and_old_recipes_go(tmp_path: Path) -> None:
    needs_root()
    cache, builds = tmp_path / "cache", tmp_path / "builds"
    digest = sidroot.recipe_digest()
    (cache / f"{digest}.new" / "etc").mkdir(parents=True)  # a build killed half-way
    (cache / "0123456789ab" / "etc").mkdir(parents=True)  # the root of an older recipe, unused
    (cache / "0123456789ab.lock").touch()
    out, err = ask_for_a_root(cache, builds).communicate(timeout=60)
    assert out.strip() == str(cache / digest), err
    assert builds.read_text().splitlines() == [str(cache / f"{digest}.new")]
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [digest]


def mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mounts").read_text().splitlines() if str(path) in line]


def processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.ceph
@pytest.mark.slow
def test_a_killed_run_leaves_no_daemon_and_no_mount_behind(tmp_path: Path) -> None:
    """``python -m devtools.ceph 20.2`` (what a test worker does) killed with SIGKILL, nothing stopping its cluster:
    its daemons die with it, the mounts of /proc, /sys and /dev in the root were never visible here, and the next
    cluster removes the dead one's directory."""
    reason = ceph_missing("20.2")
    if reason:
        pytest.skip(reason)
    with sidroot.sid_root() as root:
        runner = subprocess.Popen(
            [sys.executable, "-m", "devtools.ceph", "20.2"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert runner.stdout is not None
            version = runner.stdout.readline()
            assert version.startswith("ceph version 20.2."), version
            dirs = list((root.path / "tmp").glob("ceph-*"))
            owned = [d for d in dirs if (d / "owner").read_text().split()[0] == str(runner.pid)]
            assert len(owned) == 1
            cluster = root.inside(owned[0])  # how the daemons name their directory
            assert len(processes_naming(cluster)) >= 3  # a monitor, an OSD, gateways
            assert mounts_under(root.path) == []  # mounted in the daemons' own namespaces only
        finally:
            runner.send_signal(signal.SIGKILL)
            runner.wait()
            assert runner.stdout is not None
            runner.stdout.close()
        deadline = time.monotonic() + 10
        while processes_naming(cluster) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_naming(cluster) == []
        assert mounts_under(root.path) == []
        _sweep_leftovers(root.path / "tmp")  # what the next cluster does first
        assert not owned[0].exists()
