"""deploy/kubernetes/, offline: every manifest against the Kubernetes API's own JSON schemas (``kubernetes-validate``,
strict: an unknown field fails), the ServiceMonitor against the Prometheus Operator's CRD schema and the
kustomization against SchemaStore's (both vendored in tests/schemas/, sources in its README); then what ties them
together: probes, the shutdown timing, resources from the benchmarks' memory rows, selectors, names, every setting they
pass being one the service reads (the Secret as shipped refused, at start too), the keyless metrics port and the
NetworkPolicy around it. No cluster runs here: `kubectl apply` was not run."""

from __future__ import annotations

import copy
import json
import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from tests.ops.test_closed import image_env, refused
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
KUBERNETES_VERSION = "1.37.0"  # the newest kubernetes-validate ships; preStop's sleep action needs 1.30+


def manifests() -> dict[str, dict[str, Any]]:
    """Every resource of the kustomization, by kind."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    found: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            assert doc["kind"] not in found, f"two {doc['kind']} resources"
            found[doc["kind"]] = doc
    return found


def strict(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields refused, as the API server prunes them (kubeconform's -strict)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            if not out.get("x-kubernetes-preserve-unknown-fields"):
                out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def service_monitor_schema() -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / "servicemonitor-crd.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's, not the CRD's
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


def test_every_manifest_follows_the_kubernetes_api_schema() -> None:
    resources = manifests()
    assert set(resources) == {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
        "NetworkPolicy",
    }
    for kind, resource in resources.items():
        if kind != "ServiceMonitor":
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
    # the validator refuses a misspelt field and a wrong type (so the passes above mean something)
    broken = copy.deepcopy(resources["Deployment"])
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    broken = copy.deepcopy(resources["HorizontalPodAutoscaler"])
    broken["spec"]["minReplicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_service_monitor_and_the_kustomization_follow_their_schemas() -> None:
    schema = service_monitor_schema()
    monitor = manifests()["ServiceMonitor"]
    jsonschema.validate(monitor, schema)
    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)

    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    schema = json.loads((SCHEMAS / "kustomization.schema.json").read_text())
    jsonschema.validate(kustomization, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**kustomization, "resource": kustomization["resources"]}, schema)
    # every manifest of the folder is in it, and only those
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S.glob("*.yaml") if p.stem != "kustomization")
    container = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].split(":")[0] == kustomization["images"][0]["name"]


def test_probes_and_shutdown_timing_match_the_service() -> None:
    resources = manifests()
    config = resources["ConfigMap"]["data"]
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    drain, grace = float(config["TRANSFER_SHUTDOWN_DRAIN"]), float(config["TRANSFER_SHUTDOWN_GRACE"])
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop == drain  # the endpoint leaves the proxies for as long as the service itself would drain
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + grace  # the kubelet's SIGKILL comes after
    # unprivileged, as the image (USER 10001)
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert (
        container["securityContext"]["readOnlyRootFilesystem"]
        and not container["securityContext"]["allowPrivilegeEscalation"]
    )


def quantity_mib(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", value).groups()  # type: ignore[union-attr]
    return float(number) * (1024 if unit == "Gi" else 1)


def test_memory_is_sized_from_the_benchmarks_memory_rows() -> None:
    figures = (ROOT / "docs" / "benchmarks.md").read_text()
    rows = {
        "local": r"\| server peak RSS, 4 GiB file[^|]*\| (\d+) MB \|",
        "s3": r"\| server peak RSS, upload into S3 \| (\d+) MB \|",
    }
    peaks = {name: float(re.search(pattern, figures).group(1)) * 1e6 / 2**20 for name, pattern in rows.items()}  # type: ignore[union-attr]
    (container,) = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"]
    request = quantity_mib(container["resources"]["requests"]["memory"])
    limit = quantity_mib(container["resources"]["limits"]["memory"])
    assert peaks["local"] < peaks["s3"] <= request  # one upload into S3 at its measured peak fits the request
    assert limit >= 2 * request  # and several at once fit the limit before the OOM killer
    assert "cpu" in container["resources"]["requests"]


def test_selectors_names_and_references_agree() -> None:
    resources = manifests()
    deployment, service = resources["Deployment"], resources["Service"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    target = resources["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert resources["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2  # the PDB leaves one to serve
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    monitor = resources["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    refs = {next(iter(ref.values()))["name"] for ref in container["envFrom"]}
    assert refs == {resources["ConfigMap"]["metadata"]["name"], resources["Secret"]["metadata"]["name"]}


def test_every_setting_passed_is_one_the_service_reads_and_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    resources = manifests()
    (container,) = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = dict(resources["ConfigMap"]["data"])
    for name, value in resources["Secret"]["stringData"].items():
        env[name] = value
    env.update({e["name"]: e["value"].replace("$(POD_IP)", "10.1.2.3") for e in container["env"] if "value" in e})
    known = {f"TRANSFER_{name.upper()}" for name in Settings.model_fields}
    passed = {name for name in env if name.startswith("TRANSFER_")}
    assert passed - known == set(), "settings the service does not read (misspelt?)"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # as shipped, every secret is a placeholder: refused, each named (the bucket's once the service's own are real)
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert {e["type"] for e in caught.value.errors()} == {"placeholder_secret"}
    assert {e["loc"] for e in caught.value.errors()} == {("api_keys",), ("signing_keys",)}
    # with the placeholders filled as an operator would, the service's own settings accept every value
    admin = {"admin": {"sha256": token_hash(new_token()), "scopes": ["admin"]}}
    monkeypatch.setenv("TRANSFER_API_KEYS", json.dumps(admin))
    monkeypatch.setenv("TRANSFER_SIGNING_KEYS", json.dumps({"k1": secrets.token_urlsafe(32)}))
    with pytest.raises(ValidationError, match="AWS_ACCESS_KEY_ID is a placeholder"):
        Settings()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA" + secrets.token_hex(8).upper())
    with pytest.raises(ValidationError, match="AWS_SECRET_ACCESS_KEY is a placeholder"):
        Settings()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secrets.token_urlsafe(30))
    settings = Settings()
    assert settings.storage == "s3" and "10.1.2.3" in settings.allowed_hosts
    assert settings.shutdown_drain == 5 and settings.shutdown_grace == 25


def deployment_env(tmp_path: Path) -> dict[str, str]:
    """What the pod's container gets: the image's ENV, the ConfigMap, the Secret as shipped, the container's env."""
    resources = manifests()
    (container,) = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    pod = {e["name"]: e["value"].replace("$(POD_IP)", "10.1.2.3") for e in container["env"] if "value" in e}
    return image_env(tmp_path, **resources["ConfigMap"]["data"], **resources["Secret"]["stringData"], **pod)


def test_the_secret_as_shipped_is_refused_at_start_and_never_repeated(tmp_path: Path) -> None:
    env = deployment_env(tmp_path)
    line = refused(env, tmp_path)
    assert line.startswith("transfer: placeholder_secret: "), line
    assert "TRANSFER_API_KEYS: the API key 'admin': sha256 is a placeholder" in line
    assert "TRANSFER_SIGNING_KEYS: the signing key 'k1' is a placeholder" in line
    assert "REPLACE-with" not in line  # the refusal names the setting, never its value


def test_prometheus_scrapes_a_keyless_metrics_port_only_the_monitoring_namespace_reaches() -> None:
    resources = manifests()
    config = resources["ConfigMap"]["data"]
    (container,) = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(config["TRANSFER_METRICS_PORT"]) != ports["http"]
    service_ports = {p["name"]: p["targetPort"] for p in resources["Service"]["spec"]["ports"]}
    assert service_ports["metrics"] == "metrics"
    (endpoint,) = resources["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    # Prometheus holds no key: no credentials in the monitor, no token in the Secret, no key with its name
    assert not {"authorization", "bearerTokenSecret", "basicAuth"} & set(endpoint)
    assert set(resources["Secret"]["stringData"]) == {
        "TRANSFER_API_KEYS",
        "TRANSFER_SIGNING_KEYS",
        "TRANSFER_SIGNING_KEY_ID",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
    }

    policy = resources["NetworkPolicy"]["spec"]
    pod_labels = resources["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    for rule in policy["ingress"]:
        named = {p["port"] for p in rule["ports"]}
        assert named <= set(ports)
        if "metrics" in named:  # the keyless port: from the monitoring namespace only, never from everywhere
            assert named == {"metrics"}
            (source,) = rule["from"]
            assert source == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert any(rule["ports"] == [{"port": "metrics"}] for rule in policy["ingress"])
    assert any(rule["ports"] == [{"port": "http"}] and "from" not in rule for rule in policy["ingress"])


def test_egress_reaches_the_bucket_and_dns_and_no_private_address() -> None:
    resources = manifests()
    policy = resources["NetworkPolicy"]["spec"]
    endpoint = urlsplit(resources["ConfigMap"]["data"]["TRANSFER_S3_ENDPOINT_URL"])
    namespace = (endpoint.hostname or "").split(".")[1]  # <service>.<namespace>.svc
    allowed = [(peer, {p["port"] for p in rule["ports"]}) for rule in policy["egress"] for peer in rule["to"]]
    assert ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}, {endpoint.port}) in (
        allowed
    )
    assert any(
        peer.get("podSelector", {}).get("matchLabels") == {"k8s-app": "kube-dns"} and ports == {53}
        for peer, ports in allowed
    )
    (public,) = [peer["ipBlock"] for peer, _ in allowed if "ipBlock" in peer]
    assert public["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(public["except"])
