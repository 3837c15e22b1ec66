"""Deployment artifacts: compose, Kubernetes manifests, Dockerfile (the dashboard and the
alert rules: test_monitoring.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.limits.problems import mistakes, read_limits
from proxy.settings import Settings
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes" / "base"
REPLICAS = ROOT / "deploy" / "kubernetes" / "replicas"
STORE_DIR = ROOT / "deploy" / "kubernetes" / "limits-store"


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_services_ports_volumes() -> None:
    """Every service, port and volume the README mentions is defined."""
    data = compose()
    assert set(data["services"]) == {
        "vllm",
        "vllm-cpu",
        "proxy",
        "postgres",
        "prometheus",
        "grafana",
        "valkey",
    }
    assert data["services"]["vllm"]["profiles"] == ["gpu"]
    assert data["services"]["vllm-cpu"]["profiles"] == ["cpu"]
    assert set(data["services"]["proxy"]["ports"]) == {"8080:8080", "9090:9090"}
    assert "3000:3000" in data["services"]["grafana"]["ports"]
    assert set(data["volumes"]) == {"models", "journal", "ledger"}
    env = data["services"]["proxy"]["environment"]
    assert env["USAGE_PROXY_UPSTREAM"] == "http://vllm:8000"
    for name in env:
        if name.startswith("USAGE_PROXY_"):
            assert name.removeprefix("USAGE_PROXY_").lower() in Settings.model_fields
    for service in data["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source in data["volumes"] or (ROOT / source).exists(), volume
    readme = (ROOT / "README.md").read_text()
    for port in ("8080", "9090", "3000", "9091"):
        assert f"localhost:{port}" in readme


@pytest.mark.skipif(
    subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0
    if shutil.which("docker")
    else True,
    reason="no docker compose client here",
)
def test_docker_compose_config() -> None:
    """`docker compose config` accepts the file where a compose client exists."""
    subprocess.run(["docker", "compose", "config", "-q"], cwd=ROOT, check=True)


def k8s_documents() -> list[dict[str, Any]]:
    return render(K8S)


STORE = "usage-limits-store"


def scoring_documents() -> list[dict[str, Any]]:
    """The manifests of the vLLM pod with its proxy (the base: no limits store)."""
    return k8s_documents()


def store_documents() -> dict[str, dict[str, Any]]:
    """The limits store's manifests (deploy/kubernetes/limits-store), by kind."""
    return {d["kind"]: d for d in render(REPLICAS) if d["metadata"]["name"] == STORE}


def test_kubernetes_manifests_validate() -> None:
    """Core resources validate strictly against the Kubernetes 1.30 schemas."""
    kinds = []
    for doc in k8s_documents():
        kinds.append(doc["kind"])
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        kubernetes_validate.validate(doc, "1.30", strict=True)
    assert sorted(kinds) == [
        "ConfigMap",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "PodMonitor",
        "Service",
        "StatefulSet",
    ]


def test_sidecar_shares_model_volume_and_service_targets_proxy() -> None:
    """The proxy mounts vLLM's model path; the Service only exposes the proxy port."""
    docs = {d["kind"]: d for d in scoring_documents()}
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    mounts = {
        c: {m["name"]: m["mountPath"] for m in containers[c]["volumeMounts"]} for c in containers
    }
    assert mounts["vllm"]["models"] == mounts["usage-proxy"]["models"]
    assert containers["usage-proxy"]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert containers["usage-proxy"]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert [p["targetPort"] for p in docs["Service"]["spec"]["ports"]] == ["http"]
    config = docs["ConfigMap"]["data"]
    for name in config:
        if name.startswith("USAGE_PROXY_"):
            assert name.removeprefix("USAGE_PROXY_").lower() in Settings.model_fields


def test_compose_runs_a_pinned_valkey_the_proxy_uses() -> None:
    """compose's limits store: a pinned Valkey image, without persistence (an old
    snapshot would not be rebuilt from the journals) or eviction (a budget never
    silently dropped), named by the proxy's --limits-store."""
    data = compose()
    valkey = data["services"]["valkey"]
    image, _, tag = valkey["image"].partition(":")
    assert image == "valkey/valkey"
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag)
    command = valkey["command"]
    assert command[command.index("--save") + 1] == ""
    assert command[command.index("--appendonly") + 1] == "no"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    proxy = data["services"]["proxy"]
    assert proxy["environment"]["USAGE_PROXY_LIMITS_STORE"] == "valkey://valkey:6379/0"
    assert "valkey" in proxy["depends_on"]
    # as in Kubernetes, the replica count is set (issue #54 item 3): compose runs one proxy
    replicas = proxy.get("deploy", {}).get("replicas", 1)
    assert int(proxy["environment"]["USAGE_PROXY_LIMITS_REPLICAS"]) == replicas


def test_the_limits_store_is_hardened_and_reached_only_by_the_proxies() -> None:
    """Kubernetes' limits store: one pinned Valkey at a time (Recreate), restricted pod
    security with a read-only root, no persistence nor eviction, its password from a
    Secret file (never argv); a NetworkPolicy admits only the proxy pods on its port and
    lets it call nobody; the proxy finds it by the ConfigMap and reads the password from
    the same Secret, mounted as a file."""
    store = store_documents()
    assert set(store) == {"Deployment", "Service", "NetworkPolicy"}
    deployment = store["Deployment"]["spec"]
    assert deployment["replicas"] == 1
    assert deployment["strategy"]["type"] == "Recreate"
    pod = deployment["template"]["spec"]
    labels = deployment["template"]["metadata"]["labels"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (valkey,) = pod["containers"]
    assert re.fullmatch(r"valkey/valkey:\d+\.\d+\.\d+", valkey["image"])
    context = valkey["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    command = valkey["command"]
    assert command[command.index("--save") + 1] == ""
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert not any("requirepass" in arg or "pass" in arg.lower() for arg in command)
    assert "limits" in valkey["resources"]
    config = next(v for v in pod["volumes"] if v["name"] == "config")
    assert config["secret"]["secretName"] == "usage-limits-store"
    service = store["Service"]["spec"]
    assert service["selector"].items() <= labels.items()
    policy = store["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert "egress" not in policy  # the store calls nobody
    (rule,) = policy["ingress"]
    proxies = {d["kind"]: d for d in scoring_documents()}["StatefulSet"]
    proxy_labels = proxies["spec"]["template"]["metadata"]["labels"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= proxy_labels.items()
    assert [p["port"] for p in rule["ports"]] == ["valkey"]
    replicas = {(d["kind"], d["metadata"]["name"]): d for d in render(REPLICAS)}
    settings = replicas["ConfigMap", "usage-proxy"]["data"]
    assert settings["USAGE_PROXY_LIMITS_STORE"] == "valkey://usage-limits-store:6379/0"
    secret_file = Path(settings["USAGE_PROXY_LIMITS_STORE_PASSWORD_FILE"])
    proxy = next(c for c in pod_spec()["containers"] if c["name"] == "usage-proxy")
    mount = next(m for m in proxy["volumeMounts"] if m["mountPath"] == str(secret_file.parent))
    volume = next(v for v in pod_spec()["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "usage-limits-store"
    assert volume["secret"]["items"] == [{"key": "password", "path": secret_file.name}]
    example = yaml.safe_load((STORE_DIR / "limits-store.example.yaml").read_text())
    kubernetes_validate.validate(example, "1.30", strict=True)
    password = example["stringData"]["password"]
    assert example["stringData"]["valkey.conf"].strip() == f"requirepass {password}"
    assert "limits-store.example.yaml" in (ROOT / "README.md").read_text()


def test_dockerfile_is_multistage_and_non_root() -> None:
    """Two stages, a numeric non-root user, usage-proxy serve as entrypoint."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    assert re.search(r"^USER 10001$", text, re.M)
    assert 'ENTRYPOINT ["usage-proxy", "serve"]' in text
    final = text.split("\nFROM ")[-1]
    assert "gcc" not in final
    assert "build-essential" not in final


def pod_spec() -> dict[str, Any]:
    docs = {d["kind"]: d for d in scoring_documents()}
    spec: dict[str, Any] = docs["StatefulSet"]["spec"]["template"]["spec"]
    return spec


def test_vllm_cannot_be_reached_around_the_proxy() -> None:
    """Issue #39 case 13: vLLM listened on 0.0.0.0:8000, the PodMonitor scraped that port
    and nothing stopped any pod calling podIP:8000. Now vLLM binds the pod's loopback and
    declares no port, its metrics are scraped through the proxy's admin port, and a
    NetworkPolicy on the pod admits only the proxy's ports."""
    docs = {d["kind"]: d for d in scoring_documents()}
    containers = {c["name"]: c for c in pod_spec()["containers"]}
    args = containers["vllm"]["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert "ports" not in containers["vllm"]
    assert "httpGet" not in containers["vllm"]["readinessProbe"]  # the kubelet cannot reach it
    endpoints = docs["PodMonitor"]["spec"]["podMetricsEndpoints"]
    assert {(e["port"], e["path"]) for e in endpoints} == {
        ("admin", "/metrics"),
        ("admin", "/upstream/metrics"),
    }
    upstream = next(e for e in endpoints if e["path"] == "/upstream/metrics")
    assert upstream["relabelings"] == [{"targetLabel": "job", "replacement": "vllm"}]
    policy = docs["NetworkPolicy"]["spec"]
    labels = docs["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    proxy_ports = {p["name"] for p in containers["usage-proxy"]["ports"]}
    admitted = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert admitted == proxy_ports == {"http", "admin"}
    assert all("ports" in rule for rule in policy["ingress"])  # no rule admits every port


def test_pod_meets_the_restricted_pod_security_level() -> None:
    """Issue #39 case 14: both containers run non-root without privilege escalation or
    capabilities, under the runtime's seccomp profile; the proxy's read-only root has a
    writable /tmp."""
    pod = pod_spec()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert context["runAsUser"] > 0, container["name"]
        tmp = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert len(tmp) == 1, container["name"]
        assert "emptyDir" in volumes[tmp[0]]
    proxy = next(c for c in pod["containers"] if c["name"] == "usage-proxy")
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True


def test_records_have_a_durable_path_and_keys_a_secret(tmp_path: Path) -> None:
    """Issue #39 case 14: the ledger's Secret was optional (missing meant no ledger) while
    the journal lived on an emptyDir lost with the pod. Now the Secret is required and the
    journal is on a PersistentVolumeClaim of its own per replica (the StatefulSet's claim
    template: it keeps the replica's name and journal across restarts and rollouts); the
    example Secret for --api-keys holds digests the proxy loads, never keys."""
    from proxy.serving.tenancy import load_api_keys

    docs = {d["kind"]: d for d in scoring_documents()}
    pod = pod_spec()
    proxy = next(c for c in pod["containers"] if c["name"] == "usage-proxy")
    env = {e["name"]: e for e in proxy["env"]}
    ref = env["USAGE_PROXY_LEDGER_DSN"]["valueFrom"]["secretKeyRef"]
    assert ref.get("optional", False) is False
    state = "/var/lib/usage-proxy"  # the image's XDG_STATE_HOME: the journal's directory
    assert f"XDG_STATE_HOME={state}" in (ROOT / "deploy" / "Dockerfile").read_text()
    mounts = {m["mountPath"]: m["name"] for m in proxy["volumeMounts"]}
    assert mounts[state] not in {v["name"] for v in pod["volumes"]}  # not a pod volume
    (claim,) = docs["StatefulSet"]["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == mounts[state]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert docs["StatefulSet"]["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    example = yaml.safe_load((K8S / "api-keys.example.yaml").read_text())
    kubernetes_validate.validate(example, "1.30", strict=True)
    keys = tmp_path / "keys.yaml"
    keys.write_text(example["stringData"]["keys.yaml"])
    assert set(load_api_keys(keys).values()) == {"acme", "globex"}
    readme = (ROOT / "README.md").read_text()
    for name in ("api-keys.example.yaml", "volumeClaimTemplates", "usage-ledger"):
        assert name in readme, name


# Created by the operator (README, Deployment), not by the kustomization.
OPERATORS_SECRETS = {"usage-ledger", "usage-limits-store"}


def references_resolve(docs: list[dict[str, Any]]) -> None:
    """Every claim, ConfigMap and Secret a pod names exists in ``docs`` (or is a claim
    template of its StatefulSet, or a Secret the operator creates)."""
    named = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if spec is None:
            continue
        templates = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
        mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        assert mounted <= volumes.keys() | templates, doc["metadata"]["name"]
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in named, claim
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in named
            if "secret" in volume:
                assert volume["secret"]["secretName"] in OPERATORS_SECRETS
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in named
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                assert ref is None or ref["name"] in OPERATORS_SECRETS


def test_no_manifest_names_what_it_does_not_create() -> None:
    """Issue #54 item 3: the pod named a PersistentVolumeClaim "models" nothing created. Every
    claim and ConfigMap a pod names is in the kustomization, in the base and with replicas."""
    references_resolve(render(K8S))
    references_resolve(render(REPLICAS))


def test_the_replicas_example_runs_shared_limits_as_the_readme_says() -> None:
    """Issue #54 item 3: Kubernetes could not run the shared-limits setup the README
    advertises (one replica, Recreate, no limits file, --limits-replicas never set, the
    store's Secret required without limits). deploy/kubernetes/replicas: three replicas
    rolled one at a time, each with its own journal, the limits file from a ConfigMap (one
    `limits check` passes), --limits-replicas equal to the replica count; every manifest
    validates against the Kubernetes 1.30 schemas."""
    docs = render(REPLICAS)
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com"):
            kubernetes_validate.validate(doc, "1.30", strict=True)
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    replicas = by_kind["StatefulSet", "vllm-scoring"]["spec"]
    assert replicas["replicas"] > 1
    assert replicas["updateStrategy"]["type"] == "RollingUpdate"
    assert replicas["volumeClaimTemplates"][0]["metadata"]["name"] == "journal"
    settings = by_kind["ConfigMap", "usage-proxy"]["data"]
    assert int(settings["USAGE_PROXY_LIMITS_REPLICAS"]) == replicas["replicas"]
    limits_path = Path(settings["USAGE_PROXY_LIMITS"])
    pod = replicas["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "usage-proxy")
    mount = next(m for m in proxy["volumeMounts"] if m["mountPath"] == str(limits_path.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    files = by_kind["ConfigMap", volume["configMap"]["name"]]["data"]
    assert limits_path.name in files
    budget = by_kind["PodDisruptionBudget", "vllm-scoring"]["spec"]
    labels = replicas["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget["maxUnavailable"] == 1
    store = next(v for v in pod["volumes"] if v["name"] == "limits-store")
    assert store["secret"]["optional"] is True
    claims = by_kind["PersistentVolumeClaim", "models"]["spec"]
    assert claims["accessModes"] == ["ReadWriteMany"]  # replicas on several nodes
    options = {
        name.removeprefix("USAGE_PROXY_").lower(): value
        for name, value in settings.items()
        if name.startswith("USAGE_PROXY_")
    }
    assert Settings(**options).limits_replicas == replicas["replicas"]  # every key a setting


def test_the_example_limits_file_checks_clean(tmp_path: Path) -> None:
    """The replicas example's limits file is one `usage-proxy limits check` passes."""
    docs = {d["metadata"]["name"]: d for d in render(REPLICAS) if d["kind"] == "ConfigMap"}
    path = tmp_path / "limits.yaml"
    path.write_text(docs["usage-proxy-limits"]["data"]["limits.yaml"])
    assert mistakes(read_limits(path)) == []


def test_the_base_applies_without_the_stores_secret() -> None:
    """Issue #59 item 2: the base (one replica, no limits) deployed the Valkey limits store,
    whose config volume required the Secret usage-limits-store, so applied without it the
    store's pod never started. The base holds no store and nothing that needs its Secret
    (every manifest valid against the Kubernetes 1.30 schemas, as the replicas example's);
    the replicas example still runs the store."""
    docs = render(K8S)
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com"):
            kubernetes_validate.validate(doc, "1.30", strict=True)
    assert STORE not in {d["metadata"]["name"] for d in docs}
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for volume in spec.get("volumes", []):
            secret = volume.get("secret")
            if secret is not None and secret["secretName"] == STORE:
                assert secret.get("optional") is True, (doc["metadata"]["name"], volume["name"])
    settings = {d["kind"]: d for d in docs}["ConfigMap"]["data"]
    assert not any(name.startswith("USAGE_PROXY_LIMITS") for name in settings)
    assert {d["kind"] for d in render(REPLICAS) if d["metadata"]["name"] == STORE} == {
        "Deployment",
        "Service",
        "NetworkPolicy",
    }


def test_the_base_starts_without_the_stores_secret() -> None:
    """Issue #54 item 3: the limits store's Secret was required even without limits; it is
    optional (a proxy with a limits file and no Secret fails at start, naming the file)."""
    store = next(v for v in pod_spec()["volumes"] if v["name"] == "limits-store")
    assert store["secret"]["optional"] is True
    assert (
        "USAGE_PROXY_LIMITS" not in {d["kind"]: d for d in scoring_documents()}["ConfigMap"]["data"]
    )


def _normalized(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(d, sort_keys=True) for d in docs)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl here")
@pytest.mark.parametrize(
    "directory", [K8S, REPLICAS, STORE_DIR], ids=["base", "replicas", "limits-store"]
)
def test_the_offline_rendering_is_kubectls(directory: Path) -> None:
    """The manifests the tests hold are those `kubectl kustomize` renders."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    theirs = [d for d in yaml.safe_load_all(out) if d]
    assert _normalized(render(directory)) == _normalized(theirs)


def test_per_tenant_panels_have_data_with_the_shipped_config() -> None:
    """Issue #39 case 7: the per-tenant panel was empty with the shipped ConfigMap (no
    tenant label). Kubernetes and compose turn the label on, with the admin port it needs."""
    panels = json.loads((ROOT / "deploy/grafana/dashboards/usage-proxy.json").read_text())["panels"]
    assert any("by (tenant)" in t["expr"] for p in panels for t in p["targets"])
    docs = {d["kind"]: d for d in scoring_documents()}
    for env in (docs["ConfigMap"]["data"], compose()["services"]["proxy"]["environment"]):
        settings = Settings(
            upstream="http://x",
            metrics_tenant_label=env["USAGE_PROXY_METRICS_TENANT_LABEL"],
            admin_port=env["USAGE_PROXY_ADMIN_PORT"],
        )
        assert settings.metrics_tenant_label is True
