"""The third-party browser files the service serves, as plain data: read by the service (``transfer.web``) and by
the wheel build (``setup.py``, which cannot import the service's dependencies), so that the two never disagree.

Each file comes from an npm package pinned by ``package-lock.json`` beside this module. A checkout serves them from
``node_modules/`` (``npm ci``); a wheel carries exactly these files, with the licences of their packages, under
``assets/`` in the same layout.
"""

from __future__ import annotations

# URL name -> (path inside node_modules, media type): the only third-party files served
VENDOR: dict[str, tuple[str, str]] = {
    "tus.min.js": ("tus-js-client/dist/tus.min.js", "text/javascript"),
    "swagger-ui-bundle.js": ("swagger-ui-dist/swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": ("swagger-ui-dist/swagger-ui.css", "text/css"),
    "swagger-favicon.png": ("swagger-ui-dist/favicon-32x32.png", "image/png"),
    "redoc.standalone.js": ("redoc/bundles/redoc.standalone.js", "text/javascript"),
}

# the licence and notice files that travel with those files (the bundles' own lists of what they bundle included)
LICENCES: tuple[str, ...] = (
    "tus-js-client/LICENSE",
    "swagger-ui-dist/LICENSE",
    "swagger-ui-dist/NOTICE",
    "swagger-ui-dist/swagger-ui-bundle.js.LICENSE.txt",
    "redoc/LICENSE",
    "redoc/bundles/redoc.standalone.js.LICENSE.txt",
)

# the folder of a wheel's copy, beside this module
BUNDLED = "assets"


def package_of(path: str) -> str:
    """The npm package a ``node_modules`` path belongs to (``@scope/name`` or ``name``)."""
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0].startswith("@") else parts[0]
