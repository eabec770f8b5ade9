"""The documentation site's generated pages, written from the code at build time so that they cannot drift from it.

MkDocs loads this file as a hook (``hooks:`` in ``mkdocs.yml``); ``on_files`` adds three pages and one file that are
never committed:

    operations/configuration.md   every field of ``transfer.settings.Settings`` (its variable, default, bounds, flag
                                  and description) plus the few variables read outside it (``OTHER_VARIABLES``)
    reference/http-api.md         every operation of the service's own OpenAPI document, and its schemas
    reference/openapi.json        that document
    reference/cli.md              every ``transfer`` command, from the argument parser
    reference/errors.md           every error of ``transfer.errors``: its status, code and meaning

A setting without a description stops the build: the reference would otherwise say nothing about it.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import re
import tempfile
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

GENERATED_NOTE = "This page is generated from the code at every build of the site; it is not edited by hand."

# variables read outside the settings class, by the command-line client or by the libraries the service uses
OTHER_VARIABLES: list[tuple[str, str, str]] = [
    ("TRANSFER_SERVER", "`http://127.0.0.1:8080`", "the service the `transfer` client commands talk to (`--server`)"),
    ("TRANSFER_API_KEY", "none", "the API key the `transfer` client commands send (`--api-key`)"),
    (
        "SSL_CERT_FILE / SSL_CERT_DIR",
        "the certifi bundle",
        "CA certificates the client trusts for `https://` servers instead of its default bundle (a private CA); "
        "`--ca-cert FILE` does the same for one command",
    ),
    (
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN",
        "the AWS chain",
        "credentials of the bucket (`TRANSFER_STORAGE=s3`), read by boto3 with the rest of its chain (profiles, "
        "instance roles); placeholders and published defaults are refused at start",
    ),
    (
        "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / AWS_REGION",
        "AWS",
        "defaults of `TRANSFER_S3_ENDPOINT_URL` (the S3-specific variable first) and `TRANSFER_S3_REGION`",
    ),
    (
        "XDG_CACHE_HOME",
        "`~/.cache`",
        "where `transfer upload --chunked / --direct / --resumable` remembers uploads to resume "
        "(`$XDG_CACHE_HOME/transfer/sessions`; `--state-dir` for one command)",
    ),
    (
        "TRANSFER_NO_REEXEC",
        "unset",
        "set by `transfer serve` when it re-executes itself with `MALLOC_MMAP_THRESHOLD_=4194304` and "
        "`MALLOC_TRIM_THRESHOLD_=268435456` (glibc's thresholds; without them each fresh 256 KiB socket buffer "
        "page-faults); set it yourself to keep your own allocator settings",
    ),
]

# sections of the configuration page: a field goes to the first whose patterns match its name
SECTIONS: list[tuple[str, list[str]]] = [
    (
        "Listening, HTTP and TLS",
        ["host", "port", "public_url", "allowed_hosts", "trusted_proxies", "allow_open_mode", "cors_allow_origins"]
        + ["http_*", "http2", "h2_*", "tls_*", "max_header_size", "metrics_*"],
    ),
    ("API keys and signed URLs", ["api_keys", "signing_*", "url_ttl", "default_download_method"]),
    ("Storage", ["storage", "data_dir", "local_sync", "single_replica"]),
    ("S3", ["s3_*"]),
    (
        "Uploads and downloads",
        ["inline_threshold", "max_upload_size", "max_decode_ratio", "max_ranges", "buffer_size", "gzip_level"]
        + ["zstd_level", "compress_on_the_fly", "serve_active_types_inline", "max_description_length"]
        + ["max_json_body", "max_bundle_items", "dedup*", "resumable_*", "session_*", "live_read_timeout"]
        + ["max_open_*"],
    ),
    ("Lifetimes and quotas", ["default_file_ttl", "max_file_ttl", "quota_reservation_ttl"]),
    ("Server-side fetches (imports, TP mounts, MCP resolve)", ["fetch_*"]),
    ("Progress jobs and event streams", ["job_*", "max_jobs", "max_waiting_jobs", "sse_heartbeat"]),
    ("Agent protocols: TP and MCP", ["tp_*", "mcp_*"]),
    ("Logs, probes, shutdown and the web page", ["log_format", "readiness_*", "shutdown_*", "web_assets_dir"]),
    ("Other", ["*"]),
]

_BYTE_WORDS = ("size", "budget", "bytes", "window", "threshold", "body")
_SECOND_WORDS = ("ttl", "timeout", "interval", "age", "grace", "drain", "retention", "heartbeat", "budget")
_SECOND_WORDS += ("keep_alive",)


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,}"


def _seconds(n: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if n >= length and n % length == 0:
            return f"{n:g} s ({n / length:g} {unit})"
    return f"{n:g} s"


def _value(name: str, value: Any) -> str:
    """A default or bound as a reader wants it: sizes in KiB/MiB/GiB, durations in seconds (and hours)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, int | float) and not name.endswith(("_level", "_ratio", "_rate")):
        if any(word in name for word in _BYTE_WORDS) and isinstance(value, int) and value >= 1024:
            return _bytes(value)
        if any(word in name for word in _SECOND_WORDS):
            return _seconds(float(value))
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, list | dict):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is not None and str(origin) == "typing.Literal":
        return " \\| ".join(f"`{a}`" for a in args)
    if args and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return _type(inner[0]) if len(inner) == 1 else " or ".join(_type(a) for a in inner)
    if origin in (list, dict):
        return "JSON " + ("list" if origin is list else "object")
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    return {int: "integer", float: "number", str: "string", bool: "boolean", Path: "path"}.get(annotation, "value")


def _bounds(name: str, metadata: list[Any]) -> str:
    words = []
    for item in metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                words.append(f"{sign} {_value(name, getattr(item, attr)).strip('`')}")
    return ", ".join(words)


def _serve_flags() -> dict[str, str]:
    """``TRANSFER_X`` → the ``transfer serve`` flag whose help names it."""
    from transfer.cli import build_parser

    parser = build_parser()
    serve = _subparsers(parser)["serve"]
    flags: dict[str, str] = {}
    for action in serve._actions:
        for var in re.findall(r"TRANSFER_[A-Z0-9_]+", action.help or ""):
            if action.option_strings:
                flags.setdefault(var, " / ".join(action.option_strings))
    return flags


def configuration_page() -> str:
    """The configuration reference: one table per section, one row per setting, nothing left out."""
    from transfer.settings import Settings

    flags = _serve_flags()
    fields = dict(Settings.model_fields)
    placed: dict[str, list[str]] = {title: [] for title, _ in SECTIONS}
    for name, field in fields.items():
        if not field.description:
            raise ValueError(f"Settings.{name} has no description: the configuration reference cannot explain it")
        title = next(t for t, patterns in SECTIONS if any(fnmatch.fnmatchcase(name, p) for p in patterns))
        placed[title].append(name)
    out = [
        "# Configuration reference",
        "",
        "Every setting of `transfer serve` (and `transfer mcp`) is an environment variable `TRANSFER_<NAME>`; a few "
        "have a command-line flag as well, which wins over the variable. Values are validated once at start-up: a "
        "bad one stops the service with `transfer: invalid_settings: …` naming it (a secret's value is never "
        "repeated). Lists and objects are JSON, e.g. `TRANSFER_ALLOWED_HOSTS='[\"files.example.com\"]'`.",
        "",
        f"!!! note\n    {GENERATED_NOTE} Source: `transfer/settings.py`.",
        "",
    ]
    for title, names in placed.items():
        if not names:
            continue
        out += [f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        for name in names:
            field = fields[name]
            var = f"TRANSFER_{name.upper()}"
            default = field.get_default(call_default_factory=True)
            cell = f'<span id="{var.lower()}"></span>`{var}`'
            if var in flags:
                cell += f"<br>`{flags[var]}`"
            meaning = _cell(field.description)
            kind = _type(field.annotation)
            bounds = _bounds(name, list(field.metadata))
            extra = ", ".join(part for part in (kind, bounds) if part)
            out.append(f"| {cell} | {_value(name, default)} | {meaning} ({extra}) |")
        out.append("")
    out += [
        "## Read outside the settings",
        "",
        "| variable | default | meaning |",
        "|---|---|---|",
        *(f"| `{var}` | {default} | {meaning} |" for var, default, meaning in OTHER_VARIABLES),
        "",
    ]
    return "\n".join(out)


# --- the HTTP API --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    """No TRANSFER_* variable of the shell that builds the site leaks into the documented application."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("TRANSFER_")}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the service serves at /openapi.json, from an application built with default settings."""
    from transfer.hosts import create_app
    from transfer.settings import Settings

    with _clean_environment(), tempfile.TemporaryDirectory() as data:
        document: dict[str, Any] = create_app(Settings(data_dir=Path(data))).openapi()
    return document


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_schema_text(s) for s in schema[key] if s.get("type") != "null"]
            nullable = any(s.get("type") == "null" for s in schema[key])
            return " or ".join(parts) + (" or null" if nullable else "")
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_text(schema.get('items', {}))}"
    return str(kind)


def _cell(text: str | None) -> str:
    """Text for one table cell: one line, no column break, no angle bracket taken for an HTML tag."""
    parts = " ".join((text or "").split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # outside code spans (inside them Markdown shows the text as it is)
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def http_api_page(document: dict[str, Any]) -> str:
    """Every path and method of the OpenAPI document, by tag, then every schema, as one page."""
    out = [
        "# HTTP API reference",
        "",
        f"{document['info']['description']} Version {document['info']['version']}.",
        "",
        "A running service serves the same document at `/openapi.json`, browsable at `/docs` (Swagger UI) and "
        "`/redoc`; [openapi.json](openapi.json) is a copy. Errors are always JSON, "
        '`{"error": {"code", "message", "status", "detail"?}}`: see [Errors](errors.md). Routes that need a key '
        "take `Authorization: Bearer <key>` when API keys are configured (see [Keys](../concepts/keys.md)).",
        "",
        f"!!! note\n    {GENERATED_NOTE} Source: the service's own OpenAPI document.",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in ("get", "put", "post", "delete", "patch", "head", "options"):
                tag = (operation.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((method.upper(), path, operation))
    for tag, operations in by_tag.items():
        out += [f"## {tag}", ""]
        for method, path, operation in operations:
            out += [f"### `{method} {path}` {{#{operation['operationId']}}}", ""]
            if operation.get("summary"):
                out += [operation["summary"] + ("" if operation["summary"].endswith(".") else "."), ""]
            if operation.get("description"):
                out += [operation["description"].strip(), ""]
            parameters = operation.get("parameters", [])
            if parameters:
                out += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
                for p in parameters:
                    required = " (required)" if p.get("required") else ""
                    meaning = _cell(p.get("description") or p.get("schema", {}).get("description"))
                    out.append(
                        f"| `{p['name']}`{required} | {p['in']} | {_schema_text(p.get('schema', {}))} | {meaning} |"
                    )
                out.append("")
            body = operation.get("requestBody")
            if body:
                kinds = ", ".join(
                    f"`{ctype}`" + (f" ({_schema_text(c['schema'])})" if c.get("schema") else "")
                    for ctype, c in body.get("content", {}).items()
                )
                out += [f"Request body: {kinds}.", ""]
            responses = operation.get("responses", {})
            if responses:
                out += ["| status | meaning |", "|---|---|"]
                for status, response in responses.items():
                    out.append(f"| {status} | {_cell(response.get('description'))} |")
                out.append("")
    out += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        out += [f"### {name} {{#schema-{name.lower()}}}", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        properties = schema.get("properties", {})
        if properties:
            required = set(schema.get("required", []))
            out += ["| field | type | meaning |", "|---|---|---|"]
            for field, spec in properties.items():
                mark = " (required)" if field in required else ""
                out.append(f"| `{field}`{mark} | {_schema_text(spec)} | {_cell(spec.get('description'))} |")
            out.append("")
        elif "enum" in schema:
            out += [f"One of {_schema_text(schema)}.", ""]
    return "\n".join(out)


# --- the command line ----------------------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command(out: list[str], name: str, parser: argparse.ArgumentParser, summary: str) -> None:
    children = _subparsers(parser)
    out += [f"## `{name}`", ""]
    if summary:
        out += [summary[0].upper() + summary[1:] + ".", ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) else f" (default: `{default}`)"
        choices = f" — one of {', '.join(f'`{c}`' for c in action.choices)}" if action.choices else ""
        rows.append(f"| {names} | {_cell(action.help)}{choices}{shown} |")
    if rows:
        out += ["| argument | meaning |", "|---|---|", *rows, ""]
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    for child, child_parser in children.items():
        _command(out, f"{name} {child}", child_parser, helps.get(child, ""))


def cli_page() -> str:
    """Every ``transfer`` command and option, as the parser defines them."""
    from transfer.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"  # argparse wraps usage lines to the terminal: the page should not depend on it
    try:
        parser = build_parser()
        out = [
            "# Command-line reference",
            "",
            "`transfer` runs the service (`serve`, `mcp`) and talks to one (everything else). Every failure is one "
            "line on stderr, `transfer: <code>: <message>`, and a non-zero exit status: 2 for usage errors, 1 "
            "otherwise. The [command-line guide](../guide/cli.md) shows them at work.",
            "",
            f"!!! note\n    {GENERATED_NOTE} Source: `transfer --help` of every command.",
            "",
        ]
        helps: dict[str, str] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in _subparsers(parser).items():
            _command(out, f"transfer {name}", sub, helps.get(name, ""))
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(out)


# --- the errors --------------------------------------------------------------------------------------------------


def errors_page() -> str:
    """Every subclass of ``TransferError``, by status and code, with the meaning the error tree's docstring gives."""
    from transfer import errors

    notes: dict[str, str] = {}
    for line in (errors.__doc__ or "").splitlines():
        found = re.search(r"(\w+)\s+\d{3} \S+\s+\((.*)\)\s*$", line)
        if found:
            notes[found.group(1)] = found.group(2)
    rows: list[tuple[int, str, str, str]] = []
    seen: set[type] = set()
    pending: list[type] = [errors.TransferError]
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        meaning = notes.get(cls.__name__) or (" ".join(doc.split()) if cls.__doc__ else "")
        rows.append((int(cls.status), str(cls.code), cls.__name__, meaning))
    out = [
        "# Errors",
        "",
        "Every error, from every door, is one of these: a stable `code` and an HTTP status. The HTTP API answers with "
        'a JSON body, `{"error": {"code", "message", "status", "detail"?}}` (IETF resumable uploads: RFC 9457 '
        "problem details carrying the same `code`); the command line prints `transfer: <code>: <message>`; MCP "
        "tools return the JSON body as a tool error; the Python client raises the class named here "
        "(`transfer.errors`). A status of 408, 429, 502, 503, 504 or 507 may succeed later unchanged "
        "(`Retry-After` says when); the others will not.",
        "",
        f"!!! note\n    {GENERATED_NOTE} Source: `transfer/errors.py`.",
        "",
        "| status | code | Python class | meaning |",
        "|---|---|---|---|",
        *(
            f"| {status} | `{code}` | `{name}` | {_cell(meaning)} |"
            for status, code, name, meaning in sorted(rows, key=lambda r: (r[0], r[1], r[2]))
        ),
        "",
    ]
    return "\n".join(out)


# --- the MkDocs hook -----------------------------------------------------------------------------------------------


def generated_files() -> dict[str, str]:
    """Every generated file of the site, by its path under docs/."""
    document = openapi_document()
    return {
        "operations/configuration.md": configuration_page(),
        "reference/http-api.md": http_api_page(document),
        "reference/openapi.json": json.dumps(document, indent=2),
        "reference/cli.md": cli_page(),
        "reference/errors.md": errors_page(),
    }


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated pages to the site's files (they exist only in the build)."""
    from mkdocs.structure.files import File

    for path, content in generated_files().items():
        files.append(File.generated(config, path, content=content))
    return files


_SPHINX_ROLE = re.compile(r":(?:meth|class|func|attr|mod|exc|data|obj):(?=<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    """MkDocs hook: the docstrings' Sphinx roles (``:meth:`aclose```) read as plain code in the client reference."""
    return _SPHINX_ROLE.sub("", html)
