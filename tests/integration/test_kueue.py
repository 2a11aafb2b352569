"""Kueue admission on the real Kueue v0.19.2: issue 19's "Done when", for both job kinds it manages.

Jobs are submitted by the lifecycle (the least-privilege ServiceAccount of deploy/rbac.yaml, with
the ClusterQueue read of deploy/cluster-rbac.yaml) with ``kueue.queue`` set, as a Kubeflow v1
PyTorchJob and as a Trainer v2 TrainJob. Kueue's own webhooks suspend them, its Workloads and
scheduler decide, its preemption evicts; what the wait reports is the decider's reading of those
real Workloads. Each test gets a ClusterQueue of its own (bound to its namespace, quota on the
test bed's ``kwok-gpu`` flavor) and a LocalQueue. No controller may restart meanwhile.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import JobCancelledError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    KUEUE_CLUSTER_QUEUES,
    KUEUE_LOCAL_QUEUES,
    KUEUE_WORKLOADS,
    ResourceKind,
)
from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.backend import JobOutcome, JobRef, PhaseUpdate, WaitTimeouts
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import TrainingJobSpec, loads_spec
from kubedl_prefect.spec.kueue import JOB_UID_LABEL, suspend_field
from kubedl_prefect.testbed import kueue

# Every operator (Kueue included) keeps its process and restart count through each test.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("unchanged_operators")]

DEPLOY = Path(__file__).parents[2] / "deploy"
STAGE = "testbed.kubedl-prefect.io"
ACCOUNT = "least-privilege"
LOCAL_QUEUE = "gpu"
#: GPUs the test's ClusterQueue may reserve (the test bed's nodes have 16).
QUOTA_GPUS = 4
#: A permanent Kueue blocker fails the wait within this long (the job is deleted first).
AT_ONCE_S = 20.0
DIALECTS = ["kubeflow", "trainer"]
#: How long a job to be preempted runs: it must still run when the high-priority job comes,
#: also on a loaded machine (10 s was once over before it came: nothing was preempted).
LOW_RUN = "30s"


def job_spec(
    name: str,
    *,
    queue: str = LOCAL_QUEUE,
    gpus: int,
    run: str,
    priority: str | None = None,
    waiting: str | None = None,
) -> TrainingJobSpec:
    """A 2-replica PyTorch job (master + worker) asking ``gpus`` GPUs per replica.

    ``waiting``: its containers never start, waiting with this reason (its pods never ready).
    """
    priority_field = f", priorityClass: {priority}" if priority else ""
    never_ready = f', "{STAGE}/waiting-reason": "{waiting}"' if waiting else ""
    return loads_spec(
        f"""
name: {name}
framework: pytorch
image: registry.example/mnist:1.0
command: [python, train.py]
resources: {{cpu: 1, memory: 1Gi, gpus: {gpus}}}
annotations: {{"{STAGE}/run-duration": "{run}"{never_ready}}}
checkpoint: {{location: "s3://checkpoints/team"}}
kueue: {{queue: {queue}{priority_field}}}
replicas:
  master: 1
  worker: 1
"""
    )


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture
async def admin(admin_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(str(admin_kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def queues(namespace: str, admin: KubeClient) -> AsyncIterator[str]:
    """A ClusterQueue of :data:`QUOTA_GPUS` GPUs for the namespace, and LocalQueue ``gpu``."""
    name = f"cq-{namespace}"[:63]
    await admin.create(
        KUEUE_CLUSTER_QUEUES,
        None,
        # No cohort: a ClusterQueue of another test (or worker) would lend its idle quota.
        kueue.cluster_queue(name, namespace=namespace, gpus=QUOTA_GPUS),
    )
    await admin.create(
        KUEUE_LOCAL_QUEUES, namespace, kueue.local_queue(namespace, LOCAL_QUEUE, name)
    )
    yield name
    await admin.delete(KUEUE_LOCAL_QUEUES, namespace, LOCAL_QUEUE)
    await admin.delete(KUEUE_CLUSTER_QUEUES, None, name)


@pytest.fixture
async def backend(
    request: pytest.FixtureRequest,
    namespace: str,
    admin: KubeClient,
    service_account_kubeconfig: Callable[..., Path],
) -> AsyncIterator[KubernetesBackend]:
    """The lifecycle in the test's dialect, as the least-privilege account with cluster reads."""
    role = next(d for d in _documents(DEPLOY / "rbac.yaml") if d["kind"] == "Role")
    kubeconfig = service_account_kubeconfig(namespace, role["rules"], ACCOUNT)
    documents = _documents(DEPLOY / "cluster-rbac.yaml")
    name = f"kubedl-prefect-diagnosis-{namespace}"
    cluster_role = next(d for d in documents if d["kind"] == "ClusterRole")
    await admin.create(CLUSTER_ROLES, None, {**cluster_role, "metadata": {"name": name}})
    await admin.create(
        CLUSTER_ROLE_BINDINGS,
        None,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
        },
    )
    made = KubernetesBackend(namespace=namespace, dialect=request.param, kubeconfig=str(kubeconfig))
    yield made
    await made.close()
    await admin.delete(CLUSTER_ROLE_BINDINGS, None, name)
    await admin.delete(CLUSTER_ROLES, None, name)


async def _admin_list(admin: KubeClient, kind: ResourceKind, namespace: str) -> list[Any]:
    return list((await admin.list(kind, namespace)).items)


async def job_objects(admin: KubeClient, ref: JobRef) -> list[dict[str, Any]]:
    """The job objects of ``ref``'s kind in its namespace (one per submission)."""
    kind = ResourceKind.of({"apiVersion": ref.api_version, "kind": ref.kind})
    return await _admin_list(admin, kind, ref.namespace)


async def workload_of(admin: KubeClient, ref: JobRef) -> dict[str, Any] | None:
    for workload in await _admin_list(admin, KUEUE_WORKLOADS, ref.namespace):
        if (workload["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == ref.uid:
            return dict(workload)
    return None


async def until(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen in {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def blockers(updates: list[PhaseUpdate]) -> list[tuple[AdmissionBlocker, str]]:
    return [
        (u.admission.blocker, u.admission.reason)
        for u in updates
        if u.admission is not None and u.admission.blocker is not None
    ]


async def wait(
    backend: KubernetesBackend, ref: JobRef, seen: list[PhaseUpdate], admission_s: float = 120
) -> JobOutcome:
    return await backend.wait_completed(
        ref, timeouts=WaitTimeouts(admission_s=admission_s), on_phase=seen.append
    )


# -- Kueue's own webhooks ----------------------------------------------------------------------


async def test_kueues_own_webhook_suspends_a_queued_job_created_running(
    admin: KubeClient, namespace: str, queues: str
) -> None:
    # Not our client-side suspend: a batch Job created running with the queue label.
    jobs = ResourceKind("batch", "v1", "Job", "jobs")
    created = await admin.create(
        jobs,
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "plain", "labels": {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE}},
            "spec": {
                "suspend": False,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "registry.example/x:1"}],
                    }
                },
            },
        },
    )
    assert created["spec"]["suspend"] is True


# -- fails at once -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", DIALECTS, indirect=True)
async def test_a_job_in_a_local_queue_that_does_not_exist_fails_at_once_naming_it(
    backend: KubernetesBackend, admin: KubeClient, queues: str
) -> None:
    ref = await backend.submit(
        job_spec("lost", queue="nosuch", gpus=1, run="3s"), key="lost", attempt=1
    )
    created = (await job_objects(admin, ref))[0]
    path = suspend_field(created)
    assert path is not None
    node: Any = created
    for key in path:
        node = node[key]
    assert node is True  # created suspended: Kueue admits it, or nobody does
    seen: list[PhaseUpdate] = []
    started = time.monotonic()
    outcome = await wait(backend, ref, seen)
    assert time.monotonic() - started < AT_ONCE_S
    assert not outcome.succeeded
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category.value == AdmissionBlocker.QUEUE_NOT_FOUND.value
    assert outcome.diagnosis.subject == f"LocalQueue {ref.namespace}/nosuch"
    assert f'LocalQueue "nosuch" does not exist in namespace {ref.namespace}' in (
        outcome.diagnosis.message
    )
    assert await job_objects(admin, ref) == []  # deleted: nothing waits for ever


@pytest.mark.parametrize("backend", DIALECTS, indirect=True)
async def test_a_job_above_any_quota_its_queue_can_reach_fails_at_once(
    backend: KubernetesBackend, admin: KubeClient, queues: str
) -> None:
    spec = job_spec("huge", gpus=QUOTA_GPUS, run="3s")  # 2 replicas x 4 GPUs > 4
    ref = await backend.submit(spec, key="huge", attempt=1)
    seen: list[PhaseUpdate] = []
    started = time.monotonic()
    outcome = await wait(backend, ref, seen)
    assert time.monotonic() - started < AT_ONCE_S
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category.value == AdmissionBlocker.QUEUE_CAPABILITY.value
    assert outcome.diagnosis.subject == f"ClusterQueue {queues}"
    assert "nvidia.com/gpu" in outcome.diagnosis.message
    assert kueue.FLAVOR in outcome.diagnosis.message
    assert await job_objects(admin, ref) == []


# -- waits, then runs --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", DIALECTS, indirect=True)
async def test_a_job_over_the_free_quota_waits_naming_the_shortfall_and_runs_when_quota_frees(
    backend: KubernetesBackend, admin: KubeClient, queues: str
) -> None:
    hog = await backend.submit(job_spec("hog", gpus=2, run="8s"), key="hog", attempt=1)
    hog_seen: list[PhaseUpdate] = []
    hog_done = asyncio.ensure_future(wait(backend, hog, hog_seen))

    async def hog_admitted() -> bool:
        return conditions(await workload_of(admin, hog)).get("Admitted", {}).get("status") == "True"

    await until("the first job admitted", hog_admitted)
    ref = await backend.submit(job_spec("waiter", gpus=1, run="5s"), key="waiter", attempt=1)
    seen: list[PhaseUpdate] = []
    outcome = await wait(backend, ref, seen)
    assert (await hog_done).succeeded
    assert outcome.succeeded, outcome
    waiting = [
        reason
        for blocker, reason in blockers(seen)
        if blocker is AdmissionBlocker.INSUFFICIENT_QUOTA
    ]
    assert waiting, blockers(seen)
    assert (
        f"ClusterQueue {queues} (LocalQueue {ref.namespace}/{LOCAL_QUEUE}) has no room yet"
        in (waiting[0])
    )
    # The job's shortfall, in Kueue's numbers: 2 GPUs (1 per replica), all 4 held by the hog.
    assert f"has no room yet: 2 more nvidia.com/gpu needed in flavor {kueue.FLAVOR}" in waiting[0]
    phases = [u.phase for u in seen]
    assert phases.index(Phase.QUEUING) < phases.index(Phase.RUNNING) < phases.index(Phase.SUCCEEDED)
    assert Phase.FAILED not in phases
    # It ran only after the first job ended: Kueue held it, not the scheduler.
    hog_end = next(u.observed_at for u in hog_seen if u.phase is Phase.SUCCEEDED)
    first_run = next(u.observed_at for u in seen if u.phase is Phase.RUNNING)
    assert first_run >= hog_end - 1.0


# -- preempted, requeued, the same job succeeds ------------------------------------------------


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.parametrize("backend", DIALECTS, indirect=True)
async def test_a_preempted_job_is_requeued_not_resubmitted_and_ends_succeeded(
    backend: KubernetesBackend, admin: KubeClient, queues: str
) -> None:
    low = await backend.submit(
        job_spec("low", gpus=2, run=LOW_RUN, priority="low"), key="low", attempt=1
    )
    low_seen: list[PhaseUpdate] = []
    low_done = asyncio.ensure_future(wait(backend, low, low_seen))
    await until("the low-priority job running", lambda: _running(low_seen))
    high = await backend.submit(
        job_spec("high", gpus=2, run="3s", priority="high"), key="high", attempt=1
    )
    high_outcome = await wait(backend, high, [])
    outcome = await low_done
    assert high_outcome.succeeded
    assert outcome.succeeded, outcome
    assert outcome.ref.attempt == 1
    requeued = [
        reason for blocker, reason in blockers(low_seen) if blocker is AdmissionBlocker.REQUEUED
    ]
    assert requeued, blockers(low_seen)
    assert "requeued after eviction (Preempted" in requeued[0]
    phases = [u.phase for u in low_seen]
    first_run = phases.index(Phase.RUNNING)
    assert Phase.QUEUING in phases[first_run:]  # back in the queue after running
    assert phases[-1] is Phase.SUCCEEDED
    assert Phase.FAILED not in phases
    # One job object per key, the one first submitted: Kueue suspended and resumed it.
    jobs = {j["metadata"]["name"]: j for j in await job_objects(admin, low)}
    assert jobs[low.name]["metadata"]["uid"] == low.uid
    assert len(jobs) == 2  # low and high, nothing resubmitted

    # Kueue's own record of it: requeued after the preemption, admitted again, finished (a
    # moment after the job; it resets Evicted and Preempted to False, reason QuotaReserved,
    # when it admits the Workload again).
    async def finished() -> dict[str, Any] | None:
        found = await workload_of(admin, low)
        done = conditions(found).get("Finished", {}).get("status") == "True"
        return found if done else None

    seen_conditions = conditions(await until("the Workload finished", finished, timeout_s=30))
    assert seen_conditions["Requeued"]["reason"] == "Preempted", seen_conditions
    assert seen_conditions["Evicted"]["status"] == "False", seen_conditions


# -- pods never ready: evicted by waitForPodsReady, requeued, the same job -----------------------


@pytest.mark.long
@pytest.mark.timeout(480)
@pytest.mark.parametrize("backend", ["kubeflow"], indirect=True)
async def test_a_job_whose_pods_never_get_ready_is_requeued_by_pods_ready_timeout_not_failed(
    backend: KubernetesBackend, admin: KubeClient, queues: str
) -> None:
    # Kueue admits it; its containers wait for ever (ContainerCreating), so Kueue's
    # waitForPodsReady (timeout 2m in the test bed) evicts it and queues the same job again.
    spec = job_spec("unready", gpus=1, run="3s", waiting="ContainerCreating")
    ref = await backend.submit(spec, key="unready", attempt=1)
    seen: list[PhaseUpdate] = []
    long_enough = WaitTimeouts(admission_s=600, startup_s=600, completion_s=600)
    waiting = asyncio.ensure_future(
        backend.wait_completed(ref, timeouts=long_enough, on_phase=seen.append)
    )

    async def requeued() -> list[PhaseUpdate]:
        assert not waiting.done(), waiting  # the wait neither failed nor ended meanwhile
        return [u for u in seen if u.status.reason == "Requeued"]

    timeout_s = kueue.pods_ready_timeout_s() + 90
    found = await until("the job requeued after PodsReadyTimeout", requeued, timeout_s=timeout_s)
    first = found[0]
    assert first.phase is Phase.QUEUING
    assert first.status.message.startswith("requeued: PodsReadyTimeout"), first.status
    assert first.status.queue is not None
    assert first.status.queue.reason == "PodsReadyTimeout"
    phases = [u.phase for u in seen]
    assert Phase.FAILED not in phases
    assert phases.index(Phase.ADMITTED) < phases.index(Phase.QUEUING, phases.index(Phase.ADMITTED))
    # One job object, the one submitted (Kueue suspends and resumes it): nothing submitted again.
    (only,) = await job_objects(admin, ref)
    assert only["metadata"]["uid"] == ref.uid
    workload_conditions = conditions(await workload_of(admin, ref))
    evicted = workload_conditions.get("Evicted", {})
    requeue = workload_conditions.get("Requeued", {})
    assert "PodsReadyTimeout" in (evicted.get("reason"), requeue.get("reason")), workload_conditions
    await backend.cancel(ref)
    with pytest.raises(JobCancelledError):
        await waiting


async def _running(seen: list[PhaseUpdate]) -> bool:
    return any(u.phase is Phase.RUNNING for u in seen)


# -- what Prefect is told of a preemption ---------------------------------------------------


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.parametrize("backend", ["kubeflow"], indirect=True)
async def test_a_preemption_reaches_prefect_as_preempted_and_requeued_events(
    backend: KubernetesBackend,
    admin: KubeClient,
    queues: str,
    prefect_server: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter
    from prefect.states import Running

    from kubedl_prefect.prefect.context import RunContext
    from kubedl_prefect.prefect.reporting import JobReporter

    suffix = uuid.uuid4().hex[:8]
    async with get_client() as client:
        pool = f"kueue-pool-{suffix}"
        await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = await client.create_flow_from_name(f"kueue-{suffix}")
        deployment_id = await client.create_deployment(
            flow_id=flow_id, name="nightly", work_pool_name=pool
        )
        flow_run = await client.create_flow_run_from_deployment(deployment_id, state=Running())
    low = await backend.submit(
        job_spec("low", gpus=2, run=LOW_RUN, priority="low"), key="low", attempt=1
    )
    reporter = JobReporter(
        RunContext.of_flow_run(flow_run, f"kueue-{suffix}"), backend, "low", spec_name="low"
    )
    reporter.attempt(low)
    request.addfinalizer(reporter.artifacts.close)  # its Prefect client's connection
    low_seen: list[PhaseUpdate] = []
    on_phase = reporter.on_phase()

    def both(update: PhaseUpdate) -> None:
        low_seen.append(update)
        on_phase(update)

    low_done = asyncio.ensure_future(
        backend.wait_completed(low, timeouts=WaitTimeouts(admission_s=120), on_phase=both)
    )
    await until("the low-priority job running", lambda: _running(low_seen))
    high = await backend.submit(
        job_spec("high", gpus=2, run="3s", priority="high"), key="high", attempt=1
    )
    assert (await wait(backend, high, [])).succeeded
    assert (await low_done).succeeded
    assert reporter.timeline.requeues() == 1
    requeued_s = reporter.timeline.requeued_s()
    assert requeued_s is not None
    assert requeued_s > 0

    names = ["kubedl.training-job.preempted", "kubedl.training-job.requeued"]

    async def stored() -> list[Any]:
        async with get_client() as client:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(name=names),
                    related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run.id}"]),
                ),
                limit=10,
            )
        return list(page.events) if len(page.events) >= 2 else []

    events = {e.event: e for e in await until("both events stored", stored, timeout_s=30)}
    requeued = events["kubedl.training-job.requeued"]
    preempted = events["kubedl.training-job.preempted"]
    assert requeued.resource["kubedl.reason"] == "Preempted"
    assert requeued.resource["kubedl.uid"] == low.uid
    assert requeued.resource["kubedl.attempt"] == "1"
    assert requeued.payload["requeues"] >= 1
    # Kueue preempted it for a higher priority in its own ClusterQueue.
    assert preempted.resource["kubedl.reason"] in ("InClusterQueue", "Preempted")
    assert preempted.occurred <= requeued.occurred


# -- cohort borrowing --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["kubeflow"], indirect=True)
async def test_a_job_that_fits_only_by_borrowing_from_its_cohort_is_admitted_and_succeeds(
    backend: KubernetesBackend, admin: KubeClient, namespace: str
) -> None:
    # Its ClusterQueue has 2 GPUs, the job asks for 4: only the idle quota of another
    # ClusterQueue in the same cohort lets Kueue admit it. Not "above any reachable quota".
    cohort = f"co-{namespace}"[:63]
    borrower, lender = f"cqb-{namespace}"[:63], f"cql-{namespace}"[:63]
    await admin.create(
        KUEUE_CLUSTER_QUEUES,
        None,
        kueue.cluster_queue(borrower, namespace=namespace, gpus=2, cohort=cohort),
    )
    await admin.create(
        KUEUE_CLUSTER_QUEUES,
        None,
        kueue.cluster_queue(lender, namespace=f"{namespace}-idle", gpus=4, cohort=cohort),
    )
    await admin.create(
        KUEUE_LOCAL_QUEUES, namespace, kueue.local_queue(namespace, LOCAL_QUEUE, borrower)
    )
    try:
        ref = await backend.submit(job_spec("borrow", gpus=2, run="15s"), key="borrow", attempt=1)
        seen: list[PhaseUpdate] = []
        done = asyncio.ensure_future(wait(backend, ref, seen))

        async def borrowed() -> str | None:
            queue = await admin.get(KUEUE_CLUSTER_QUEUES, None, borrower)
            for flavor in (queue.get("status") or {}).get("flavorsUsage") or []:
                for resource in flavor.get("resources") or []:
                    lent = str(resource.get("borrowed") or "0")
                    if resource.get("name") == "nvidia.com/gpu" and lent != "0":
                        return lent
            return None

        assert await until("the ClusterQueue borrowing GPUs", borrowed) == "2"
        outcome = await done
        assert outcome.succeeded, outcome
        assert outcome.ref.attempt == 1
        categories = {blocker for blocker, _ in blockers(seen)}
        assert AdmissionBlocker.QUEUE_CAPABILITY not in categories, blockers(seen)
        phases = [u.phase for u in seen]
        assert Phase.FAILED not in phases
        assert phases[-1] is Phase.SUCCEEDED
        # The wait says that Kueue lent the job 2 GPUs of the lender's idle quota, when it
        # first reports the job admitted (later updates in that phase are replica counts).
        admitted = [u.admission for u in seen if u.phase is Phase.ADMITTED and u.admission]
        assert admitted, phases
        assert (
            f"admitted on quota borrowed from cohort {cohort}: 2 nvidia.com/gpu in flavor "
            f"kwok-gpu (ClusterQueue {borrower}: nominal quota 2, 4 in use)"
        ) in str(admitted[0]), admitted[0]
    finally:
        await admin.delete(KUEUE_LOCAL_QUEUES, namespace, LOCAL_QUEUE)
        await admin.delete(KUEUE_CLUSTER_QUEUES, None, borrower)
        await admin.delete(KUEUE_CLUSTER_QUEUES, None, lender)
