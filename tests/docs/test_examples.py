"""Every shell and Python example of the README and the documentation site, run against a real ``transfer serve``.

The examples are the first thing a newcomer copies, so a route renamed, an option dropped or an output changed must
fail here. One server (local storage, open mode on loopback, as ``make serve`` runs it) serves every page; each page's
blocks run in order in a working directory of its own (files made by one block are there for the next), with
``.venv`` and ``.cache`` linked from the checkout so that ``.venv/bin/transfer`` and ``source .venv/bin/activate``
work as written, ``transfer`` on the PATH, and ``127.0.0.1:8080`` / ``localhost:8080`` pointed at the test server.
A block the page marks ``<!-- test: skip "why" -->`` is skipped with that reason (see ``tests/docs/pages.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.ports import free_port
from tests.docs.pages import ROOT, RUNNABLE, Block, blocks, pages

pytestmark = pytest.mark.e2e

BLOCKS = [b for page in pages() for b in blocks(page) if b.runnable]
BLOCK_TIMEOUT = 120.0
# A reader types a page's blocks into one shell, so a variable set in one block is there in the next: each block
# starts from the variables the page's earlier blocks left (.docs-env in the page's directory) and saves its own.
SHELL_STATE = """
__docs_base=" $(compgen -v | tr '\\n' ' ') "
if [ -f .docs-env ]; then source .docs-env; fi
__docs_save() {
  for __docs_v in $(compgen -v); do
    case "$__docs_v" in __docs*|BASH_*|FUNCNAME|_|REPLY|LINES|COLUMNS|PIPESTATUS|OPTIND|OPTARG) continue;; esac
    case "$__docs_base" in *" $__docs_v "*) ;; *) declare -p "$__docs_v";; esac
  done > .docs-env.new 2>/dev/null && mv .docs-env.new .docs-env
}
trap __docs_save EXIT
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``transfer serve`` in its own process, as ``make serve`` starts it, on a free port."""
    port = free_port()
    data = tmp_path_factory.mktemp("docs-data")
    log = data.parent / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFER_")}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--data-dir", str(data)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("transfer serve did not start: " + log.read_text()[-2000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One working directory per page, made on first use, shared by that page's blocks in order."""
    return {}


def workdir(workdirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, page: str) -> Path:
    if page not in workdirs:
        path = tmp_path_factory.mktemp("page")
        for name in (".venv", ".cache"):
            if (ROOT / name).exists():
                (path / name).symlink_to(ROOT / name)
        workdirs[page] = path
    return workdirs[page]


def expected_lines(output: str) -> list[str]:
    return [line.rstrip() for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example_runs(
    block: Block, server: str, workdirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    cwd = workdir(workdirs, tmp_path_factory, block.page)
    host = server.removeprefix("http://")
    code = block.code.replace("127.0.0.1:8080", host).replace("localhost:8080", host)
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFER_")}
    env.update({"PATH": f"{bin_dir}:{env.get('PATH', '')}", "TRANSFER_SERVER": server, "PYTHONUNBUFFERED": "1"})
    if RUNNABLE[block.language] == "bash":
        command = ["bash", "-e", "-o", "pipefail", "-c", SHELL_STATE + code]
    else:
        command = [sys.executable, "-c", code]
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL
    )
    report = f"{block.id} exited {done.returncode}\n--- code\n{code}--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    assert done.returncode == 0, report
    if block.output is not None:
        for line in expected_lines(block.output):
            wanted = line.split("…", 1)[0]
            assert wanted in done.stdout, f"{block.id}: {line!r} not in the output\n{report}"
