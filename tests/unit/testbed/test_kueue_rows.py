"""Kueue's row: the pinned binary and its patch, configuration, webhooks, CRDs, queues."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from kubedl_prefect.testbed import build, content, kueue, operators
from kubedl_prefect.testbed.components import ComponentContext, Layout, Ports
from kubedl_prefect.testbed.pki import CertificateAuthority
from kubedl_prefect.testbed.upstream import KUEUE, module_file

BASE = 30000


def _context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ComponentContext:
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path / "cache"))
    layout = Layout(name="unit", ports=Ports(BASE))
    CertificateAuthority(layout.pki_dir).serving()
    user = kueue.KUEUE_IDENTITY.user
    return ComponentContext(layout=layout, binaries={}, kubeconfig=layout.kubeconfig(user))


def _port(endpoint: str) -> int:
    return BASE + kueue.PORT_OFFSETS[endpoint]


def test_version_is_pinned_exactly_without_replaces() -> None:
    assert (KUEUE.path, KUEUE.version) == ("sigs.k8s.io/kueue", "v0.19.2")
    assert isinstance(kueue.KUEUE_BINARY.module, Path)
    go_mod = (kueue.KUEUE_BINARY.module / "go.mod").read_text()
    assert re.search(r"^\s*sigs\.k8s\.io/kueue v0\.19\.2( // indirect)?$", go_mod, re.MULTILINE)
    assert re.search(r"^tool sigs\.k8s\.io/kueue/cmd/kueue$", go_mod, re.MULTILINE)
    assert not re.search(r"^replace", go_mod, re.MULTILINE)
    assert f"-X {KUEUE.path}/pkg/version.GitVersion=v0.19.2" in kueue.KUEUE_BINARY.ldflags


def test_runs_supervised_after_the_operators_it_manages_on_ports_of_its_own() -> None:
    names = [c.name for c in operators.OPERATOR_COMPONENTS]
    assert names[-1] == "kueue-controller"
    assert names.index("trainer-controller") < names.index("kueue-controller")
    assert kueue.KUEUE_BINARY in operators.OPERATOR_BINARIES
    assert set(kueue.PORT_OFFSETS.items()) <= set(operators.PORT_OFFSETS.items())
    offsets = list(operators.PORT_OFFSETS.values())
    assert len(offsets) == len(set(offsets))
    assert not set(kueue.PORT_OFFSETS.values()) & {43, 47, 57, 59, 79, 80}


@pytest.mark.parametrize("patch", kueue.KUEUE_BINARY.patches, ids=lambda p: p.file)
def test_the_metrics_certificate_patch_applies_to_the_pinned_source(
    patch: build.SourcePatch,
) -> None:
    source = module_file(KUEUE, patch.file).read_text()
    patched = build.apply_patch(source, patch)
    assert f'os.Getenv("{kueue.METRICS_CERT_DIR_ENV}")' in patched
    # The certificate watcher right after reads the folder the patch may replace.
    after = patched[patched.index(kueue.METRICS_CERT_DIR_ENV) :]
    assert after.index("metricsCertPath = dir") < after.index("certwatcher.New(")


def test_configuration_is_loopback_with_test_bed_certificates_and_our_frameworks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(tmp_path, monkeypatch)
    assert ctx.kubeconfig is not None
    assert not ctx.kubeconfig.exists()  # a test bed started before Kueue was part of it
    args = kueue.kueue_args(ctx)
    assert f"--kubeconfig={ctx.kubeconfig}" in args
    kubeconfig = yaml.safe_load(ctx.kubeconfig.read_text())
    assert kubeconfig["users"][0]["name"] == kueue.KUEUE_IDENTITY.user
    (config_arg,) = [a for a in args if a.startswith("--config=")]
    config_path = Path(config_arg.removeprefix("--config="))
    assert config_path.is_relative_to(ctx.layout.root)
    config = yaml.safe_load(config_path.read_text())
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    certs = kueue.cert_dir(ctx.layout)
    assert certs.is_relative_to(ctx.layout.root)
    assert config["webhook"] == {
        "host": "127.0.0.1",
        "port": _port("kueue-webhook"),
        "certDir": str(certs),
    }
    assert config["health"] == {"healthProbeBindAddress": f"127.0.0.1:{_port('kueue-probe')}"}
    assert config["metrics"] == {"bindAddress": f"127.0.0.1:{_port('kueue-metrics')}"}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["featureGates"] == {"VisibilityOnDemand": False}
    assert config["waitForPodsReady"]["timeout"] == "2m"
    assert set(config["integrations"]["frameworks"]) == {
        "batch/job",
        "jobset.x-k8s.io/jobset",
        "kubeflow.org/pytorchjob",
        "kubeflow.org/tfjob",
        "kubeflow.org/mpijob",
        "kubeflow.org/xgboostjob",
        "trainer.kubeflow.org/trainjob",
    }
    assert (certs / "tls.crt").read_bytes() == ctx.serving_cert.read_bytes()
    assert kueue.kueue_env(ctx) == {kueue.METRICS_CERT_DIR_ENV: str(certs)}


def test_framework_names_are_kueues_own() -> None:
    for framework in kueue.FRAMEWORKS:
        found = [
            path
            for path in (module_file(KUEUE, "go.mod").parent / "pkg/controller/jobs").rglob(
                "*_controller.go"
            )
            if f'FrameworkName = "{framework}"' in re.sub(r"\s+", " ", path.read_text())
        ]
        assert found, framework


def test_webhooks_of_kueue_kinds_and_our_frameworks_on_loopback_with_the_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _context(tmp_path, monkeypatch).layout
    ca = base64.b64encode(layout.ca_file.read_bytes()).decode()
    documents = {d["metadata"]["name"]: d for d in kueue.kueue_webhooks(layout)}
    assert set(documents) == {
        "kueue-mutating-webhook-configuration",
        "kueue-validating-webhook-configuration",
    }
    hooks = {w["name"]: w for d in documents.values() for w in d["webhooks"]}
    for kind in ("pytorchjob", "tfjob", "xgboostjob", "trainjob", "jobset", "job"):
        assert {f"m{kind}.kb.io", f"v{kind}.kb.io"} <= set(hooks), kind
    assert {"mworkload.kb.io", "vclusterqueue.kb.io", "vresourceflavor.kb.io"} <= set(hooks)
    # No-op webhooks of frameworks not enabled would see every pod or Deployment.
    assert not {"mpod.kb.io", "mdeployment.kb.io", "mrayjob.kb.io"} & set(hooks)
    pytorch = hooks["mpytorchjob.kb.io"]
    assert pytorch["clientConfig"] == {
        "url": f"https://127.0.0.1:{_port('kueue-webhook')}/mutate-kubeflow-org-v1-pytorchjob",
        "caBundle": ca,
    }
    assert pytorch["failurePolicy"] == "Fail"
    assert pytorch["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system",
        "kueue-system",
    ]
    assert "namespaceSelector" not in hooks["vclusterqueue.kb.io"]


def test_crds_are_served_at_v1beta2_only() -> None:
    sources = tuple(s for s in content.CRD_SOURCES if s.module == KUEUE)
    crds = {c["metadata"]["name"]: c for c in content.crd_manifests(sources)}
    assert {"workloads.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io"} <= set(crds)
    for crd in crds.values():
        assert [(v["name"], v["storage"]) for v in crd["spec"]["versions"]] == [("v1beta2", True)]
    assert set(crds) <= set(content.crd_names())


def test_flavor_matches_the_kwok_nodes_and_queues_bind_one_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flavor = kueue.resource_flavor()
    node = content.node_manifest(0, gpus=8)
    assert flavor["spec"]["nodeLabels"].items() <= node["metadata"]["labels"].items()
    queue = kueue.cluster_queue("cq", namespace="team-a", gpus=4, cohort="research")
    assert queue["spec"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "team-a"}
    }
    assert queue["spec"]["cohortName"] == "research"
    assert queue["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    assert queue["spec"]["resourceGroups"][0]["flavors"][0]["name"] == kueue.FLAVOR
    local = kueue.local_queue("team-a", "gpu", "cq")
    assert local["metadata"] == {"name": "gpu", "namespace": "team-a"}
    assert local["spec"] == {"clusterQueue": "cq"}
    # Written through Kueue's webhooks: those first.
    kinds = [m["kind"] for m in kueue.after_start_manifests(_context(tmp_path, monkeypatch).layout)]
    assert kinds == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ResourceFlavor",
        "WorkloadPriorityClass",
        "WorkloadPriorityClass",
    ]


def test_prerequisites_bind_kueue_to_its_roles_and_the_secrets_of_its_namespace() -> None:
    manifests = kueue.kueue_manifests()
    user = kueue.KUEUE_IDENTITY.user
    bound = {
        (m["kind"], m["roleRef"]["name"], m["metadata"].get("namespace"))
        for m in manifests
        if m["kind"] in ("ClusterRoleBinding", "RoleBinding") and m["subjects"][0]["name"] == user
    }
    assert bound == {
        ("ClusterRoleBinding", user, None),
        ("ClusterRoleBinding", f"{user}-metrics-auth", None),
        ("RoleBinding", f"{user}-secrets", kueue.KUEUE_NAMESPACE),
    }
    role = next(m for m in manifests if m["kind"] == "Role")
    assert role["rules"][0]["resources"] == ["secrets"]
    assert {m["kind"] for m in manifests} <= set(operators._KINDS)
