"""The release as a user gets it: ``python -m build`` makes an sdist and a wheel whose metadata PyPI accepts; the
wheel, installed into a fresh venv with no network (``pip install --no-index`` from a wheelhouse packed from this
environment) and no ``node_modules`` anywhere, serves a page that uploads in a real Chromium and ``/docs`` and
``/redoc`` that render; the Dockerfile lints clean with hadolint, and its own start-up command, environment, health
check and stop signal work when run here outside a container (no Docker engine runs on these machines)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tarfile
import time
import venv
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any

import httpx
import pytest
from dockerfile_parse import DockerfileParser

import transfer
from devtools.serving import free_port
from devtools.wheelhouse import build_wheelhouse
from tests.client.test_web_page import CHROMIUM, CHROMIUM_ARGS, row_state
from transfer.web.vendor import BUNDLED, LICENCES, VENDOR

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SERVED = sorted({path for path, _ in VENDOR.values()} | set(LICENCES))
MiB = 1 << 20


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what points into the checkout or its venv, or at a pip index or config."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "TRANSFER_WEB_ASSETS_DIR", "PIP_FIND_LINKS", "PIP_INDEX_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TRANSFER_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", **extra}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, built from this checkout by ``python -m build`` (the wheel from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "TRANSFER_NPM_CACHE": str(ROOT / ".cache" / "npm-tarballs")}
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="module")
def installed(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed offline; its ``bin`` folder."""
    root = tmp_path_factory.mktemp("fresh")
    metadata = wheel_metadata(dists["wheel"])
    requirements = [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    wheelhouse = root / "wheelhouse"
    build_wheelhouse(requirements, wheelhouse)
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    bin_dir = root / "venv" / "bin"
    result = subprocess.run(
        [
            str(bin_dir / "pip"),
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            str(dists["wheel"]),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=root,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return bin_dir


def wheel_metadata(wheel: Path) -> Any:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode())


def test_build_hook_refuses_a_tarball_that_is_not_the_locked_one() -> None:
    hook = runpy.run_path(str(ROOT / "setup.py"), run_name="release_hook")
    good = "sha512-" + base64.b64encode(hashlib.sha512(b"tarball").digest()).decode()
    assert hook["verified"](b"tarball", good, "x") == b"tarball"
    with pytest.raises(RuntimeError, match="refusing the tarball"):
        hook["verified"](b"tarball, changed", good, "x")
    with pytest.raises(RuntimeError, match="no digest"):
        hook["verified"](b"tarball", "md5-abc", "x")
    # the lock has no "resolved" URLs (omit-lockfile-registry-resolved): the registry's own tarball URL is used
    assert hook["tarball_url"]("redoc", {"version": "2.5.4"}).endswith("/redoc/-/redoc-2.5.4.tgz")
    assert hook["tarball_url"]("@scope/pkg", {"version": "1.0.0"}).endswith("/@scope/pkg/-/pkg-1.0.0.tgz")
    lock = json.loads((ROOT / "transfer" / "web" / "package-lock.json").read_text())["packages"]
    for package in {path.split("/")[0] for path in SERVED}:
        assert lock[f"node_modules/{package}"]["integrity"].startswith("sha512-"), package


@pytest.mark.slow
def test_sdist_and_wheel_carry_what_pypi_and_the_service_need(dists: dict[str, Path]) -> None:
    twine = Path(sys.executable).with_name("twine")
    result = subprocess.run(
        [str(twine), "check", "--strict", *map(str, dists.values())], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr

    from trove_classifiers import classifiers as known

    metadata = wheel_metadata(dists["wheel"])
    assert metadata["Version"] == transfer.__version__  # the one place the version is written
    assert metadata["License-Expression"] == "Apache-2.0 AND MIT" and metadata["Requires-Python"] == ">=3.11"
    assert not set(metadata.get_all("Classifier")) - known and "Typing :: Typed" in metadata.get_all("Classifier")
    with zipfile.ZipFile(dists["wheel"]) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(f"agent_transfer-{transfer.__version__}.dist-info/entry_points.txt").decode()
    assert "transfer = transfer.cli:main" in entry_points
    # the service's own packages only: a top-level devtools/ shadowed PyPI's `devtools` (`from devtools import debug`)
    top_level = {n.split("/", 1)[0] for n in names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"transfer", "storage"}
    assert f"agent_transfer-{transfer.__version__}.dist-info/licenses/LICENSE" in names
    # exactly the served files and their licences, in node_modules' layout; nothing else from npm
    bundled = sorted(n.removeprefix(f"transfer/web/{BUNDLED}/") for n in names if f"/web/{BUNDLED}/" in n)
    assert bundled == SERVED
    assert not [n for n in names if "node_modules" in n]
    with tarfile.open(dists["sdist"]) as tar:
        members = [m.split("/", 1)[1] for m in tar.getnames() if "/" in m]
    assert "setup.py" in members and "transfer/web/vendor.py" in members and "transfer/web/package-lock.json" in members
    assert not [m for m in members if "node_modules" in m or f"web/{BUNDLED}/" in m]  # fetched when built, not shipped


def dockerfile() -> DockerfileParser:
    return DockerfileParser(path=str(DOCKERFILE))


def final_stage(parser: DockerfileParser) -> list[dict[str, Any]]:
    instructions: list[dict[str, Any]] = parser.structure
    last_from = max(i for i, ins in enumerate(instructions) if ins["instruction"] == "FROM")
    return instructions[last_from:]


def test_dockerfile_lints_clean_and_its_final_stage_is_small_and_unprivileged(tmp_path: Path) -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # hadolint does refuse what it should (so the pass above means something)
    (tmp_path / "Dockerfile").write_text("FROM python:latest\nRUN cd /src && pip install .\n")  # DL3007, DL3003
    assert subprocess.run([str(hadolint), str(tmp_path / "Dockerfile")], capture_output=True).returncode != 0

    parser = dockerfile()
    stages = [ins["value"] for ins in parser.structure if ins["instruction"] == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS wheel")
    final = final_stage(parser)
    text = " ".join(ins["value"] for ins in final).lower()
    assert "npm" not in text and "node" not in text and "apt-get" not in text  # only the built wheel goes in
    assert "copy --from=wheel" in " ".join(ins["content"].lower() for ins in final)
    user = [ins["value"] for ins in final if ins["instruction"] == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert [ins["value"] for ins in final if ins["instruction"] == "STOPSIGNAL"] == ["SIGTERM"]
    (health,) = [ins["value"] for ins in final if ins["instruction"] == "HEALTHCHECK"]
    assert "/readyz" in health
    envs = parser.envs
    from transfer.settings import Settings

    known = {f"TRANSFER_{field.upper()}" for field in Settings.model_fields}
    assert {k for k in envs if k.startswith("TRANSFER_")} <= known  # every setting the image passes is read
    assert float(envs["TRANSFER_SHUTDOWN_DRAIN"]) + float(envs["TRANSFER_SHUTDOWN_GRACE"]) < 40  # deploy/'s kill delay


def image_start(port: int, data_dir: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """The final stage's CMD, ENV and HEALTHCHECK command, for this port and data directory."""
    parser = dockerfile()
    env = dict(parser.envs)
    assert env["TRANSFER_PORT"] == "8080" and env["TRANSFER_DATA_DIR"] == "/data"
    # loopback here instead of the container's 0.0.0.0 (test traffic stays on 127.0.0.0/8)
    env.update(TRANSFER_HOST="127.0.0.1", TRANSFER_PORT=str(port), TRANSFER_DATA_DIR=str(data_dir))
    cmd = json.loads(parser.cmd)
    (health,) = [ins["value"] for ins in final_stage(parser) if ins["instruction"] == "HEALTHCHECK"]
    probe = json.loads(health[health.index("CMD") + 3 :].strip())
    return cmd, env, [arg.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for arg in probe]


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("transfer serve did not start: " + log.read_text()[-3000:])
        time.sleep(0.2)


@pytest.fixture
def from_the_wheel(installed: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], list[str]]]:
    """The image's start-up command, run from the fresh venv: its URL, its process, its health check command."""
    port, log, home = free_port(), tmp_path / "serve.log", tmp_path / "home"
    home.mkdir()
    cmd, image_env, probe = image_start(port, tmp_path / "data")
    env = clean_env(**image_env, PATH=f"{installed}:{os.environ['PATH']}", HOME=str(home))
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=home)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        probe[0] = str(installed / probe[0])  # the image's `python` is the venv's
        yield f"http://127.0.0.1:{port}", proc, probe
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.e2e
def test_the_wheel_alone_serves_a_page_that_uploads_and_docs_that_render(
    installed: Path, from_the_wheel: tuple[str, subprocess.Popen[bytes], list[str]], tmp_path: Path
) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.fail("chromium is not installed: run `make install` (apt-get install chromium)")
    from playwright.sync_api import Route, sync_playwright

    base, proc, probe = from_the_wheel
    # the service answering is the installed wheel, and it finds no node_modules: its files are the wheel's own
    where = subprocess.run(
        [str(installed / "python"), "-c", "import transfer.web as w; print(w.HERE)"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    ).stdout.strip()
    assert where.startswith(str(installed.parent)) and not (Path(where) / "node_modules").exists()
    # the process serving is the fresh venv's interpreter (`transfer serve` re-executes itself with its allocator
    # settings as `python -m transfer serve`; its working directory holds no `transfer` package)
    interpreter = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert Path(interpreter).parent == installed
    assert httpx.get(base + "/healthz").json()["version"] == transfer.__version__
    assert subprocess.run(probe, env=clean_env(), timeout=30).returncode == 0  # the image's HEALTHCHECK: ready

    data = os.urandom(3 * MiB + 11)
    src = tmp_path / "from-the-wheel.bin"
    src.write_bytes(data)
    elsewhere: list[tuple[str, str]] = []

    def offline(route: Route) -> None:
        if route.request.url.startswith(base + "/"):
            route.continue_()
        else:
            elsewhere.append((route.request.resource_type, route.request.url))
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(180_000)
            page.route("**/*", offline)
            page.goto(base + "/")
            page.wait_for_function("() => window.tus && window.tus.isSupported")
            assert page.query_selector("#missing") is None  # nothing reported missing
            page.set_input_files("#pick", str(src))
            page.wait_for_function("() => document.querySelector('#uploads li')?.dataset.state === 'done'")
            file_id = row_state(page)["fileId"]
            page.wait_for_selector(f'#files tr[data-file-id="{file_id}"]')
            page.goto(base + "/docs")
            page.wait_for_selector(".swagger-ui .info .title")
            page.wait_for_selector(".opblock-tag")  # the operations, drawn from /openapi.json
            page.goto(base + "/redoc")
            page.wait_for_selector("h1")
            assert "transfer" in page.inner_text("h1").lower()
        finally:
            browser.close()
    assert [url for kind, url in elsewhere if kind != "image"] == []  # Redoc's CDN logo only
    descriptor = httpx.get(f"{base}/v1/files/{file_id}").json()
    assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(httpx.get(descriptor["url"], timeout=60).content).digest() == hashlib.sha256(data).digest()

    # the image's STOPSIGNAL: a clean exit within the drain and the grace
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_a_missing_asset_names_every_way_to_get_it(tmp_path: Path) -> None:
    from transfer.settings import Settings
    from transfer.web import INSTALL_HINT, assets_dir

    assert assets_dir(Settings(data_dir=tmp_path, web_assets_dir=tmp_path / "x")) == tmp_path / "x"
    assert "make install" in INSTALL_HINT and "wheel" in INSTALL_HINT
    # a checkout (make install ran npm ci) serves its node_modules; an installed wheel its assets (the browser test)
    assert assets_dir(Settings(data_dir=tmp_path)) == ROOT / "transfer" / "web" / "node_modules"
