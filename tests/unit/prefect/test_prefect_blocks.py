"""The blocks: credentials from each way in, validation, hidden secrets, a usable UI form."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from kubedl_prefect.kube.credentials import (
    BearerToken,
    InCluster,
    KubeconfigContent,
    KubeconfigFile,
)
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.prefect.blocks import (
    KubernetesCluster,
    RetrySettings,
    TrainingJob,
    WaitSettings,
    normalize_ca,
)
from kubedl_prefect.spec import load_spec, spec_to_data

EXAMPLE = Path(__file__).parents[3] / "examples" / "pytorch-mnist.yaml"
PEM_BODY = base64.b64encode(b"not a real certificate, only its framing" * 3).decode()
PEM_LINES = "\n".join(PEM_BODY[i : i + 64] for i in range(0, len(PEM_BODY), 64))
PEM = f"-----BEGIN CERTIFICATE-----\n{PEM_LINES}\n-----END CERTIFICATE-----\n"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.s3cr3t-token-value"


def test_each_way_in_gives_its_credentials() -> None:
    content = KubernetesCluster(kubeconfig=SecretStr("apiVersion: v1"), context="gpu")
    assert content.credentials() == KubeconfigContent("apiVersion: v1", "gpu")
    trusted = KubernetesCluster(kubeconfig=SecretStr("apiVersion: v1"), trust_kubeconfig=True)
    assert trusted.credentials() == KubeconfigContent("apiVersion: v1", trusted=True)
    path = KubernetesCluster(kubeconfig_path="/etc/kube/config", context="gpu")
    assert path.credentials() == KubeconfigFile("/etc/kube/config", "gpu")
    assert KubernetesCluster(in_cluster=True).credentials() == InCluster()
    token = KubernetesCluster(server="https://k8s:6443", token=SecretStr(TOKEN), ca_cert=PEM)
    creds = token.credentials()
    assert isinstance(creds, BearerToken)
    assert creds.token == TOKEN
    assert creds.ca_cert == normalize_ca(PEM)


def test_the_default_is_the_process_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/somewhere/config")
    assert KubernetesCluster().credentials() == KubeconfigFile()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"in_cluster": True, "kubeconfig_path": "/x"}, "one way to reach the cluster, not 2"),
        ({"server": "https://k8s:6443"}, "needs both server and token"),
        ({"token": SecretStr("t")}, "needs both server and token"),
        ({"kubeconfig_path": "/x", "ca_file": "/ca.pem"}, r"go with server \+ token only"),
        (
            {"server": "https://k", "token": SecretStr("t"), "ca_cert": PEM, "ca_file": "/ca"},
            "ca_cert or ca_file, not both",
        ),
        ({"server": "https://k", "token": SecretStr("t"), "ca_cert": "junk"}, "neither PEM"),
        ({"kubeconfig_path": "/x", "trust_kubeconfig": True}, "goes with kubeconfig"),
        ({"in_cluster": True, "trust_kubeconfig": True}, "goes with kubeconfig"),
        (
            {"kubeconfig_path": "/x", "insecure_skip_tls_verify": True},
            "insecure_skip_tls_verify goes with server",
        ),
        (
            {
                "server": "https://k",
                "token": SecretStr("t"),
                "ca_cert": PEM,
                "insecure_skip_tls_verify": True,
            },
            "a CA to check the server against, or insecure_skip_tls_verify",
        ),
        (
            {"server": f"https://admin:{TOKEN}@k8s:6443", "token": SecretStr("t")},
            "the server URL holds user info",
        ),
    ],
)
def test_contradictions_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KubernetesCluster(**fields)  # type: ignore[arg-type]


def test_a_pem_that_lost_its_line_breaks_or_came_as_base64_is_repaired() -> None:
    flattened = PEM.replace("\n", " ")
    assert normalize_ca(flattened) == PEM
    assert normalize_ca(base64.b64encode(PEM.encode()).decode()) == PEM


def test_secrets_never_show_in_repr_dumps_or_credentials() -> None:
    block = KubernetesCluster(server="https://k8s:6443", token=SecretStr(TOKEN))
    kubeconfig = KubernetesCluster(kubeconfig=SecretStr(f"users: [{{user: {{token: {TOKEN}}}}}]"))
    for shown in (
        repr(block),
        str(block),
        block.model_dump_json(),
        repr(block.credentials()),
        repr(kubeconfig),
        kubeconfig.model_dump_json(),
        repr(kubeconfig.credentials()),
        repr(block.backend()),
    ):
        assert TOKEN not in shown


def test_secret_fields_are_marked_secret_in_the_block_schema() -> None:
    schema = KubernetesCluster.model_json_schema()
    assert set(schema["secret_fields"]) == {"kubeconfig", "token"}
    properties = schema["properties"]
    for name, field in properties.items():
        assert field.get("title"), name
    for secret in ("kubeconfig", "token"):
        assert {"type": "string", "format": "password", "writeOnly": True} in properties[secret][
            "anyOf"
        ]
    assert KubernetesCluster.get_block_type_slug() == "kubedl-kubernetes-cluster"
    assert TrainingJob.get_block_type_slug() == "kubedl-training-job"
    assert KubernetesCluster.get_description()
    assert TrainingJob.get_code_example()


def test_the_cluster_block_makes_a_backend_with_labels_for_its_namespace() -> None:
    cluster = KubernetesCluster(kubeconfig_path="/etc/kube/config", namespace="ml")
    backend = cluster.backend(dialect="kubeflow", labels={"team": "vision"})
    assert isinstance(backend, KubernetesBackend)
    assert (backend.namespace, backend.dialect.value, backend.labels) == (
        "ml",
        "kubeflow",
        {"team": "vision"},
    )
    manifest = backend.manifest(load_spec(EXAMPLE), key="k")
    assert manifest["metadata"]["labels"]["team"] == "vision"
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubedl-prefect"


def test_only_secret_free_unsaved_clusters_name_themselves_for_cleanup() -> None:
    assert KubernetesCluster(kubeconfig_path="/k", context="c").cleanup_reference() == {
        "kubeconfigPath": "/k",
        "context": "c",
        "inCluster": False,
    }
    assert KubernetesCluster(server="https://k", token=SecretStr(TOKEN)).cleanup_reference() is None


def test_training_job_takes_the_spec_inline_typed_or_as_a_file(tmp_path: Path) -> None:
    typed = load_spec(EXAMPLE)
    inline = TrainingJob(spec=typed)
    assert inline.spec == spec_to_data(typed)
    assert inline.training_spec() == typed
    assert TrainingJob.from_spec_file(EXAMPLE).training_spec() == typed
    by_path = TrainingJob.from_spec_file(EXAMPLE, inline=False)
    assert by_path.spec is None
    assert by_path.training_spec() == typed


def test_training_job_refuses_specs_its_operator_cannot_run() -> None:
    elastic = load_spec(EXAMPLE.with_name("pytorch-elastic.yaml"))
    TrainingJob(spec=elastic, dialect="kubeflow")
    with pytest.raises(ValidationError, match="elastic"):
        TrainingJob(spec=elastic, dialect="kubedl")
    with pytest.raises(ValidationError, match="one of them"):
        TrainingJob()
    with pytest.raises(ValidationError, match="replicas"):
        TrainingJob(spec={"name": "x", "image": "busybox"})


def test_training_job_runs_the_trainer_dialect_and_refuses_what_trainer_cannot_run() -> None:
    # The block once allowed kubedl and kubeflow only: no flow could submit a TrainJob.
    spec = {
        "name": "mnist",
        "image": "registry.example/mnist:1.0",
        "command": ["torchrun", "train.py"],
        "replicas": {"master": 1, "worker": 1},
    }
    job = TrainingJob(spec=spec, dialect="trainer")
    assert job.dialect == "trainer"
    with pytest.raises(ValidationError, match="TensorFlow"):
        TrainingJob(
            spec={**spec, "framework": "tensorflow", "replicas": {"worker": 2}},
            dialect="trainer",
        )


def test_retry_and_wait_settings_become_the_lifecycle_policies() -> None:
    policy = RetrySettings(max_attempts=2, backoff_s=1, backoff_factor=3).policy()
    assert (policy.max_attempts, policy.delay_s(2)) == (2, 3.0)
    timeouts = WaitSettings(admission_s=None, completion_s=3600).timeouts()
    assert (timeouts.admission_s, timeouts.completion_s) == (None, 3600)
    with pytest.raises(ValidationError):
        RetrySettings(max_attempts=0)


def test_the_shipped_block_documents_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubedl_prefect.prefect.documents import load_documents

    root = Path(__file__).parents[3] / "blocks"
    monkeypatch.chdir(root.parent)
    testbed = load_documents(root / "testbed.yaml", environ={"HOME": "/home/me"})
    assert [(d.slug, d.name) for d in testbed] == [
        ("kubedl-kubernetes-cluster", "testbed"),
        ("kubedl-training-job", "pytorch-mnist"),
    ]
    cluster, job = (d.block for d in testbed)
    assert isinstance(job, TrainingJob)
    assert job.cluster is cluster
    assert job.training_spec().name == "pytorch-mnist"
    production = load_documents(
        root / "production.yaml",
        environ={
            "KUBEDL_PREFECT_TOKEN": TOKEN,
            "KUBEDL_PREFECT_CA": base64.b64encode(PEM.encode()).decode(),
        },
    )
    token_block = production[0].block
    assert isinstance(token_block, KubernetesCluster)
    assert isinstance(token_block.credentials(), BearerToken)
    assert isinstance(production[1].block, KubernetesCluster)
    assert production[1].block.credentials() == InCluster()


def test_a_document_with_an_unset_variable_names_it(tmp_path: Path) -> None:
    from kubedl_prefect.errors import KubeDLPrefectError
    from kubedl_prefect.prefect.documents import load_documents

    file = tmp_path / "b.yaml"
    file.write_text(
        "blocks:\n  - type: kubedl-kubernetes-cluster\n    name: x\n"
        "    data: {server: 'https://k', token: '${NOT_SET_ANYWHERE}'}\n"
    )
    with pytest.raises(KubeDLPrefectError, match=r"\$\{NOT_SET_ANYWHERE\}"):
        load_documents(file, environ={})


def test_validation_errors_never_quote_a_secret() -> None:
    with pytest.raises(ValidationError) as caught:
        KubernetesCluster(token=TOKEN, in_cluster=True)  # type: ignore[arg-type]
    assert TOKEN not in str(caught.value)
    assert "one way to reach the cluster" in str(caught.value)
    with pytest.raises(ValidationError) as nested:
        TrainingJob(spec={"name": "x"}, cluster={"token": TOKEN, "in_cluster": True})  # type: ignore[arg-type]
    assert TOKEN not in str(nested.value)
