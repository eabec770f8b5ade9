"""Deployment files: docker-compose.yml against the Compose Specification's JSON schema (offline: Docker's compose
plugin is not installed here, see test_docker_compose_config), and the Grafana dashboard against a real /metrics
scrape."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import running
from transfer.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
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
    broken["services"]["minio"]["healthcheck"]["intervall"] = "5s"
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert check_compose(tmp_path / "broken.yml").returncode != 0


def test_compose_pins_images_and_uses_health_checks_their_images_support() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    for name, service in services.items():
        image = service.get("image")
        if image is not None:
            tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
            assert tag and tag != "latest", f"{name}: image {image} is not pinned by a tag"
    # MinIO images carry no curl since late 2023; `mc` is in the image
    assert services["minio"]["healthcheck"]["test"] == ["CMD", "mc", "ready", "local"]
    assert services["transfer"]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    # the documented alternative, behind a profile, wired the same way
    alternative = services["transfer-seaweedfs"]
    assert alternative["profiles"] == ["seaweedfs"] and services["seaweedfs"]["profiles"] == ["seaweedfs"]
    assert alternative["environment"]["TRANSFER_S3_ENDPOINT_URL"] == "http://seaweedfs:8333"
    assert services["seaweedfs"]["healthcheck"]["test"][1] == "wget"  # busybox in the Alpine image; no curl
    # the service itself: readiness as its health check, and Docker's SIGKILL after our grace
    transfer = services["transfer"]
    assert "/readyz" in " ".join(transfer["healthcheck"]["test"])
    grace = float(transfer["environment"]["TRANSFER_SHUTDOWN_GRACE"])
    assert float(transfer["stop_grace_period"].rstrip("s")) > grace


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="Docker's compose plugin is not installed here (the docker client alone has no `compose`)",
)
def test_docker_compose_config() -> None:
    for profile in ([], ["--profile", "seaweedfs"]):
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
