"""deploy/k8s: the checks ``kubectl apply --dry-run=client`` would make, offline since no
cluster is reachable here (the API's JSON schemas, then the cross-references between
documents); plus the gateway's own: every variable is one it reads and the example values
parse as its configuration does."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.config import ENV_VARIABLES, load_settings
from gateway.security.brute import BruteSettings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
API_VERSIONS = {
    "Namespace": "v1", "Service": "v1", "ConfigMap": "v1", "Secret": "v1",
    "Deployment": "apps/v1", "Job": "batch/v1", "PodDisruptionBudget": "policy/v1",
    "Ingress": "networking.k8s.io/v1", "NetworkPolicy": "networking.k8s.io/v1",
}
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
EXTRA_VARIABLES = {"GATEWAY_LOG_LEVEL", "GATEWAY_CONFIG"}  # read outside Settings' table


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                doc["__file__"] = path.name
                docs.append(doc)
    return docs


DOCS = documents()


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in of_kind("Deployment") + of_kind("Job"):
        yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def test_every_document_has_the_required_fields() -> None:
    assert {d["kind"] for d in DOCS} >= {"Deployment", "Service", "PodDisruptionBudget",
                                         "ConfigMap", "Secret"}
    seen = set()
    for doc in DOCS:
        where = f"{doc['__file__']}: {doc.get('kind')}"
        assert doc.get("kind") in API_VERSIONS, where
        assert doc.get("apiVersion") == API_VERSIONS[doc["kind"]], where
        name = doc.get("metadata", {}).get("name")
        assert isinstance(name, str) and DNS_1123.match(name) and len(name) <= 63, where
        assert (doc["kind"], name) not in seen, f"duplicate {doc['kind']}/{name}"
        seen.add((doc["kind"], name))


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_schema_of_the_kubernetes_api(doc: dict[str, Any]) -> None:
    """The API's own OpenAPI schemas (kubernetes-validate, offline), strict: an unknown or
    misspelt field fails, as `kubectl apply --dry-run=client` would fail it."""
    resource = {k: v for k, v in doc.items() if k != "__file__"}
    kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)


def test_kustomization_lists_every_file() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


@pytest.mark.parametrize("deployment", of_kind("Deployment"),
                         ids=lambda d: d["metadata"]["name"])
def test_deployment_selector_matches_its_pods(deployment: dict[str, Any]) -> None:
    spec = deployment["spec"]
    selector = spec["selector"]["matchLabels"]
    labels = spec["template"]["metadata"]["labels"]
    assert selector and selector.items() <= labels.items()
    assert spec["replicas"] >= 2  # a PDB with maxUnavailable 1 needs more than one pod


def test_deployments_select_disjoint_pods() -> None:
    selectors = [d["spec"]["selector"]["matchLabels"] for d in of_kind("Deployment")]
    for i, a in enumerate(selectors):
        for b in selectors[i + 1:]:
            assert not (a.items() <= b.items() or b.items() <= a.items()), (a, b)


def test_containers_are_complete_and_reference_existing_config() -> None:
    config_maps = {d["metadata"]["name"] for d in of_kind("ConfigMap")}
    secrets = {d["metadata"]["name"] for d in of_kind("Secret")}
    for owner, pod in pod_specs():
        assert pod["containers"], owner
        mounts_needed = set()
        for container in pod["containers"]:
            assert DNS_1123.match(container["name"]) and container["image"], owner
            assert container["args"][0] in ("serve", "worker", "migrate"), owner
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps, owner
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, owner
            mounts_needed |= {m["name"] for m in container.get("volumeMounts", [])}
        assert mounts_needed <= {v["name"] for v in pod.get("volumes", [])}, owner


def test_serve_probes_readyz_and_healthz_on_its_port() -> None:
    container = named("Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    config = named("ConfigMap", "gateway-config")["data"]
    assert int(config["GATEWAY_PORT"]) == ports["http"]
    assert config["GATEWAY_HOST"] == "0.0.0.0"  # the default 127.0.0.1 is unreachable in a pod


def test_service_routes_to_the_serve_pods_named_port() -> None:
    service = named("Service", "gateway")
    pods = named("Deployment", "gateway")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
    port_names = {p["name"] for c in pods["spec"]["containers"] for p in c.get("ports", [])}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in port_names


@pytest.mark.parametrize("pdb", of_kind("PodDisruptionBudget"),
                         ids=lambda d: d["metadata"]["name"])
def test_pdb_selects_exactly_one_deployment(pdb: dict[str, Any]) -> None:
    spec = pdb["spec"]
    assert ("minAvailable" in spec) != ("maxUnavailable" in spec)
    selector = spec["selector"]["matchLabels"]
    matched = [d for d in of_kind("Deployment")
               if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
    assert len(matched) == 1, [d["metadata"]["name"] for d in matched]
    budget = spec.get("maxUnavailable", 1)
    assert budget < matched[0]["spec"]["replicas"]


def test_every_deployment_has_a_pdb() -> None:
    covered = {d["metadata"]["name"] for d in of_kind("Deployment")
               for pdb in of_kind("PodDisruptionBudget")
               if pdb["spec"]["selector"]["matchLabels"].items()
               <= d["spec"]["template"]["metadata"]["labels"].items()}
    assert covered == {d["metadata"]["name"] for d in of_kind("Deployment")}


def test_stores_are_external_services_the_urls_name() -> None:
    external = {d["metadata"]["name"]: d for d in of_kind("Service")
                if d["spec"].get("type") == "ExternalName"}
    assert set(external) == {"redis-durable", "redis-cache", "postgres"}
    for service in external.values():
        assert service["spec"]["externalName"] and "selector" not in service["spec"]
    secret = named("Secret", "gateway-secrets")["stringData"]
    for variable, host in (("GATEWAY_DURABLE_URL", "redis-durable"),
                           ("GATEWAY_CACHE_URL", "redis-cache"),
                           ("GATEWAY_DATABASE_URL", "postgres")):
        assert f"@{host}:" in secret[variable]


def test_environment_is_the_gateways_and_parses() -> None:
    config = named("ConfigMap", "gateway-config")["data"]
    secret = named("Secret", "gateway-secrets")["stringData"]
    assert not set(config) & set(secret)
    environ = {**config, **secret}
    assert set(environ) <= set(ENV_VARIABLES) | EXTRA_VARIABLES, \
        set(environ) - set(ENV_VARIABLES) - EXTRA_VARIABLES
    assert all(isinstance(v, str) for v in environ.values())  # kubectl rejects numbers here
    settings = load_settings(environ)
    assert settings.port == 8080 and settings.durable_url and settings.cache_url
    assert "demo" in settings.webhook_sources


def serve_container() -> dict[str, Any]:
    return named("Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def test_serve_trusts_the_ingress_controllers_network(tmp_path: Path) -> None:
    """The barrier's client address behind the ingress: serve reads gateway-toml's
    [security] trusted_proxies (a private pod network, never everything), mounted where
    GATEWAY_CONFIG points; the settings load as the gateway would load them."""
    container = serve_container()
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    pod = named("Deployment", "gateway")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name")
                  == "gateway-toml")
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    toml_map = named("ConfigMap", "gateway-toml")["data"]
    assert env["GATEWAY_CONFIG"] == mount["mountPath"] + "/gateway.toml" and mount["readOnly"]
    assert "gateway.toml" in toml_map
    security = tomllib.loads(toml_map["gateway.toml"])["security"]
    proxies = BruteSettings.from_section(security).trusted_proxies
    assert proxies and all(net.is_private and net.prefixlen >= 8 for net in proxies), proxies
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(toml_map["gateway.toml"])
    environ = {**named("ConfigMap", "gateway-config")["data"],
               **named("Secret", "gateway-secrets")["stringData"],
               "GATEWAY_CONFIG": str(config_file)}
    settings = load_settings(environ)
    assert BruteSettings.from_section(settings.section("security")).trusted_proxies == proxies


def test_only_the_ingress_controller_reaches_the_serve_pods() -> None:
    """Trusting the pod network is safe only if no other pod can connect: the
    NetworkPolicy admits the ingress controller's pods alone, on the http port, and the
    Ingress routes to the gateway Service's http port."""
    serve_labels = named("Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    policies = [p for p in of_kind("NetworkPolicy")
                if p["spec"]["podSelector"]["matchLabels"].items() <= serve_labels.items()]
    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert "Ingress" in spec["policyTypes"]
    for rule in spec["ingress"]:
        assert rule["from"], "an empty from admits every pod"
        for peer in rule["from"]:
            assert set(peer) == {"namespaceSelector", "podSelector"}, peer  # no ipBlock
        assert [p["port"] for p in rule["ports"]] == ["http"]
    ingress = named("Ingress", "gateway")
    backends = [path["backend"]["service"] for rule in ingress["spec"]["rules"]
                for path in rule["http"]["paths"]]
    assert backends == [{"name": "gateway", "port": {"name": "http"}}]
