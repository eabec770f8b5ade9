"""The web page where people hand files to agents (``/``), and the API docs (``/docs``, ``/redoc``), all served by
the service itself: the machine may be offline, so nothing loads from a CDN.

Our own page (``static/``: HTML, JS, CSS) uploads through tus with tus-js-client and lists the caller's files with
copy descriptor / copy URL / delete. The browser libraries (tus-js-client, swagger-ui-dist, redoc) are npm packages
pinned in ``package.json`` + ``package-lock.json`` beside this file; they are never copied into the repository. They
are looked for in ``TRANSFER_WEB_ASSETS_DIR`` when set, else in ``node_modules/`` (a checkout: ``make install`` runs
``npm ci``), else in ``assets/`` (an installed wheel: its build fetched them, see ``setup.py``). Only the files named
in :data:`VENDOR` are served. When one is missing the page says so in words and the asset URLs answer 503
``assets_missing`` with the command that installs them.

These routes are public, like ``/healthz``: they carry no data. Everything the page shows comes from the API with
the key typed into the page.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

from transfer.errors import AssetsMissing, NotFound
from transfer.settings import Settings
from transfer.web.vendor import BUNDLED, VENDOR

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
INSTALL_HINT = (
    "run `make install` (it runs `npm ci` in transfer/web), install the wheel (it carries them) "
    "or set TRANSFER_WEB_ASSETS_DIR"
)

OWN: dict[str, str] = {"app.js": "text/javascript", "app.css": "text/css"}

# the page runs only its own scripts and talks only to this service (CSP Level 3); it may not be framed
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# the API docs, offline: their own library and the schema from this service, nothing from elsewhere (Redoc's menu
# asks Redocly's CDN for a logo: the policy keeps that request from leaving). Both libraries inject their styles at
# run time, and Redoc's search runs in a worker made from a blob; the Swagger UI page has one inline script, allowed
# by its hash
DOCS_POLICY = (
    "default-src 'none'; script-src 'self'{scripts}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src blob:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "content-security-policy": PAGE_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def assets_dir(settings: Settings) -> Path:
    """Where the npm packages' files are: the setting, a checkout's ``node_modules``, or a wheel's ``assets``."""
    if settings.web_assets_dir is not None:
        return settings.web_assets_dir
    checkout = HERE / "node_modules"
    return checkout if checkout.is_dir() else HERE / BUNDLED


def missing_assets(settings: Settings, names: tuple[str, ...] = tuple(VENDOR)) -> list[str]:
    """The npm files among ``names`` that are not installed."""
    root = assets_dir(settings)
    return [VENDOR[n][0] for n in names if not (root / VENDOR[n][0]).is_file()]


def web_router(settings: Settings, *, keys_enabled: bool, title: str, openapi_url: str | None) -> APIRouter:
    """``/`` (the upload page), ``/web/…`` (its files and the vendored libraries), ``/docs`` and ``/redoc`` of
    the application named ``title`` whose OpenAPI document is at ``openapi_url``."""
    router = APIRouter()

    def page() -> str:
        text = (STATIC / "index.html").read_text(encoding="utf-8")
        missing = missing_assets(settings, ("tus.min.js",))
        banner = (
            f'<p class="missing" id="missing">This page needs tus-js-client, which is not installed on the server '
            f"({html.escape(', '.join(missing))}): {html.escape(INSTALL_HINT)}.</p>"
            if missing
            else ""
        )
        return text.replace("{{keys}}", "on" if keys_enabled else "off").replace("{{missing}}", banner)

    @router.get("/", include_in_schema=False)
    async def web_page() -> HTMLResponse:
        return HTMLResponse(page(), headers=PAGE_HEADERS)

    @router.get("/web/{name}", include_in_schema=False)
    async def web_file(name: str) -> Response:
        if name not in OWN:
            raise NotFound(f"no web file {name!r}")
        return FileResponse(STATIC / name, media_type=OWN[name], headers={"cache-control": "no-cache"})

    @router.get("/web/vendor/{name}", include_in_schema=False)
    async def web_vendor(name: str) -> Response:
        if name not in VENDOR:
            raise NotFound(f"no web library file {name!r}")
        if missing_assets(settings, (name,)):
            raise AssetsMissing(f"{VENDOR[name][0]} is not installed: {INSTALL_HINT}")
        path, media_type = VENDOR[name]
        return FileResponse(assets_dir(settings) / path, media_type=media_type, headers={"cache-control": "no-cache"})

    def require(*names: str) -> None:
        missing = missing_assets(settings, names)
        if missing:
            raise AssetsMissing(
                f"the API docs need files that are not installed ({', '.join(missing)}): {INSTALL_HINT}"
            )

    openapi_url = openapi_url or "/openapi.json"

    @router.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        require("swagger-ui-bundle.js", "swagger-ui.css")
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url="/web/vendor/swagger-ui-bundle.js",
            swagger_css_url="/web/vendor/swagger-ui.css",
            swagger_favicon_url="/web/vendor/swagger-favicon.png",
        )
        return with_docs_policy(page)

    @router.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        require("redoc.standalone.js")
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url="/web/vendor/redoc.standalone.js",
            redoc_favicon_url="/web/vendor/swagger-favicon.png",
            with_google_fonts=False,
        )
        return with_docs_policy(page)

    return router


def with_docs_policy(page: HTMLResponse) -> HTMLResponse:
    """``page`` served with :data:`DOCS_POLICY`, its inline scripts allowed by their SHA-256 (CSP Level 2 hashes)."""
    body = bytes(page.body).decode("utf-8")
    hashes = [
        " 'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"
        for script in INLINE_SCRIPT.findall(body)
    ]
    headers = {**PAGE_HEADERS, "content-security-policy": DOCS_POLICY.format(scripts="".join(hashes))}
    return HTMLResponse(body, headers=headers)


INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
