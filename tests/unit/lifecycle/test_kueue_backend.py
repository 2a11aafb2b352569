"""The backend's waits with Kueue, in seconds: against the in-memory API server over HTTP.

Kueue is played by the test (its Workload, LocalQueue and ClusterQueue, and the suspend and
resume of the job), as :class:`FakeOperator` plays the operator; the real Kueue comes to the test
bed later (issue 19 item 1).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import AdmissionTimeoutError, FailureCategory, JobFailedError
from kubedl_prefect.kube.credentials import connect
from kubedl_prefect.kube.resources import (
    KUEUE_CLUSTER_QUEUES,
    KUEUE_LOCAL_QUEUES,
    KUEUE_WORKLOADS,
    ResourceKind,
)
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import SessionPool
from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate, WaitTimeouts
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from tests.support.operator import FakeOperator

DEPLOY = Path(__file__).parents[3] / "deploy"
PYTORCHJOBS = ResourceKind("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
UNUSED = (
    "couldn't assign flavors to pod set worker: insufficient unused quota for nvidia.com/gpu "
    "in flavor gpu-a, 2 more needed"
)
PREEMPTED = "Preempted to accommodate a workload (UID: 9a, JobUID: 9b) due to prioritization"


def spec() -> TrainingJobSpec:
    return parse_spec(
        {
            "name": "mnist",
            "image": "ghcr.io/example/mnist:1.0",
            "replicas": {"master": 1, "worker": 2},
            "kueue": {"queue": "team-a", "priorityClass": "low"},
        }
    )


@pytest.fixture
async def pool() -> AsyncIterator[SessionPool]:
    made = SessionPool()
    yield made
    await KubeRuntime.get().run(made.close())


@pytest.fixture
async def kueue(fake_api: Any) -> AsyncIterator[FakeOperator]:
    client = await connect(fake_api.credentials)
    yield FakeOperator(client)
    await client.close()


@pytest.fixture
def backend(fake_api: Any, pool: SessionPool) -> KubernetesBackend:
    return KubernetesBackend(
        namespace="ml", dialect="kubeflow", credentials=fake_api.credentials, pool=pool
    )


def condition(kind: str, status: bool, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": str(status), "reason": reason, "message": message}


async def queues(kueue: FakeOperator) -> None:
    await kueue.client.create(
        KUEUE_CLUSTER_QUEUES,
        None,
        {"metadata": {"name": "team-gpu"}, "spec": {"resourceGroups": []}},
    )
    await kueue.client.create(
        KUEUE_LOCAL_QUEUES,
        "ml",
        {"metadata": {"name": "team-a", "namespace": "ml"}, "spec": {"clusterQueue": "team-gpu"}},
    )


async def workload(kueue: FakeOperator, ref: JobRef, *conditions: dict[str, str]) -> None:
    """Kueue's Workload for the job: created, or its conditions replaced."""
    name = f"pytorchjob-{ref.name}-1a2b3"
    body = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"kueue.x-k8s.io/job-uid": ref.uid},
            "ownerReferences": [
                {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name, "uid": ref.uid}
            ],
        },
        "spec": {"queueName": "team-a"},
    }
    existing = (await kueue.client.list(KUEUE_WORKLOADS, "ml")).items
    if not existing:
        await kueue.client.create(KUEUE_WORKLOADS, "ml", body)
    await kueue.client.patch(
        KUEUE_WORKLOADS,
        "ml",
        name,
        {"status": {"conditions": list(conditions)}},
        subresource="status",
    )


async def job_state(
    kueue: FakeOperator, ref: JobRef, *, suspend: bool, conditions: list[dict[str, str]]
) -> None:
    """What Kueue and the operator write on the job: runPolicy.suspend and its conditions."""
    await kueue.client.patch(
        PYTORCHJOBS, "ml", ref.name, {"spec": {"runPolicy": {"suspend": suspend}}}
    )
    await kueue.client.patch(
        PYTORCHJOBS, "ml", ref.name, {"status": {"conditions": conditions}}, subresource="status"
    )


async def seen(updates: list[PhaseUpdate], check: Callable[[PhaseUpdate], bool]) -> None:
    deadline = time.monotonic() + 10
    while not any(check(u) for u in updates):
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen: {[(u.phase, u.status.reason) for u in updates]}")
        await asyncio.sleep(0.02)


async def test_a_job_in_a_local_queue_that_does_not_exist_fails_at_once_naming_it(
    backend: KubernetesBackend, kueue: FakeOperator, fake_api: Any
) -> None:
    ref = await backend.submit(spec(), key="nowhere")
    job = await kueue.client.get(PYTORCHJOBS, "ml", ref.name)
    assert job["spec"]["runPolicy"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    started = time.monotonic()
    with pytest.raises(JobFailedError) as caught:
        await asyncio.wait_for(backend.wait_admitted(ref, timeout_s=30), 10)
    assert time.monotonic() - started < 10
    diagnosis = caught.value.diagnosis
    assert diagnosis is not None
    assert diagnosis.category is FailureCategory.QUEUE_NOT_FOUND
    assert diagnosis.subject == "LocalQueue ml/team-a"
    assert 'LocalQueue "team-a" does not exist' in str(caught.value)
    assert (await kueue.client.list(PYTORCHJOBS, "ml")).items == []


async def test_a_job_short_of_quota_waits_naming_the_shortfall(
    backend: KubernetesBackend, kueue: FakeOperator, fake_api: Any
) -> None:
    await queues(kueue)
    ref = await backend.submit(spec(), key="short")
    await workload(kueue, ref, condition("QuotaReserved", False, "Pending", UNUSED))
    with pytest.raises(AdmissionTimeoutError) as caught:
        await asyncio.wait_for(backend.wait_admitted(ref, timeout_s=1.5), 10)
    assert caught.value.blocker == "InsufficientQuota"
    assert caught.value.subject == "ClusterQueue team-gpu"
    assert "2 more nvidia.com/gpu needed in flavor gpu-a" in (caught.value.last_reason or "")
    # The queues were read once each, however many changes the wait saw.
    assert fake_api.count("get", "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/localqueues") == 1
    assert fake_api.count("get", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/team-gpu") == 1


async def test_a_workload_kueue_decides_on_after_the_job_last_changed_is_read_again(
    backend: KubernetesBackend, kueue: FakeOperator
) -> None:
    # As the real Kueue v0.19.2 does: it suspends the job and makes the Workload, and only then
    # writes QuotaReserved False on the Workload; the job itself does not change again.
    await queues(kueue)
    ref = await backend.submit(spec(), key="decided-later")
    await job_state(
        kueue, ref, suspend=True, conditions=[condition("Suspended", True, "PyTorchJobSuspended")]
    )
    updates: list[PhaseUpdate] = []
    waiting = asyncio.ensure_future(
        backend.wait_admitted(ref, timeout_s=4, on_phase=updates.append)
    )
    await workload(kueue, ref)
    await seen(updates, lambda u: u.admission is not None and "evaluate" in u.admission.reason)
    await workload(kueue, ref, condition("QuotaReserved", False, "Pending", UNUSED))
    with pytest.raises(AdmissionTimeoutError) as caught:
        await asyncio.wait_for(waiting, 10)
    assert caught.value.blocker == "InsufficientQuota", caught.value.last_reason
    assert "2 more nvidia.com/gpu needed in flavor gpu-a" in (caught.value.last_reason or "")


async def test_an_evicted_job_is_requeued_and_the_same_job_succeeds(
    backend: KubernetesBackend, kueue: FakeOperator
) -> None:
    await queues(kueue)
    ref = await backend.submit(spec(), key="preempted")
    updates: list[PhaseUpdate] = []
    waiting = asyncio.ensure_future(
        backend.wait_completed(ref, timeouts=WaitTimeouts(), on_phase=updates.append)
    )
    created = condition("Created", True, "PyTorchJobCreated")
    suspended = condition("Suspended", True, "PyTorchJobSuspended")
    resumed = condition("Suspended", False, "PyTorchJobResumed")
    running = condition("Running", True, "PyTorchJobRunning")
    stopped = condition("Running", False, "PyTorchJobSuspended")
    reserved = condition("QuotaReserved", True, "QuotaReserved")
    admitted = condition("Admitted", True, "Admitted")

    # Queued, short of quota.
    await workload(kueue, ref, condition("QuotaReserved", False, "Pending", UNUSED))
    await job_state(kueue, ref, suspend=True, conditions=[created, suspended])
    await seen(
        updates, lambda u: u.admission is not None and "2 more nvidia.com/gpu" in u.admission.reason
    )
    # Admitted and resumed.
    await workload(kueue, ref, reserved, admitted)
    await job_state(kueue, ref, suspend=False, conditions=[created, resumed, running])
    await seen(updates, lambda u: u.phase is Phase.RUNNING)
    # Preempted: evicted, suspended again, queued again.
    evicted = condition("Evicted", True, "Preempted", PREEMPTED)
    requeued = condition("Requeued", True, "Preempted", PREEMPTED)
    await workload(
        kueue,
        ref,
        condition("QuotaReserved", False, "Pending", PREEMPTED),
        condition("Admitted", False, "NoReservation"),
        evicted,
        requeued,
    )
    await job_state(kueue, ref, suspend=True, conditions=[created, stopped, suspended])
    await seen(updates, lambda u: u.status.reason == "Requeued")
    # Admitted again: the same job resumes, and succeeds.
    cleared = condition("Evicted", False, "QuotaReserved", "Previously: Preempted")
    await workload(kueue, ref, reserved, admitted, cleared, requeued)
    await job_state(kueue, ref, suspend=False, conditions=[created, resumed, running])
    await seen(updates, lambda u: u.phase is Phase.RUNNING and u is not updates[0])
    await kueue.condition(ref, "Succeeded", "PyTorchJobSucceeded")
    outcome = await asyncio.wait_for(waiting, 10)

    assert outcome.succeeded
    phases = [u.phase for u in updates]
    assert Phase.FAILED not in phases
    assert phases.count(Phase.RUNNING) == 2
    requeue = next(u for u in updates if u.status.reason == "Requeued")
    assert requeue.phase is Phase.QUEUING
    assert requeue.status.message == f"requeued: Preempted: {PREEMPTED}"
    assert requeue.admission is not None
    assert requeue.admission.blocker is AdmissionBlocker.REQUEUED
    assert requeue.admission.reason.startswith("requeued after eviction (Preempted)")
    # One job for the key: nothing was submitted twice.
    names = [j["metadata"]["name"] for j in (await kueue.client.list(PYTORCHJOBS, "ml")).items]
    assert names == [ref.name]


def granted() -> list[dict[str, Any]]:
    """The rules of deploy/rbac.yaml's Role and deploy/cluster-rbac.yaml's ClusterRole."""
    rules: list[dict[str, Any]] = []
    for name, kind in (("rbac.yaml", "Role"), ("cluster-rbac.yaml", "ClusterRole")):
        text = (DEPLOY / name).read_text().replace("NAMESPACE", "ml")
        rules += next(d for d in yaml.safe_load_all(text) if d and d["kind"] == kind)["rules"]
    return rules


async def test_the_kueue_reads_are_granted_by_the_deployed_roles(
    backend: KubernetesBackend, kueue: FakeOperator, fake_api: Any
) -> None:
    await queues(kueue)
    ref = await backend.submit(spec(), key="granted")
    await workload(kueue, ref, condition("QuotaReserved", False, "Pending", UNUSED))
    with pytest.raises(AdmissionTimeoutError):
        await asyncio.wait_for(backend.wait_admitted(ref, timeout_s=1.0), 10)
    reads = set()
    for record in fake_api.request_log:
        parts = [p for p in record.path.split("/") if p]
        # The backend only reads them; the test plays Kueue with creates and patches.
        if record.verb in ("get", "list", "watch") and parts[1:2] == ["kueue.x-k8s.io"]:
            rest = parts[3:]
            resource = rest[2] if rest[0] == "namespaces" else rest[0]
            reads.add((resource, record.verb))
    assert reads >= {("localqueues", "get"), ("clusterqueues", "get"), ("workloads", "list")}
    rules = granted()
    for resource, verb in reads:
        assert any(
            "kueue.x-k8s.io" in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
            for r in rules
        ), (resource, verb)
