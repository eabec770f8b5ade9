"""The web page at ``/`` and the API docs, served by the service itself with no CDN; and, in a real headless
Chromium (Debian's ``chromium`` driven by Playwright), a 50 MiB upload through the page that survives the server
being killed and started again mid-way, verified by SHA-256."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.serving import free_port
from tests.conftest import LiveServer, running
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

MiB = 1 << 20
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT_ENV = "TRANSFER_WEB_SCREENSHOT"  # where the browser test also saves its screenshot (the README's image)
CDN = re.compile(r"(src|href)=\"(https?:)?//", re.IGNORECASE)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LiveServer]:
    with running(Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})) as live:
        yield live


def test_page_docs_and_redoc_load_nothing_from_elsewhere(site: LiveServer) -> None:
    with httpx.Client(base_url=site.url, timeout=60) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert 'data-keys="off"' in page.text and 'id="missing"' not in page.text
        for path in ("/", "/docs", "/redoc"):
            html = http.get(path).text
            assert not CDN.search(html), f"{path} loads from another host"
            for asset in re.findall(r"(?:src|href)=\"(/web/[^\"]+)\"", html):
                served = http.get(asset)
                assert served.status_code == 200 and len(served.content) > 100, asset
        assert "/web/vendor/swagger-ui-bundle.js" in http.get("/docs").text
        assert "/web/vendor/redoc.standalone.js" in http.get("/redoc").text
        for path in ("/docs", "/redoc"):  # served with a policy that lets nothing load from elsewhere
            policy = http.get(path).headers["content-security-policy"]
            assert "default-src 'none'" in policy and "img-src 'self' data:;" in policy, path
            assert "script-src 'self'" in policy and "http" not in policy, path
        assert http.get("/web/vendor/../../settings.py").status_code == 404
        assert http.get("/web/vendor/package.json").status_code == 404  # only the named library files


def test_missing_libraries_are_named_not_blank(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, web_assets_dir=tmp_path / "empty"
    )
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        page = http.get("/")
        assert page.status_code == 200 and 'id="missing"' in page.text and "make install" in page.text
        for path in ("/docs", "/redoc", "/web/vendor/tus.min.js"):
            r = http.get(path)
            assert r.status_code == 503 and r.json()["error"]["code"] == "assets_missing", path
            assert "make install" in r.json()["error"]["message"]


def test_page_asks_for_a_key_when_keys_are_on(tmp_path: Path) -> None:
    keys = {"alice": {"sha256": token_hash(new_token()), "scopes": ["upload", "read"]}}
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys)
    with running(settings) as live:
        page = httpx.get(live.url + "/")
        assert page.status_code == 200 and 'data-keys="on"' in page.text  # the page shows its key field


# --- a real browser ---


@contextmanager
def serve_process(data_dir: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``transfer serve`` as a person runs it, in its own process (so that it can be killed outright)."""
    env = {**os.environ, "TRANSFER_LOG_LEVEL": "warning"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--data-dir", str(data_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("transfer serve did not start: " + log.read_text()[-2000:])
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def row_state(page: Any) -> dict[str, str]:
    state: dict[str, str] = page.evaluate("() => ({...document.querySelector('#uploads li').dataset})")
    return state


@pytest.mark.slow
@pytest.mark.e2e
def test_browser_upload_survives_a_server_restart(tmp_path: Path) -> None:
    if not Path(CHROMIUM).is_file() or shutil.which("node") is None:
        pytest.fail("chromium is not installed: run `make install` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    data = os.urandom(50 * MiB)
    src = tmp_path / "report-for-agents.bin"
    src.write_bytes(data)
    data_dir, port, log = tmp_path / "data", free_port(), tmp_path / "serve.log"
    base = f"http://127.0.0.1:{port}"
    minutes = 60_000
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 640})
            page.set_default_timeout(5 * minutes)
            with serve_process(data_dir, port, log) as first:
                page.goto(base + "/")
                page.wait_for_function("() => window.tus && window.tus.isSupported")
                assert page.is_hidden("#key") and page.is_hidden("#missing")  # no keys configured, nothing missing
                # a slow uplink (Chromium's own throttling), so that the server can be stopped mid-way
                cdp = page.context.new_cdp_session(page)
                conditions = {"offline": False, "latency": 0, "downloadThroughput": -1}
                cdp.send("Network.emulateNetworkConditions", {**conditions, "uploadThroughput": 4 * MiB})
                page.set_input_files("#pick", str(src))
                page.wait_for_function("() => document.querySelector('#uploads progress')?.value >= 40")
                first.send_signal(signal.SIGKILL)  # the server dies mid-upload: no goodbye to anyone
                first.wait(timeout=30)
                page.wait_for_function("() => document.querySelector('#uploads li').dataset.state === 'retrying'")
            upload_url = row_state(page)["uploadUrl"]
            with serve_process(data_dir, port, log):  # same data dir, same port
                offset = int(httpx.head(upload_url, headers={"tus-resumable": "1.0.0"}).headers["upload-offset"])
                assert 0 < offset < len(data)  # stopped part way; the PATCHes that had arrived were kept
                cdp.send("Network.emulateNetworkConditions", {**conditions, "uploadThroughput": -1})
                page.wait_for_function("() => document.querySelector('#uploads li').dataset.state === 'done'")
                state = row_state(page)
                assert state["resumed"] == "yes"
                file_id = state["fileId"]
                page.wait_for_selector(f'#files tr[data-file-id="{file_id}"]')  # listed, with its buttons
                if os.environ.get(SCREENSHOT_ENV):
                    page.screenshot(path=os.environ[SCREENSHOT_ENV], full_page=True)
                descriptor = httpx.get(f"{base}/v1/files/{file_id}").json()
                assert descriptor["name"] == src.name and descriptor["size"] == len(data)
                assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
                sha = hashlib.sha256()
                with httpx.stream("GET", descriptor["url"], timeout=120) as body:
                    for piece in body.iter_bytes():
                        sha.update(piece)
                assert sha.hexdigest() == hashlib.sha256(data).hexdigest()
                assert hashlib.sha256(httpx.get(upload_url, timeout=120).content).digest() == sha.digest()
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_docs_and_redoc_render_offline_in_a_browser(site: LiveServer) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.fail("chromium is not installed: run `make install` (apt-get install chromium)")
    from playwright.sync_api import Route, sync_playwright

    elsewhere: list[tuple[str, str]] = []

    def offline(route: Route) -> None:  # the machine may be offline: any request off this service fails
        if route.request.url.startswith(site.url + "/"):
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
            refused: list[str] = []  # what the pages' policies stopped (reported on the console)
            page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
            page.goto(site.url + "/docs")
            page.wait_for_selector(".swagger-ui .info .title")
            page.wait_for_selector(".opblock-tag")  # the operations, drawn from /openapi.json
            page.goto(site.url + "/redoc")
            page.wait_for_selector("h1")
            assert "transfer" in page.inner_text("h1").lower()
            page.goto(site.url + "/")
            page.wait_for_function("() => window.tus && window.tus.isSupported")
        finally:
            browser.close()
    # Redoc's menu asks for a "by Redocly" logo from its CDN and hides it when that fails: the page's policy keeps
    # even that request from leaving, so nothing at all goes elsewhere
    assert elsewhere == []
    assert [text for text in refused if "cdn.redoc.ly" not in text] == [], refused  # the logo, and nothing else


UPPY_UPLOAD = """
async (size) => {
  const { Uppy, Tus } = window.Uppy;
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i += 65536) crypto.getRandomValues(bytes.subarray(i, Math.min(size, i + 65536)));
  const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join("");
  const uppy = new Uppy();
  uppy.use(Tus, { endpoint: "/tus/files/", chunkSize: 4 * 1024 * 1024, retryDelays: [0, 1000, 3000] });
  uppy.addFile({ name: "from-uppy.bin", type: "application/octet-stream", data: new Blob([bytes]) });
  const result = await uppy.upload();
  if (result.failed.length) throw new Error(String(result.failed[0].error));
  const url = result.successful[0].uploadURL;
  const opened = await (await fetch(url)).arrayBuffer();  // what Uppy's previews and "open file" do
  return { url, sent: hex(await crypto.subtle.digest("SHA-256", bytes)),
           opened: hex(await crypto.subtle.digest("SHA-256", opened)) };
}
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_uppy_uploads_through_the_trailing_slash_endpoint_and_opens_the_file(site: LiveServer) -> None:
    uppy = Path(__file__).resolve().parents[2] / "transfer" / "web" / "node_modules" / "uppy" / "dist"
    if not Path(CHROMIUM).is_file() or not (uppy / "uppy.min.js").is_file():
        pytest.fail("chromium or Uppy is not installed: run `make install`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            # Uppy is not part of the page: the test injects it (past the page's CSP) into the service's origin
            page = browser.new_context(bypass_csp=True).new_page()
            page.set_default_timeout(180_000)
            page.goto(site.url + "/")
            page.add_script_tag(path=str(uppy / "uppy.min.js"))
            outcome = page.evaluate(UPPY_UPLOAD, 10 * MiB + 7)
        finally:
            browser.close()
    assert outcome["url"].startswith(site.url + "/tus/files/t_")
    assert outcome["opened"] == outcome["sent"]
    served = httpx.get(outcome["url"], timeout=60).content
    assert hashlib.sha256(served).hexdigest() == outcome["sent"] and len(served) == 10 * MiB + 7
