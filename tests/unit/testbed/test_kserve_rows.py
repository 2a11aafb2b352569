"""The KServe controller's row: its binary, command line, environment and cluster objects."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import build, kserve, operators
from kubedl_prefect.testbed.build import GoBinary, SourcePatch
from kubedl_prefect.testbed.components import ComponentContext, Layout, Ports
from kubedl_prefect.testbed.pki import CertificateAuthority
from kubedl_prefect.testbed.upstream import KSERVE, GoModule


def _context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ComponentContext:
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path / "cache"))
    layout = Layout(name="unit", ports=Ports(30000))
    CertificateAuthority(layout.pki_dir).serving()
    return ComponentContext(
        layout=layout, binaries={}, kubeconfig=layout.kubeconfig(kserve.KSERVE_IDENTITY.user)
    )


def test_it_is_supervised_with_the_operators_on_ports_of_its_own() -> None:
    assert kserve.KSERVE_COMPONENT in operators.OPERATOR_COMPONENTS
    assert kserve.KSERVE_BINARY in operators.OPERATOR_BINARIES
    offsets = list(operators.PORT_OFFSETS.values())
    assert len(offsets) == len(set(offsets))
    assert set(kserve.PORT_OFFSETS.items()) <= set(operators.PORT_OFFSETS.items())


def test_the_binary_is_built_from_kserves_own_module_on_loopback() -> None:
    binary = kserve.KSERVE_BINARY
    assert binary.module == KSERVE
    assert KSERVE.version == "v0.20.0"
    assert binary.package == "./cmd/manager"
    assert ("CGO_ENABLED", "0") in binary.env
    (patch,) = binary.patches
    assert patch.file == "cmd/manager/main.go"
    assert 'Host: "127.0.0.1"' in patch.new


def test_command_line_environment_and_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(tmp_path, monkeypatch)
    args = kserve.kserve_args(ctx)
    port = 30000 + kserve.PORT_OFFSETS["kserve-probe"]
    assert f"--health-probe-addr=127.0.0.1:{port}" in args
    assert f"--metrics-addr=127.0.0.1:{30000 + kserve.PORT_OFFSETS['kserve-metrics']}" in args
    assert f"--webhook-port={30000 + kserve.PORT_OFFSETS['kserve-webhook']}" in args
    assert "--leader-elect=false" in args
    assert f"--kubeconfig={ctx.kubeconfig}" in args
    env = kserve.kserve_env(ctx)
    assert env["POD_NAMESPACE"] == "kserve"
    certs = Path(env["TMPDIR"]) / "k8s-webhook-server" / "serving-certs"
    assert (certs / "tls.crt").read_bytes() == ctx.serving_cert.read_bytes()
    assert (certs / "tls.key").stat().st_mode & 0o077 == 0
    health = kserve.kserve_health(ctx.layout)
    assert health.url == f"http://127.0.0.1:{port}/readyz"


def test_the_config_map_is_kserves_own_in_standard_mode_without_ingress() -> None:
    data = kserve.inferenceservice_config()
    # Every key KServe ships: the pod mutator refuses pods without agent, logger and batcher.
    assert {"deploy", "ingress", "storageInitializer", "credentials"} <= set(data)
    assert {"agent", "logger", "batcher", "inferenceService", "security"} <= set(data)
    assert "_example" not in data
    assert json.loads(data["deploy"]) == {"defaultDeploymentMode": "Standard"}
    ingress = json.loads(data["ingress"])
    assert ingress["disableIngressCreation"] is True
    assert ingress["disableIstioVirtualHost"] is True
    assert ingress["ingressGateway"]
    assert ingress["ingressDomain"] == "example.com"  # shipped, kept
    initializer = json.loads(data["storageInitializer"])
    assert initializer["image"] == "kserve/storage-initializer:v0.20.0"
    for key in ("memoryRequest", "memoryLimit", "cpuRequest", "cpuLimit"):
        assert initializer[key], key
    for key in ("agent", "logger", "batcher"):
        quantities = json.loads(data[key])
        assert all(
            quantities[q] for q in ("memoryRequest", "memoryLimit", "cpuRequest", "cpuLimit")
        )
    assert json.loads(data["credentials"])["storageSpecSecretName"] == "storage-config"


def test_webhooks_are_kserves_own_on_loopback_with_the_test_bed_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _context(tmp_path, monkeypatch).layout
    ca = base64.b64encode(layout.ca_file.read_bytes()).decode()
    documents = kserve.kserve_webhooks(layout)
    names = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert ("MutatingWebhookConfiguration", "inferenceservice.serving.kserve.io") in names
    assert ("ValidatingWebhookConfiguration", "inferenceservice.serving.kserve.io") in names
    hooks = {w["name"]: w for d in documents for w in d["webhooks"]}
    base = f"https://127.0.0.1:{30000 + kserve.PORT_OFFSETS['kserve-webhook']}"
    expected = {
        "inferenceservice.kserve-webhook-server.pod-mutator": "/mutate-pods",
        "inferenceservice.kserve-webhook-server.defaulter": (
            "/mutate-serving-kserve-io-v1beta1-inferenceservice"
        ),
        "inferenceservice.kserve-webhook-server.validator": (
            "/validate-serving-kserve-io-v1beta1-inferenceservice"
        ),
        "clusterservingruntime.kserve-webhook-server.validator": (
            "/validate-serving-kserve-io-v1alpha1-clusterservingruntime"
        ),
    }
    for name, path in expected.items():
        assert hooks[name]["clientConfig"] == {"url": base + path, "caBundle": ca}, name
        assert hooks[name]["failurePolicy"] == "Fail"
    mutator = hooks["inferenceservice.kserve-webhook-server.pod-mutator"]
    # Only an InferenceService's pods, as upstream selects them.
    assert mutator["objectSelector"]["matchExpressions"][0] == {
        "key": "serving.kserve.io/inferenceservice",
        "operator": "Exists",
    }
    assert mutator["reinvocationPolicy"] == "IfNeeded"
    assert all("service" not in w["clientConfig"] for w in hooks.values())


def test_the_shipped_runtimes_are_installed_with_their_release_images() -> None:
    runtimes = {r["metadata"]["name"]: r for r in kserve.cluster_serving_runtimes()}
    mlserver = runtimes["kserve-mlserver"]
    assert mlserver["spec"]["containers"][0]["image"] == "docker.io/seldonio/mlserver:1.7.1"
    formats = {(f["name"], f.get("version")) for f in mlserver["spec"]["supportedModelFormats"]}
    assert ("mlflow", "2") in formats
    assert mlserver["spec"]["protocolVersions"] == ["v2"]
    images = [c["image"] for r in runtimes.values() for c in r["spec"].get("containers") or []]
    assert not [image for image in images if image.endswith(":replace")]
    # Only kserve-mlserver serves MLflow models.
    mlflow = [
        name
        for name, r in runtimes.items()
        if any(f["name"] == "mlflow" for f in r["spec"]["supportedModelFormats"])
    ]
    assert mlflow == ["kserve-mlserver"]


def test_kustomize_images_follow_kustomizes_rules() -> None:
    images = [
        {"name": "a", "newName": "reg.io/a", "newTag": "2"},
        {"name": "b", "newTag": "3"},
        {"name": "c", "digest": "sha256:ab"},
    ]
    assert kserve.kustomize_image("a:replace", images) == "reg.io/a:2"
    assert kserve.kustomize_image("b", images) == "b:3"
    assert kserve.kustomize_image("c:1", images) == "c@sha256:ab"
    assert kserve.kustomize_image("reg.io:5000/d:1", images) == "reg.io:5000/d:1"


def test_prerequisites_come_before_the_runtimes_and_are_kinds_we_write() -> None:
    manifests = kserve.kserve_manifests()
    kinds = [m["kind"] for m in manifests]
    assert kinds[:4] == ["Namespace", "ConfigMap", "ClusterRole", "ClusterRoleBinding"]
    assert set(kinds[4:]) == {"ClusterServingRuntime"}
    assert manifests[1]["metadata"] == {"name": "inferenceservice-config", "namespace": "kserve"}
    role = manifests[2]
    assert any("inferenceservices" in rule.get("resources", []) for rule in role["rules"])
    for manifest in operators.operator_manifests():
        assert manifest["kind"] in operators._KINDS


def test_an_upstream_module_is_hashed_by_version_and_may_only_patch_itself() -> None:
    binary = kserve.KSERVE_BINARY
    assert build.inputs_hash(binary) == build.inputs_hash(binary)
    newer = GoBinary(binary.name, GoModule(KSERVE.path, "v0.20.1"), ".")
    assert build.inputs_hash(newer) != build.inputs_hash(GoBinary(binary.name, KSERVE, "."))
    with pytest.raises(TestbedError, match="can only patch"):
        GoBinary(
            "x",
            KSERVE,
            ".",
            patches=(SourcePatch("example.org/other", "a.go", "a", "b", "why"),),
        )
