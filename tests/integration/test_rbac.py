"""Least privilege, shown: the whole lifecycle and a serving rollout as the Role of deploy/, no 403.

The identity is a ServiceAccount named as in deploy/rbac.yaml, bound to exactly that file's Role
and to the ClusterRole of deploy/cluster-rbac.yaml (the cluster-scoped reads a wait's diagnosis
makes), in a namespace labelled as deploy/namespace.yaml recommends (Pod Security: baseline
enforced, restricted warned). The rules are read from the files, never copied here.

Every request the library makes goes through one function of the client that turns error
answers into exceptions (:func:`kubedl_prefect.kube.client.api_error`); the ``refusals`` fixture
records every 401 or 403 it sees, including those the library swallows on purpose (a record it
cannot write, a fact it cannot read, a kind it cannot list), and each test fails on any. The
administrator's client is used only to play someone else: to replace a job or plant a ConfigMap.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import (
    AdoptionRefusedError,
    ConflictError,
    InferenceServiceNotReadyError,
    KubeAPIError,
    NotFoundError,
)
from kubedl_prefect.kube import client as client_module
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import KubeconfigFile
from kubedl_prefect.kube.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CONFIG_MAPS,
    PODS,
    VOLCANO_PODGROUPS,
    ResourceKind,
)
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.backend import LogLine
from kubedl_prefect.lifecycle.kubernetes import LABEL_KEY_HASH, LABEL_RECORD, KubernetesBackend
from kubedl_prefect.lifecycle.records import record_name
from kubedl_prefect.lifecycle.run import areattach
from kubedl_prefect.serving import (
    InferenceServiceDeployer,
    InferenceServiceSpec,
    ModelLink,
    ServingResources,
)
from kubedl_prefect.spec import TrainingJobSpec, job_name, key_hash, loads_spec
from kubedl_prefect.testbed.testbed import Testbed

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).parents[2] / "deploy"
STAGE = "testbed.kubedl-prefect.io"
PYTORCHJOBS = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")
REPLICAS = ("master-0", "worker-0", "worker-1")


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def of_kind(name: str, kind: str) -> dict[str, Any]:
    return next(d for d in documents(name) if d["kind"] == kind)


ACCOUNT: str = of_kind("rbac.yaml", "ServiceAccount")["metadata"]["name"]


def spec(run_duration: str = "4s") -> TrainingJobSpec:
    return loads_spec(
        f"""
name: mnist
framework: pytorch
image: registry.example/mnist:1.0
command: [python, train.py]
resources: {{gpus: 1}}
annotations: {{"{STAGE}/run-duration": "{run_duration}"}}
gang: {{scheduler: volcano}}
replicas:
  master: 1
  worker: 2
"""
    )


@pytest.fixture
def refusals(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every 401/403 any client of this process is answered, checked empty after the test."""
    seen: list[str] = []
    translate = client_module.api_error

    def recording(status: int, body: str, action: str) -> KubeAPIError:
        if status in (401, 403):
            seen.append(f"{status} {action}: {body[:300]}")
        return translate(status, body, action)

    monkeypatch.setattr(client_module, "api_error", recording)
    yield seen
    assert seen == [], "requests the Role of deploy/ does not allow:\n" + "\n".join(seen)


@pytest.fixture
def namespace(testbed: Testbed) -> Iterator[str]:
    """A fresh namespace with deploy/namespace.yaml's labels (short: KServe host names)."""
    labels = of_kind("namespace.yaml", "Namespace")["metadata"]["labels"]
    name = f"r-{uuid.uuid4().hex[:10]}"
    testbed.create_namespace(name, labels={**labels, "kubedl-prefect.io/test": "true"})
    yield name
    testbed.delete_namespace(name)


@pytest.fixture
async def admin(admin_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(str(admin_kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def cluster_reads(namespace: str, admin: KubeClient) -> AsyncIterator[None]:
    """deploy/cluster-rbac.yaml's ClusterRole, bound to the test's ServiceAccount."""
    name = f"kubedl-prefect-diagnosis-{namespace}"
    role = of_kind("cluster-rbac.yaml", "ClusterRole")
    binding = of_kind("cluster-rbac.yaml", "ClusterRoleBinding")
    await admin.create(CLUSTER_ROLES, None, {**role, "metadata": {"name": name}})
    await admin.create(
        CLUSTER_ROLE_BINDINGS,
        None,
        {
            **binding,
            "metadata": {"name": name},
            "roleRef": {**binding["roleRef"], "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
        },
    )
    yield
    await admin.delete(CLUSTER_ROLE_BINDINGS, None, name)
    await admin.delete(CLUSTER_ROLES, None, name)


@pytest.fixture
def role_kubeconfig(
    namespace: str, service_account_kubeconfig: Callable[..., Path], cluster_reads: None
) -> Path:
    """The ServiceAccount of deploy/rbac.yaml, bound to exactly its Role's rules."""
    rules = of_kind("rbac.yaml", "Role")["rules"]
    return service_account_kubeconfig(namespace, rules, ACCOUNT)


@pytest.fixture
async def backend(
    namespace: str, role_kubeconfig: Path, refusals: list[str]
) -> AsyncIterator[KubernetesBackend]:
    made = KubernetesBackend(namespace=namespace, dialect="kubedl", kubeconfig=str(role_kubeconfig))
    yield made
    await made.close()


async def names_left(backend: KubernetesBackend, kind: ResourceKind, job: str) -> list[str]:
    """Objects of ``kind`` named after ``job``, read as the backend's identity."""

    async def call() -> list[str]:
        client = await backend.client()
        listing = await client.list(kind, backend.namespace)
        return [o["metadata"]["name"] for o in listing.items]

    return [n for n in await KubeRuntime.get().run(call()) if n.startswith(job)]


async def test_the_lifecycle_and_a_rollout_need_nothing_beyond_the_role(
    backend: KubernetesBackend,
    testbed: Testbed,
    namespace: str,
    role_kubeconfig: Path,
    refusals: list[str],
) -> None:
    key = "least-privilege"
    name = job_name("mnist", key, 1)
    logs = {r: testbed.pod_log(namespace, f"{name}-{r}", "pytorch") for r in REPLICAS}
    for replica, log in logs.items():
        log.write(f"{replica} says hello")
    lines: list[LogLine] = []

    # Submit, wait for the gang's admission, follow logs and the job to Succeeded.
    ref = await backend.submit(spec(), key=key)
    following = asyncio.ensure_future(backend.follow_logs(ref, lines.append))
    admitted = await backend.wait_admitted(ref, timeout_s=60)
    assert admitted.admitted
    outcome = await asyncio.wait_for(backend.wait_completed(ref), 120)
    assert outcome.succeeded, outcome
    await asyncio.wait_for(following, 60)
    assert {(line.replica, line.text) for line in lines} >= {
        (r, f"{r} says hello") for r in REPLICAS
    }

    # Run records: written at submission and at the end, read back.
    await backend.close()  # the end record is written
    record = await backend.history(spec(), key=key)
    assert record is not None
    assert record.latest is not None
    assert (record.latest.uid, record.latest.phase) == (ref.uid, "Succeeded")

    # Re-attach from a reference's JSON, and adopt on a repeated submission.
    run = await areattach(ref.to_json(), credentials=KubeconfigFile(str(role_kubeconfig)))
    try:
        again = await run.wait_completed()
        assert again.succeeded
    finally:
        await run.close()
    adopted = await backend.submit(spec(), key=key)
    assert adopted.uid == ref.uid
    found = await backend.find_jobs({LABEL_KEY_HASH: key_hash(key)})
    assert [(f.name, f.uid) for f in found] == [(ref.name, ref.uid)]

    # Cancel a running job: pods and PodGroups gone; again: nothing to do.
    running = await backend.submit(spec(run_duration="300s"), key="cancelled")
    await backend.wait_admitted(running, timeout_s=60)
    await backend.cancel(running, timeout_s=60)
    assert await names_left(backend, PODS, running.name) == []
    assert await names_left(backend, VOLCANO_PODGROUPS, running.name) == []
    await backend.cancel(running, timeout_s=10)
    await backend.cancel(ref, timeout_s=60)

    # Serve a model, roll a version that never becomes Ready back, delete the service.
    deployer = InferenceServiceDeployer(
        namespace=namespace, credentials=KubeconfigFile(str(role_kubeconfig))
    )
    try:
        served = await deployer.deploy(served_version("1"), timeout_s=90)
        assert served.readiness.reason == "Ready"
        with pytest.raises(InferenceServiceNotReadyError) as caught:
            await deployer.deploy(
                served_version("2", resources=ServingResources(gpus=64)), timeout_s=15
            )
        assert caught.value.rolled_back
        await deployer.delete("fraud")
        for _ in range(150):  # KServe's finalizer goes first
            if await deployer.get("fraud") is None:
                break
            await asyncio.sleep(0.2)
        assert await deployer.get("fraud") is None
    finally:
        await deployer.close()
    assert refusals == []


def served_version(version: str, **changes: Any) -> InferenceServiceSpec:
    settings: dict[str, Any] = {
        "name": "fraud",
        "storage_uri": f"s3://ml-artifacts/3/models/m-{version}/artifacts",
        "min_replicas": 1,
        "max_replicas": 1,
        "link": ModelLink("fraud", version),
        **changes,
    }
    return InferenceServiceSpec(**settings)


async def test_cancel_spares_a_job_someone_recreated_under_the_same_name(
    backend: KubernetesBackend, admin: KubeClient, namespace: str
) -> None:
    ref = await backend.submit(spec(run_duration="300s"), key="replaced")
    manifest = backend.manifest(spec(run_duration="300s"), key="replaced")
    await admin.delete(PYTORCHJOBS, namespace, ref.name, propagation="Background")
    async with asyncio.timeout(60):
        while True:
            try:
                await admin.get(PYTORCHJOBS, namespace, ref.name)
            except NotFoundError:
                break
            await asyncio.sleep(0.2)
    replacement = await admin.create(PYTORCHJOBS, namespace, manifest)
    new_uid = replacement["metadata"]["uid"]

    with pytest.raises(ConflictError, match="was replaced") as caught:
        await backend.cancel(ref, timeout_s=30)
    message = caught.value.message
    assert new_uid in message
    assert ref.uid in message
    # The real API server's words, which tests/support/fakeapi.py repeats.
    assert (
        f'Operation cannot be fulfilled on PyTorchJob.training.kubedl.io "{ref.name}": the UID '
        f"in the precondition ({ref.uid}) does not match the UID in record ({new_uid}). The "
        "object might have been deleted and then recreated" in message
    )
    kept = await admin.get(PYTORCHJOBS, namespace, ref.name)
    assert kept["metadata"]["uid"] == new_uid
    assert kept["metadata"].get("deletionTimestamp") is None
    await admin.delete(PYTORCHJOBS, namespace, ref.name, uid=new_uid)


async def test_a_config_map_that_is_not_a_run_record_is_neither_written_nor_read(
    backend: KubernetesBackend, admin: KubeClient, namespace: str
) -> None:
    name = record_name("mnist", "planted")
    planted = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "theirs"}},
        "data": {"settings": "keep me"},
    }
    await admin.create(CONFIG_MAPS, namespace, planted)
    ref = await backend.submit(spec(run_duration="300s"), key="planted")
    await backend.close()  # every record write done
    kept = await admin.get(CONFIG_MAPS, namespace, name)
    assert kept["data"] == {"settings": "keep me"}
    assert LABEL_RECORD not in kept["metadata"]["labels"]
    with pytest.raises(AdoptionRefusedError, match="not a run record"):
        await backend.history(spec(run_duration="300s"), key="planted")
    await backend.cancel(ref, timeout_s=60)
