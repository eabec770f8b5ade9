"""Deployment files: docker-compose.yml against the Compose Specification's JSON schema (offline: Docker's compose
plugin is not installed here, see test_docker_compose_config), closed by default (its secrets required and generated
by deploy/compose-env.py, the bucket's port unpublished, every container read-only without capabilities; the service
run with the environment Compose would give it), and the Grafana dashboard against a real /metrics scrape."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import transfer
from tests.conftest import running
from tests.ops.test_closed import image_env, refused, serving
from transfer.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "transfer.json"


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with the Compose Specification schema it ships (no network)."""
    checker = Path(sys.executable).with_name("check-jsonschema")
    return subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_follows_the_compose_specification(tmp_path: Path) -> None:
    result = check_compose(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    # the validator does refuse what Compose would refuse (so the pass above means something)
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["seaweedfs"]["healthcheck"]["intervall"] = "5s"
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert check_compose(tmp_path / "broken.yml").returncode != 0


def test_compose_pins_images_and_uses_health_checks_their_images_support() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    for name, service in services.items():
        image = service.get("image")
        assert image is not None, f"{name}: every service names its image (ours is built once and shared)"
        reference, _, digest = image.partition("@")
        assert not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{name}: {digest} is not a digest"
        tag = reference.rsplit(":", 1)[1] if ":" in reference.rsplit("/", 1)[-1] else ""
        assert tag and tag != "latest", f"{name}: image {image} is not pinned by a tag"
    built = {name for name, service in services.items() if "build" in service}
    assert {services[name]["image"] for name in built} == {f"agent-transfer:{transfer.__version__}"}
    # the default profile: SeaweedFS, no MinIO image anywhere in it
    default = {name for name, service in services.items() if "profiles" not in service}
    assert default == {"seaweedfs", "bucket", "transfer"}
    assert (
        services["seaweedfs"]["image"].startswith("chrislusf/seaweedfs:")
        and "@sha256:" in services["seaweedfs"]["image"]
    )
    assert services["seaweedfs"]["healthcheck"]["test"][1] == "wget"  # busybox in the Alpine image; no curl
    assert services["transfer"]["depends_on"]["bucket"]["condition"] == "service_completed_successfully"
    assert services["transfer"]["environment"]["TRANSFER_S3_ENDPOINT_URL"] == "http://seaweedfs:8333"
    # MinIO only behind its profile, wired the same way
    for name in ("minio", "minio-bucket", "transfer-minio"):
        assert services[name]["profiles"] == ["minio"], name
    assert services["minio"]["healthcheck"]["test"] == ["CMD", "mc", "--config-dir", "/tmp/mc", "ready", "local"]
    assert services["transfer-minio"]["environment"]["TRANSFER_S3_ENDPOINT_URL"] == "http://minio:9000"
    # three replicas behind HAProxy, which takes a draining replica out on its /readyz
    replicas, haproxy = services["transfer-replicas"], services["haproxy"]
    assert replicas["deploy"]["replicas"] == 3 and replicas["profiles"] == haproxy["profiles"] == ["replicas"]
    config = compose["configs"]["haproxy"]["content"]
    assert "server-template transfer 3 transfer-replicas:8080" in config and "httpchk GET /readyz" in config
    # the service itself: readiness as its health check, and Docker's SIGKILL after our drain and grace
    known = {f"TRANSFER_{field.upper()}" for field in Settings.model_fields}
    for name in ("transfer", "transfer-replicas", "transfer-minio"):
        service = services[name]
        passed = {k for k in service["environment"] if k.startswith("TRANSFER_")}
        assert passed <= known, f"{name}: settings the service does not read: {sorted(passed - known)}"
        assert "/readyz" in " ".join(service["healthcheck"]["test"])
        env = service["environment"]
        drain, grace = float(env["TRANSFER_SHUTDOWN_DRAIN"]), float(env["TRANSFER_SHUTDOWN_GRACE"])
        assert float(service["stop_grace_period"].rstrip("s")) > drain + grace, name


@pytest.mark.s3
def test_the_bucket_init_makes_the_bucket_on_a_real_s3_server(s3_env: dict[str, str]) -> None:
    """The compose file's one-shot bucket command, run as written against the suite's S3 server."""
    compose = yaml.safe_load(COMPOSE.read_text())
    command = compose["services"]["bucket"]["command"]
    assert command[:2] == ["python", "-c"]
    import boto3

    bucket = "compose-init-" + os.urandom(4).hex()
    script = command[2].replace('"transfer"', repr(bucket))
    env = {**os.environ, "ENDPOINT": os.environ["TRANSFER_S3_ENDPOINT_URL"]}
    for _ in range(2):  # and again: it is idempotent, as a restarted init must be
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, result.stderr
    s3 = boto3.client("s3", endpoint_url=os.environ["TRANSFER_S3_ENDPOINT_URL"])
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.delete_bucket(Bucket=bucket)


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="Docker's compose plugin is not installed here (the docker client alone has no `compose`)",
)
def test_docker_compose_config() -> None:
    for profile in ([], ["--profile", "replicas"], ["--profile", "minio"]):
        result = subprocess.run(
            ["docker", "compose", "-f", str(COMPOSE), *profile, "config", "--quiet"], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr


def test_every_metric_of_the_dashboard_is_in_a_real_scrape(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    queried = {name for expr in exprs for name in re.findall(r"\b((?:transfer|process)_[a-z0-9_]+)\b", expr)}
    assert len(queried) >= 15

    with running(Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})) as live:
        assert httpx.post(f"{live.url}/v1/files", params={"name": "x"}, content=b"x" * 5000).status_code == 201
        text = httpx.get(f"{live.url}/metrics", headers={"accept": "text/plain"}).text
    exposed: set[str] = set()
    for family in text_string_to_metric_families(text):
        # a labelled metric nobody touched yet has its HELP and TYPE but no sample: its series names follow its type
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
        exposed.update(family.name + suffix for suffix in suffixes)
        exposed.update(sample.name for sample in family.samples)
    missing = sorted(queried - exposed)
    assert not missing, f"the dashboard queries metrics the service does not expose: {missing}"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}" and panel["title"]


# --- closed by default ---------------------------------------------------------------------------------------------

SECRET_VARIABLES = {"TRANSFER_API_KEYS", "TRANSFER_SIGNING_KEYS", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"}
_VARIABLE = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[?-])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(node: Any, env: dict[str, str], missing: list[str]) -> Any:
    """``node`` with Compose's interpolation applied (``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``); every required variable not set adds its error to
    ``missing``, as ``docker compose`` would refuse with it."""
    if isinstance(node, dict):
        return {key: interpolate(value, env, missing) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env, missing) for value in node]
    if not isinstance(node, str):
        return node

    def value(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        operator, word = match.group(2), match.group(3) or ""
        found = env.get(name)
        unset = found is None or (operator is not None and operator.startswith(":") and not found)
        if unset and operator in ("?", ":?"):
            missing.append(f"{name}: {word}")
            return ""
        if unset and operator in ("-", ":-"):
            return word
        return found or ""

    return _VARIABLE.sub(value, node)


def compose_env(tmp_path: Path) -> tuple[dict[str, str], str]:
    """The variables deploy/compose-env.py writes (its .env, read as Compose reads it) and the admin key it printed."""
    out = tmp_path / ".env"
    made = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "compose-env.py"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    env = {}
    for line in out.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, quoted = line.partition("=")
            assert quoted[0] == quoted[-1] == "'"  # single quotes: Compose takes the value as it is
            env[name] = quoted[1:-1]
    again = subprocess.run([sys.executable, str(ROOT / "deploy" / "compose-env.py"), "--output", str(out)])
    assert again.returncode == 1  # never overwritten
    return env, made.stdout.strip()


def test_compose_publishes_no_bucket_port_and_hardens_every_container() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    published = {name: service["ports"] for name, service in services.items() if "ports" in service}
    assert published == {"transfer": ["8080:8080"], "transfer-minio": ["8081:8080"], "haproxy": ["8090:8090"]}
    assert "expose" not in services["seaweedfs"] and "expose" not in services["minio"]
    for name, service in services.items():
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"] and "/tmp" in service["tmpfs"], name
        assert "privileged" not in service and "cap_add" not in service and "network_mode" not in service, name
    # SeaweedFS as its image's own user: as root its entrypoint would chown and switch users (capabilities)
    assert services["seaweedfs"]["user"] == "1000:1000"


def test_compose_requires_its_secrets_and_fixes_none() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    text = yaml.safe_dump(compose)  # the values Compose interpolates (comments dropped)
    used = {m.group(1) or m.group(4) for m in _VARIABLE.finditer(text) if m.group(0) != "$$"}
    assert used == SECRET_VARIABLES
    for match in _VARIABLE.finditer(text):
        assert match.group(2) == ":?", f"{match.group(0)}: a secret with a default is a fixed secret"
    services = compose["services"]
    for name, service in services.items():
        for variable in ("AWS_SECRET_ACCESS_KEY", "MINIO_ROOT_PASSWORD", "TRANSFER_API_KEYS", "TRANSFER_SIGNING_KEYS"):
            if variable in service.get("environment", {}):
                assert service["environment"][variable].startswith("${"), (name, variable)
    for name in ("transfer", "transfer-replicas", "transfer-minio"):
        assert {"TRANSFER_API_KEYS", "TRANSFER_SIGNING_KEYS"} <= set(services[name]["environment"]), name
    assert "transfer-secret" not in COMPOSE.read_text()

    missing: list[str] = []
    interpolate(compose, {}, missing)  # `docker compose up` with no .env: refused, saying what to run
    assert {entry.split(":")[0] for entry in missing} == SECRET_VARIABLES
    assert all(entry.endswith("run python3 deploy/compose-env.py first") for entry in missing)


def test_compose_with_its_generated_env_is_valid_and_wires_one_identity(tmp_path: Path) -> None:
    env, _ = compose_env(tmp_path)
    missing: list[str] = []
    resolved = interpolate(yaml.safe_load(COMPOSE.read_text()), env, missing)
    assert missing == []
    (tmp_path / "resolved.yml").write_text(yaml.safe_dump(resolved))
    result = check_compose(tmp_path / "resolved.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    identity = json.loads(resolved["configs"]["seaweedfs-s3"]["content"])["identities"][0]["credentials"][0]
    services = resolved["services"]
    for name in ("bucket", "minio-bucket", "transfer", "transfer-replicas", "transfer-minio"):
        creds = services[name]["environment"]
        assert (creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"]) == (
            identity["accessKey"],
            identity["secretKey"],
        ), name
    minio = services["minio"]["environment"]
    assert (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]) == (identity["accessKey"], identity["secretKey"])


def compose_service_env(tmp_path: Path, env: dict[str, str], service: str = "transfer") -> dict[str, str]:
    """What `transfer serve` gets in Compose's ``service``: the image's ENV overlaid with the service's environment."""
    missing: list[str] = []
    resolved = interpolate(yaml.safe_load(COMPOSE.read_text()), env, missing)
    return image_env(tmp_path, **resolved["services"][service]["environment"])


def test_the_service_as_compose_starts_it_refuses_to_run_open(tmp_path: Path) -> None:
    env, _ = compose_env(tmp_path)
    for dropped in ("TRANSFER_API_KEYS", "TRANSFER_SIGNING_KEYS"):  # as if someone deleted the line from the file
        started = compose_service_env(tmp_path, env)
        del started[dropped]
        line = refused(started, tmp_path)
        code = "open_mode_refused" if dropped == "TRANSFER_API_KEYS" else "signing_keys_required"
        assert line.startswith(f"transfer: {code}: "), line


@pytest.mark.s3
def test_the_service_as_compose_starts_it_serves_with_keys(s3_env: dict[str, str], tmp_path: Path) -> None:
    """Compose's environment for the service, on all interfaces as in its container; only where the bucket is (and
    its credentials) replaced by the suite's S3 server: keys are asked for, the generated admin key works, a URL signed
    with the generated signing key serves the file."""
    env, admin = compose_env(tmp_path)
    started = compose_service_env(tmp_path, env)
    assert started["TRANSFER_HOST"] == "0.0.0.0"
    bucket_only = ("TRANSFER_S3_BUCKET", "TRANSFER_S3_ENDPOINT_URL", "TRANSFER_S3_ATOMIC_IF_ABSENT")
    started.update({k: s3_env[k] for k in (*bucket_only, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")})
    started.update(TRANSFER_PUBLIC_URL=f"http://127.0.0.1:{started['TRANSFER_PORT']}", TRANSFER_SINGLE_REPLICA="true")
    with serving(started, tmp_path) as (url, _):
        assert httpx.get(url + "/v1/files").status_code == 401
        key = {"authorization": f"Bearer {admin}"}
        data = os.urandom(5000)
        made = httpx.post(url + "/v1/files", params={"name": "c.bin", "inline": "false"}, content=data, headers=key)
        assert made.status_code == 201, made.text
        assert httpx.get(made.json()["url"]).content == data  # signed with .env's key, no API key needed
