"""Trainer's and JobSet's rows: binaries, patches, configuration files, webhooks, runtimes."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import build, cluster, content, operators, trainer
from kubedl_prefect.testbed.components import ComponentContext, Layout, Ports
from kubedl_prefect.testbed.pki import CertificateAuthority
from kubedl_prefect.testbed.upstream import JOBSET, KUBEFLOW_TRAINING, TRAINER, module_file

BASE = 30000


def _context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str) -> ComponentContext:
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path / "cache"))
    layout = Layout(name="unit", ports=Ports(BASE))
    CertificateAuthority(layout.pki_dir).serving()
    return ComponentContext(layout=layout, binaries={}, kubeconfig=layout.kubeconfig(user))


def _port(endpoint: str) -> int:
    return BASE + trainer.PORT_OFFSETS[endpoint]


def _go_mod(binary: build.GoBinary) -> str:
    assert isinstance(binary.module, Path)
    return (binary.module / "go.mod").read_text()


def test_versions_are_pinned_exactly() -> None:
    assert (TRAINER.path, TRAINER.version) == ("github.com/kubeflow/trainer/v2", "v2.3.0")
    assert (JOBSET.path, JOBSET.version) == ("sigs.k8s.io/jobset", "v0.12.0")
    assert KUBEFLOW_TRAINING.version == "v1.9.4"
    for binary, module in ((trainer.TRAINER_BINARY, TRAINER), (trainer.JOBSET_BINARY, JOBSET)):
        line = rf"^\s*{re.escape(module.path)} {re.escape(module.version)}( // indirect)?$"
        assert re.search(line, _go_mod(binary), re.MULTILINE), binary.name
    for binary in (trainer.TRAINER_BINARY, trainer.JOBSET_BINARY):
        assert not re.search(r"^replace", _go_mod(binary), re.MULTILINE)  # upstream has none


def test_both_run_supervised_with_the_operators_jobset_first_on_ports_of_their_own() -> None:
    names = [c.name for c in operators.OPERATOR_COMPONENTS]
    jobset_at = names.index("jobset-controller")
    assert names[jobset_at : jobset_at + 2] == ["jobset-controller", "trainer-controller"]
    assert {trainer.JOBSET_BINARY, trainer.TRAINER_BINARY} <= set(operators.OPERATOR_BINARIES)
    assert set(trainer.PORT_OFFSETS.items()) <= set(operators.PORT_OFFSETS.items())
    offsets = list(operators.PORT_OFFSETS.values())
    assert len(offsets) == len(set(offsets))
    assert trainer.VOLCANO_SCHEDULER_NAME == operators.VOLCANO_SCHEDULER_NAME


@pytest.mark.parametrize("patch", trainer.TRAINER_BINARY.patches, ids=lambda p: p.file)
def test_each_source_patch_applies_to_the_pinned_trainer(patch: build.SourcePatch) -> None:
    assert patch.module == TRAINER.path
    source = module_file(TRAINER, patch.file).read_text()
    assert patch.new in build.apply_patch(source, patch)


def test_trainer_configuration_is_loopback_without_cert_management_with_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(tmp_path, monkeypatch, trainer.TRAINER_IDENTITY.user)
    monkeypatch.setattr(trainer, "write_token", lambda layout: trainer.token_file(layout))
    args = trainer.trainer_args(ctx)
    assert f"--kubeconfig={ctx.kubeconfig}" in args
    (config_arg,) = [a for a in args if a.startswith("--config=")]
    config = yaml.safe_load(Path(config_arg.removeprefix("--config=")).read_text())
    assert config["apiVersion"] == "config.trainer.kubeflow.org/v1alpha1"
    assert config["webhook"] == {"host": "127.0.0.1", "port": _port("trainer-webhook")}
    assert config["metrics"]["bindAddress"] == f"127.0.0.1:{_port('trainer-metrics')}"
    assert config["health"]["healthProbeBindAddress"] == f"127.0.0.1:{_port('trainer-probe')}"
    assert config["statusServer"] == {"port": _port("trainer-status-server")}
    assert config["certManagement"] == {"enable": False}
    assert config["featureGates"] == {"TrainJobStatus": True}
    assert "leaderElection" not in config  # none: the manager's default is off
    env = trainer.trainer_env(ctx)
    certs = Path(env["TMPDIR"]) / "k8s-webhook-server" / "serving-certs"
    assert (certs / "tls.crt").read_bytes() == ctx.serving_cert.read_bytes()
    assert env[trainer.TOKEN_FILE_ENV] == str(trainer.token_file(ctx.layout))


def test_jobset_configuration_is_loopback_without_internal_certs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(tmp_path, monkeypatch, trainer.JOBSET_IDENTITY.user)
    args = trainer.jobset_args(ctx)
    assert "--leader-elect=false" in args
    (config_arg,) = [a for a in args if a.startswith("--config=")]
    config = yaml.safe_load(Path(config_arg.removeprefix("--config=")).read_text())
    certs = trainer.jobset_cert_dir(ctx.layout)
    assert config["webhook"] == {
        "host": "127.0.0.1",
        "port": _port("jobset-webhook"),
        "certDir": str(certs),
    }
    assert config["metrics"]["bindAddress"] == f"127.0.0.1:{_port('jobset-metrics')}"
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    assert (certs / "tls.key").read_bytes() == ctx.serving_key.read_bytes()


def test_webhooks_point_at_loopback_with_the_test_bed_ca_and_keep_upstream_selectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _context(tmp_path, monkeypatch, "x").layout
    ca = base64.b64encode(layout.ca_file.read_bytes()).decode()
    trainer_hooks = {d["metadata"]["name"]: d for d in trainer.trainer_webhooks(layout)}
    assert set(trainer_hooks) == {
        "validator.trainer.kubeflow.org",
        "defaulter.trainer.kubeflow.org",
    }
    validator = trainer_hooks["validator.trainer.kubeflow.org"]["webhooks"]
    assert [w["clientConfig"] for w in validator][2] == {
        "url": f"https://127.0.0.1:{_port('trainer-webhook')}"
        "/validate-trainer-kubeflow-org-v1alpha1-trainjob",
        "caBundle": ca,
    }
    # Upstream's kustomize patch: runtimes labelled webhook-validation=disabled skip it.
    assert validator[0]["objectSelector"]["matchExpressions"][0]["key"] == (
        "trainer.kubeflow.org/webhook-validation"
    )
    jobset_hooks = {d["metadata"]["name"]: d for d in trainer.jobset_webhooks(layout)}
    assert set(jobset_hooks) == {
        "jobset-mutating-webhook-configuration",
        "jobset-validating-webhook-configuration",
    }
    for document in jobset_hooks.values():
        pod_hook = document["webhooks"][1]
        assert pod_hook["name"] in ("mpod.kb.io", "vpod.kb.io")
        assert pod_hook["objectSelector"] == {
            "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
        }
        for hook in document["webhooks"]:
            assert hook["clientConfig"]["url"].startswith(
                f"https://127.0.0.1:{_port('jobset-webhook')}/"
            )
            assert "service" not in hook["clientConfig"]


def test_runtimes_of_the_release_the_volcano_example_and_the_derived_one() -> None:
    runtimes = {r["metadata"]["name"]: r for r in trainer.cluster_training_runtimes()}
    assert {
        "torch-distributed",
        "deepspeed-distributed",
        "mlx-distributed",
        "jax-distributed",
        "xgboost-distributed",
        trainer.VOLCANO_RUNTIME,
        trainer.VOLCANO_SCHEDULED_RUNTIME,
    } <= set(runtimes)
    assert runtimes["deepspeed-distributed"]["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] == (
        "OpenMPI"
    )
    upstream, derived = (
        runtimes[trainer.VOLCANO_RUNTIME],
        runtimes[trainer.VOLCANO_SCHEDULED_RUNTIME],
    )
    assert derived["spec"]["podGroupPolicy"] == upstream["spec"]["podGroupPolicy"]
    for job in derived["spec"]["template"]["spec"]["replicatedJobs"]:
        assert job["template"]["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    for job in upstream["spec"]["template"]["spec"]["replicatedJobs"]:  # left as it was
        assert "schedulerName" not in job["template"]["spec"]["template"]["spec"]


def test_after_start_writes_the_certificate_secret_then_webhooks_then_runtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _context(tmp_path, monkeypatch, "x").layout
    kinds = [m["kind"] for m in trainer.after_start_manifests(layout)]
    assert kinds[0] == "Secret"
    first_runtime = kinds.index("ClusterTrainingRuntime")
    assert set(kinds[1:first_runtime]) == {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    secret = trainer.webhook_secret(layout)
    assert secret["metadata"] == {
        "name": trainer.TRAINER_WEBHOOK_SECRET,
        "namespace": trainer.TRAINER_NAMESPACE,
    }
    assert base64.b64decode(secret["data"]["ca.crt"]) == layout.ca_file.read_bytes()


def test_prerequisites_bind_each_controller_and_give_trainer_issuer_discovery() -> None:
    manifests = trainer.trainer_manifests()
    bindings = [
        (m["subjects"][0]["name"], m["roleRef"]["name"])
        for m in manifests
        if m["kind"] == "ClusterRoleBinding"
    ]
    trainer_user, jobset_user = trainer.TRAINER_IDENTITY.user, trainer.JOBSET_IDENTITY.user
    assert (trainer_user, trainer_user) in bindings
    assert (trainer_user, "system:service-account-issuer-discovery") in bindings
    assert (jobset_user, jobset_user) in bindings
    roles = {m["metadata"]["name"]: m["rules"] for m in manifests if m["kind"] == "ClusterRole"}
    assert any("jobsets" in r.get("resources", []) for r in roles[trainer_user])
    assert any("jobs" in r.get("resources", []) for r in roles[jobset_user])
    account = next(m for m in manifests if m["kind"] == "ServiceAccount")
    assert account["metadata"]["namespace"] == trainer.TRAINER_NAMESPACE


def test_crds_of_both_come_from_their_modules() -> None:
    names = content.crd_names()
    assert {
        "trainjobs.trainer.kubeflow.org",
        "trainingruntimes.trainer.kubeflow.org",
        "clustertrainingruntimes.trainer.kubeflow.org",
        "jobsets.jobset.x-k8s.io",
    } <= set(names)


def test_json_patch_supports_only_add_and_replace() -> None:
    document = {"a": [1, 2]}
    trainer.apply_json_patch(document, [{"op": "add", "path": "/a/-", "value": 3}])
    assert document == {"a": [1, 2, 3]}
    with pytest.raises(TestbedError, match="unsupported JSON patch"):
        trainer.apply_json_patch(document, [{"op": "remove", "path": "/a"}])


def _token(issuer: str) -> str:
    payload = base64.urlsafe_b64encode(f'{{"iss": "{issuer}"}}'.encode()).decode().rstrip("=")
    return f"e30.{payload}.signature"


def test_the_token_is_written_only_when_the_api_server_is_its_own_issuer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _context(tmp_path, monkeypatch, "x").layout
    monkeypatch.setattr(cluster, "call", lambda *a, **k: _token(layout.apiserver_url))
    path = trainer.write_token(layout)
    assert path == trainer.token_file(layout)
    assert trainer.token_issuer(path.read_text()) == layout.apiserver_url
    assert path.stat().st_mode & 0o777 == 0o600
    old = "https://kubernetes.default.svc.cluster.local"
    monkeypatch.setattr(cluster, "call", lambda *a, **k: _token(old))
    with pytest.raises(TestbedError, match="not as itself") as error:
        trainer.write_token(layout)
    assert "testbed down" in str(error.value.hint)
