"""Deployment files: docker-compose.yml against the Compose Specification's JSON schema (offline: Docker's compose
plugin is not installed here, see test_docker_compose_config), and the Grafana dashboard against a real /metrics
scrape."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import transfer
from tests.conftest import running
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
    assert services["minio"]["healthcheck"]["test"] == ["CMD", "mc", "ready", "local"]
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
