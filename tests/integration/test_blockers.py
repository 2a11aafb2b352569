"""Every reason a job does not start, on the real test bed, as a user would meet it.

Each test makes the test bed's own object that blocks a job (a queue that does not exist, a
PriorityClass that does not exist, a node selector no node has, a tainted node, an unbound
claim, a quota, an invalid pod template, a job no operator acts on), submits a CPU-only gang job
(no GPU of the shared test bed is held) as the ServiceAccount of deploy/rbac.yaml with the
ClusterRole of deploy/cluster-rbac.yaml, and asserts the category, the object named in the
message, that a permanent cause fails the job within 10 s, and that nothing of the job is left
once the wait gives up.

"The operator stopped" is tested twice: with the KubeDL operator really stopped
(``Testbed.stop``, its supervisor holding it down until ``Testbed.start``), and with a Kubeflow job
handed to a controller that does not run (``runPolicy.managedBy``): to the wait both are the same,
a job nothing acts on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import AdmissionTimeoutError, FailureCategory, NotFoundError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    VOLCANO_PODGROUPS,
    VOLCANO_QUEUES,
    ResourceKind,
)
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.backend import JobOutcome, JobRef, PhaseUpdate, WaitTimeouts
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend, operators
from kubedl_prefect.lifecycle.kubernetes.facts import RESOURCE_QUOTAS
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import TrainingJobSpec, loads_spec
from kubedl_prefect.testbed.testbed import Testbed

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).parents[2] / "deploy"
STAGE = "testbed.kubedl-prefect.io"
PERMANENT_WITHIN_S = 10.0
LEFT_BEHIND_SETTLE_S = 15.0
ACCOUNT = "least-privilege"


def gang_spec(name: str, extra: str = "", *, resources: str = "{cpu: 1}") -> TrainingJobSpec:
    return loads_spec(
        f"""
name: {name}
framework: pytorch
image: registry.example/mnist:1.0
command: [python, train.py]
resources: {resources}
annotations: {{"{STAGE}/run-duration": "60s"}}
replicas:
  master: 1
  worker: 2
{extra}"""
    )


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture
async def admin(admin_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(str(admin_kubeconfig))
    yield client
    await client.close()


@pytest.fixture
def least_privilege_kubeconfig(
    namespace: str, service_account_kubeconfig: Callable[..., Path]
) -> Path:
    """The ServiceAccount bound to the Role of deploy/rbac.yaml (namespaced reads only)."""
    role = next(d for d in _documents(DEPLOY / "rbac.yaml") if d["kind"] == "Role")
    return service_account_kubeconfig(namespace, role["rules"], ACCOUNT)


@pytest.fixture
async def cluster_reads(namespace: str, admin: KubeClient) -> AsyncIterator[str]:
    """The ClusterRole of deploy/cluster-rbac.yaml, bound to the test's ServiceAccount."""
    documents = _documents(DEPLOY / "cluster-rbac.yaml")
    name = f"kubedl-prefect-diagnosis-{namespace}"
    role = next(d for d in documents if d["kind"] == "ClusterRole")
    binding = next(d for d in documents if d["kind"] == "ClusterRoleBinding")
    role = {**role, "metadata": {"name": name}}
    binding = {
        **binding,
        "metadata": {"name": name},
        "roleRef": {**binding["roleRef"], "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    }
    await admin.create(CLUSTER_ROLES, None, role)
    await admin.create(CLUSTER_ROLE_BINDINGS, None, binding)
    yield name
    await admin.delete(CLUSTER_ROLE_BINDINGS, None, name)
    await admin.delete(CLUSTER_ROLES, None, name)


def make_backend(kubeconfig: Path, namespace: str, dialect: str) -> KubernetesBackend:
    return KubernetesBackend(namespace=namespace, dialect=dialect, kubeconfig=str(kubeconfig))


@pytest.fixture
async def kubedl(
    namespace: str, least_privilege_kubeconfig: Path, cluster_reads: str
) -> AsyncIterator[KubernetesBackend]:
    backend = make_backend(least_privilege_kubeconfig, namespace, "kubedl")
    yield backend
    await backend.close()


@pytest.fixture
async def kubeflow(
    namespace: str, least_privilege_kubeconfig: Path, cluster_reads: str
) -> AsyncIterator[KubernetesBackend]:
    backend = make_backend(least_privilege_kubeconfig, namespace, "kubeflow")
    yield backend
    await backend.close()


async def left_behind(admin: KubeClient, ref: JobRef) -> list[str]:
    """Names of the job, its pods and PodGroups still in its namespace.

    The backend returns once its informers saw them go; an operator reconciling from a stale
    cache can still create a pod that names the deleted job as its owner, which the garbage
    collector then removes. So this waits (bounded) for the namespace to settle empty.
    """
    kind = ResourceKind.of({"apiVersion": ref.api_version, "kind": ref.kind})
    deadline = time.monotonic() + LEFT_BEHIND_SETTLE_S
    while True:
        found = []
        for listed in (kind, PODS, VOLCANO_PODGROUPS):
            items = (await admin.list(listed, ref.namespace)).items
            # Items of built-in lists carry no kind of their own.
            found += [f"{listed.kind}/{o['metadata']['name']}" for o in items]
        if not found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


async def fails_at_once(
    backend: KubernetesBackend, spec: TrainingJobSpec, key: str
) -> tuple[JobRef, JobOutcome, float]:
    """Submit and wait; return the reference, the outcome and seconds from submission to it."""
    started = time.monotonic()
    ref = await backend.submit(spec, key=key)
    outcome = await asyncio.wait_for(
        backend.wait_completed(ref, timeouts=WaitTimeouts(admission_s=60)), 60
    )
    return ref, outcome, time.monotonic() - started


async def assert_failed_for_good(
    admin: KubeClient,
    backend: KubernetesBackend,
    spec: TrainingJobSpec,
    category: FailureCategory,
    named: str,
) -> None:
    ref, outcome, elapsed = await fails_at_once(backend, spec, key=category.value.lower())
    assert outcome.status.phase is Phase.FAILED
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category is category, outcome.diagnosis
    assert named in outcome.diagnosis.message
    assert not outcome.diagnosis.retryable
    assert elapsed < PERMANENT_WITHIN_S, f"failed after {elapsed:.1f}s"
    assert await left_behind(admin, ref) == []


async def test_a_queue_that_does_not_exist_fails_the_job_at_once(
    kubedl: KubernetesBackend, admin: KubeClient
) -> None:
    queue = f"nosuch-{uuid.uuid4().hex[:6]}"
    spec = gang_spec("queue", f"gang: {{scheduler: volcano, queue: {queue}}}\n")
    await assert_failed_for_good(
        admin, kubedl, spec, FailureCategory.QUEUE_NOT_FOUND, f'Volcano Queue "{queue}"'
    )


async def test_a_priority_class_that_does_not_exist_fails_the_job_at_once(
    kubeflow: KubernetesBackend, admin: KubeClient
) -> None:
    spec = gang_spec("priority", "gang: {scheduler: volcano, priorityClass: nosuch-priority}\n")
    await assert_failed_for_good(
        admin,
        kubeflow,
        spec,
        FailureCategory.PRIORITY_CLASS_NOT_FOUND,
        'PriorityClass "nosuch-priority"',
    )


async def test_a_node_selector_no_node_matches_fails_the_job_at_once(
    kubedl: KubernetesBackend, admin: KubeClient
) -> None:
    spec = gang_spec("selector", "gang: {scheduler: volcano}\nnodeSelector: {disktype: ssd}\n")
    await assert_failed_for_good(
        admin, kubedl, spec, FailureCategory.NO_MATCHING_NODE, "nodeSelector disktype=ssd"
    )


@pytest.fixture
async def tainted_node(admin: KubeClient, namespace: str) -> AsyncIterator[str]:
    """A kwok node of its own (no GPU), labelled for this test and tainted; Ready."""
    name = f"tainted-{namespace[-6:]}"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"blockers-test": name, "type": "kwok", "kubernetes.io/os": "linux"},
        },
        "spec": {"taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        },
    }
    await admin.create(NODES, None, node)
    try:
        deadline = time.monotonic() + 30
        while True:
            current = await admin.get(NODES, None, name)
            conditions = (current.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                break
            assert time.monotonic() < deadline, "the tainted node did not become Ready"
            await asyncio.sleep(0.2)
        yield name
    finally:
        await admin.delete(NODES, None, name, propagation="Background")


async def test_a_taint_no_pod_tolerates_fails_the_job_at_once(
    kubedl: KubernetesBackend, admin: KubeClient, tainted_node: str
) -> None:
    spec = gang_spec(
        "taint", f"gang: {{scheduler: volcano}}\nnodeSelector: {{blockers-test: {tainted_node}}}\n"
    )
    await assert_failed_for_good(
        admin, kubedl, spec, FailureCategory.UNTOLERATED_TAINT, "dedicated=training:NoSchedule"
    )


async def test_a_pod_template_the_api_server_refuses_fails_the_job_at_once(
    kubedl: KubernetesBackend, admin: KubeClient
) -> None:
    spec = gang_spec(
        "invalid",
        "gang: {scheduler: volcano}\npodTemplate: {spec: {containers: [{name: pytorch, "
        "volumeMounts: [{name: nosuch, mountPath: /x}]}]}}\n",
    )
    await assert_failed_for_good(
        admin,
        kubedl,
        spec,
        FailureCategory.POD_REFUSED,
        'volumeMounts[0].name: Not found: "nosuch"',
    )


async def test_a_quota_smaller_than_the_job_fails_it_at_once(
    kubeflow: KubernetesBackend, admin: KubeClient, namespace: str
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "team-quota"},
        "spec": {"hard": {"requests.cpu": "2"}},
    }
    await admin.create(RESOURCE_QUOTAS, namespace, quota)
    spec = gang_spec("quota", "gang: {scheduler: volcano}\n")  # 3 pods x 1 CPU
    await assert_failed_for_good(
        admin,
        kubeflow,
        spec,
        FailureCategory.QUOTA_EXCEEDED,
        f"ResourceQuota {namespace}/team-quota",
    )


@pytest.fixture
async def pending_claim(admin: KubeClient, namespace: str) -> AsyncIterator[str]:
    """A claim that never binds (no storage class, no volume)."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "scratch"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    await admin.create(PERSISTENT_VOLUME_CLAIMS, namespace, claim)
    yield "scratch"
    # The test bed runs no pvc-protection controller: drop its finalizer, or the claim (and the
    # namespace) would stay for ever.
    with contextlib.suppress(NotFoundError):
        await admin.patch(
            PERSISTENT_VOLUME_CLAIMS, namespace, "scratch", {"metadata": {"finalizers": None}}
        )


async def test_an_unbound_claim_is_waited_for_reported_and_cleaned_up_at_the_timeout(
    kubedl: KubernetesBackend, admin: KubeClient, pending_claim: str, namespace: str
) -> None:
    spec = gang_spec(
        "unbound",
        f"gang: {{scheduler: volcano}}\nvolumes: [{{name: data, mountPath: /data, "
        f"pvc: {pending_claim}}}]\n",
    )
    ref = await kubedl.submit(spec, key="unbound")
    seen: list[PhaseUpdate] = []
    with pytest.raises(AdmissionTimeoutError) as caught:
        await kubedl.wait_completed(ref, timeouts=WaitTimeouts(admission_s=8), on_phase=seen.append)
    assert caught.value.blocker == AdmissionBlocker.UNBOUND_PVC.value
    assert caught.value.subject == f"PersistentVolumeClaim {namespace}/{pending_claim}"
    assert f'PersistentVolumeClaim "{pending_claim}" is Pending' in (caught.value.last_reason or "")
    reported = [u.admission for u in seen if u.admission is not None]
    assert reported
    assert reported[-1].blocker is AdmissionBlocker.UNBOUND_PVC
    assert await left_behind(admin, ref) == []


async def test_a_job_no_operator_acts_on_names_the_controller_and_is_cleaned_up(
    kubeflow: KubernetesBackend, admin: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operators, "OPERATOR_GRACE_S", 2.0)
    spec = gang_spec("unattended", "gang: {scheduler: volcano}\n")
    manifest = kubeflow.manifest(spec, key="unattended")
    manifest["spec"]["runPolicy"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    kind = ResourceKind.of(manifest)

    async def create() -> None:
        client = await kubeflow.client()
        await client.create(kind, kubeflow.namespace, manifest)

    await KubeRuntime.get().run(create())
    ref = await kubeflow.submit(spec, key="unattended")  # adopts the job made above
    seen: list[PhaseUpdate] = []
    with pytest.raises(AdmissionTimeoutError) as caught:
        await kubeflow.wait_completed(
            ref, timeouts=WaitTimeouts(admission_s=6), on_phase=seen.append
        )
    assert caught.value.blocker == AdmissionBlocker.OPERATOR_NOT_RUNNING.value
    assert "kueue.x-k8s.io/multikueue" in (caught.value.last_reason or "")
    assert f"PyTorchJob {ref.namespace}/{ref.name}" in (caught.value.last_reason or "")
    unattended = [u for u in seen if u.admission is not None]
    assert unattended
    assert unattended[-1].phase is Phase.CREATED
    assert await left_behind(admin, ref) == []


@pytest.mark.exclusive  # stops or restarts a shared component
async def test_a_job_of_a_stopped_operator_names_it_and_is_cleaned_up(
    kubedl: KubernetesBackend,
    admin: KubeClient,
    testbed: Testbed,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(operators, "OPERATOR_GRACE_S", 2.0)
    spec = gang_spec("no-operator")
    await asyncio.to_thread(testbed.stop, "kubedl-operator")
    try:
        ref = await kubedl.submit(spec, key="no-operator")
        with pytest.raises(AdmissionTimeoutError) as caught:
            await kubedl.wait_completed(ref, timeouts=WaitTimeouts(admission_s=6))
        assert await left_behind(admin, ref) == []
    finally:
        await asyncio.to_thread(testbed.start, "kubedl-operator")
    assert caught.value.blocker == AdmissionBlocker.OPERATOR_NOT_RUNNING.value
    reason = caught.value.last_reason or ""
    assert f"PyTorchJob {ref.namespace}/{ref.name}" in reason
    assert "KubeDL" in reason or "kubedl" in reason


async def test_without_the_cluster_reads_the_wait_says_what_it_could_not_check(
    namespace: str, least_privilege_kubeconfig: Path, admin: KubeClient
) -> None:
    backend = make_backend(least_privilege_kubeconfig, namespace, "kubedl")
    try:
        spec = gang_spec("unchecked", "gang: {scheduler: volcano, queue: nosuch-unchecked}\n")
        ref = await backend.submit(spec, key="unchecked")
        with pytest.raises(AdmissionTimeoutError) as caught:
            await backend.wait_completed(ref, timeouts=WaitTimeouts(admission_s=5))
        reason = caught.value.last_reason or ""
        assert "Queue nosuch-unchecked" in reason
        assert "could not check: Queue nosuch-unchecked (forbidden)" in reason
        assert await left_behind(admin, ref) == []
        assert await admin.list(VOLCANO_QUEUES, None)  # the test bed's own queues are untouched
    finally:
        await backend.close()
