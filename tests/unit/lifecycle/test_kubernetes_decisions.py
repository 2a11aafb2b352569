"""The Kubernetes backend's decisions, in seconds: against the in-memory API server over HTTP.

The fake API server (tests/support/fakeapi.py) serves list, watch with bookmarks and 410, and
status subresources like a real one; :class:`FakeOperator` writes what an operator would. So the
backend runs unchanged — sessions, shared informers, records, retries, deadlines, clean-up — and
only the operator is played. The real operators are exercised on the test bed
(tests/integration/test_lifecycle.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kubedl_prefect.errors import (
    AdmissionTimeoutError,
    FailureCategory,
    ForbiddenError,
    JobCancelledError,
    JobFailedError,
    KubeDLPrefectError,
    NotFoundError,
    OperatorNotInstalledError,
    StartupTimeoutError,
)
from kubedl_prefect.kube.credentials import connect
from kubedl_prefect.kube.resources import CONFIG_MAPS, EVENTS, VOLCANO_PODGROUPS, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import SessionPool
from kubedl_prefect.lifecycle import waiting
from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate, SyncTrainingBackend, WaitTimeouts
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend, operators
from kubedl_prefect.lifecycle.records import record_name
from kubedl_prefect.lifecycle.retry import RetryPolicy, arun_to_completion
from kubedl_prefect.lifecycle.run import areattach
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from tests.support.operator import FakeOperator

PYTORCHJOBS = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")
FAST_RETRY = RetryPolicy(max_attempts=3, backoff_s=0.0)


def spec(**extra: Any) -> TrainingJobSpec:
    return parse_spec(
        {
            "name": "mnist",
            "image": "ghcr.io/example/mnist:1.0",
            "replicas": {"master": 1, "worker": 2},
            "checkpoint": {"location": "s3://checkpoints/team"},
            **extra,
        }
    )


@pytest.fixture
async def pool() -> AsyncIterator[SessionPool]:
    made = SessionPool()
    yield made
    await KubeRuntime.get().run(made.close())


@pytest.fixture
async def operator(fake_api: Any) -> AsyncIterator[FakeOperator]:
    client = await connect(fake_api.credentials)
    yield FakeOperator(client)
    await client.close()


@pytest.fixture
def make_backend(fake_api: Any, pool: SessionPool) -> Callable[..., KubernetesBackend]:
    def make(namespace: str = "ml", dialect: str = "kubedl") -> KubernetesBackend:
        return KubernetesBackend(
            namespace=namespace, dialect=dialect, credentials=fake_api.credentials, pool=pool
        )

    return make


async def until(condition: Callable[[], Awaitable[bool]], limit_s: float = 10.0) -> None:
    """Wait for a condition (checked on every tick of 20 ms), or fail."""
    deadline = time.monotonic() + limit_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def jobs_in(operator: FakeOperator, namespace: str = "ml") -> list[str]:
    listing = await operator.client.list(PYTORCHJOBS, namespace)
    return sorted(job["metadata"]["name"] for job in listing.items)


async def exists(operator: FakeOperator, ref_name: str, namespace: str = "ml") -> bool:
    return ref_name in await jobs_in(operator, namespace)


def informer_keys(pool: SessionPool) -> list[tuple[str, str | None]]:
    return sorted((i.kind.plural, i.namespace) for i in pool.informers())


# -- sessions ------------------------------------------------------------------------------


async def test_two_backends_share_one_session_and_closing_one_keeps_the_others_wait(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, pool: SessionPool
) -> None:
    first, second = make_backend(), make_backend()
    ref_a = await first.submit(spec(), key="a")
    ref_b = await second.submit(spec(), key="b")
    wait_a = asyncio.ensure_future(first.wait_completed(ref_a))
    wait_b = asyncio.ensure_future(second.wait_completed(ref_b))
    await until(lambda: _true(len(pool.informers()) >= 4))
    assert len(pool.sessions()) == 1
    keys = informer_keys(pool)
    assert len(keys) == len(set(keys)), "one informer per kind and namespace"

    await operator.run_to(ref_a)
    assert (await wait_a).succeeded
    await first.close()
    assert len(pool.sessions()) == 1  # the second backend still holds it

    await operator.run_to(ref_b)
    assert (await asyncio.wait_for(wait_b, 10)).succeeded
    await second.close()
    assert pool.sessions() == []


async def _true(value: bool) -> bool:
    return value


async def test_a_wait_that_starts_while_the_api_server_is_away_rides_it_out(
    make_backend: Callable[..., KubernetesBackend],
    operator: FakeOperator,
    fake_api: Any,
    pool: SessionPool,
) -> None:
    # An API-server restart (bench/faults_jobs.py, scenario a): the shared informers are synced
    # but their watches are broken when a wait starts on a job created just before; reading
    # that job fails until the API server is back. The wait must not fail for that.
    backend = make_backend()
    earlier = asyncio.ensure_future(backend.wait_completed(await backend.submit(spec(), key="e")))
    await until(lambda: _true(len(pool.informers()) >= 3))
    jobs_path = "/apis/training.kubedl.io/v1alpha1/namespaces/ml/pytorchjobs"
    fake_api.fail_next("watch", jobs_path, 503, "ServiceUnavailable", times=None)
    fake_api.drop_watches()
    ref = await backend.submit(spec(), key="created-before-the-restart")
    fake_api.fail_next("get", f"{jobs_path}/{ref.name}", 503, "ServiceUnavailable", times=None)
    waiting = asyncio.ensure_future(backend.wait_completed(ref))
    await until(lambda: _true(fake_api.count("get", f"{jobs_path}/{ref.name}") >= 2))
    assert not waiting.done(), waiting.exception()
    fake_api.clear_failures()  # the API server is back
    await operator.run_to(ref)
    assert (await asyncio.wait_for(waiting, 20)).succeeded
    earlier.cancel()
    await asyncio.gather(earlier, return_exceptions=True)


async def test_a_wait_that_starts_while_a_restarted_api_server_refuses_rides_it_out(
    make_backend: Callable[..., KubernetesBackend],
    operator: FakeOperator,
    fake_api: Any,
    pool: SessionPool,
) -> None:
    # The full campaign (bench/faults_jobs.py, a: 87 restarts) lost one flow run this way: the
    # wait's read of its job met the 403s of an API server whose RBAC caches were still filling.
    backend = make_backend()
    earlier = asyncio.ensure_future(backend.wait_completed(await backend.submit(spec(), key="e")))
    await until(lambda: _true(len(pool.informers()) >= 3))
    jobs_path = "/apis/training.kubedl.io/v1alpha1/namespaces/ml/pytorchjobs"
    fake_api.fail_next("watch", jobs_path, 503, "ServiceUnavailable", times=None)
    fake_api.drop_watches()
    ref = await backend.submit(spec(), key="refused-after-the-restart")
    fake_api.fail_next("get", f"{jobs_path}/{ref.name}", 403, "Forbidden", times=2)
    waiting = asyncio.ensure_future(backend.wait_completed(ref))
    await until(lambda: _true(fake_api.count("get", f"{jobs_path}/{ref.name}") >= 3))
    assert not waiting.done(), waiting.exception()
    fake_api.clear_failures()  # the watches come back too
    await operator.run_to(ref)
    assert (await asyncio.wait_for(waiting, 20)).succeeded
    earlier.cancel()
    await asyncio.gather(earlier, return_exceptions=True)


async def test_a_submission_during_an_api_server_restart_is_made_once_it_is_back(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, fake_api: Any
) -> None:
    # The record read and the create each fail twice (the API server restarting): the start of
    # a job rides that out instead of failing its task, and makes one job.
    backend = make_backend()
    fake_api.fail_next(
        "get", "/api/v1/namespaces/ml/configmaps", 503, "ServiceUnavailable", times=2
    )
    jobs_path = "/apis/training.kubedl.io/v1alpha1/namespaces/ml/pytorchjobs"
    fake_api.fail_next("create", jobs_path, 503, "ServiceUnavailable", times=2)
    assert await backend.history(spec(), key="restart") is None
    ref = await backend.submit(spec(), key="restart")
    assert await jobs_in(operator) == [ref.name]
    assert fake_api.count("create", jobs_path) == 3


async def test_refusals_of_a_just_restarted_api_server_are_tried_again_a_few_times(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, fake_api: Any
) -> None:
    # Until its RBAC caches are filled, a restarted API server answers 403 for a moment.
    backend = make_backend()
    jobs_path = "/apis/training.kubedl.io/v1alpha1/namespaces/ml/pytorchjobs"
    fake_api.fail_next("create", jobs_path, 403, "Forbidden", times=2)
    ref = await backend.submit(spec(), key="warming-up")
    assert await jobs_in(operator) == [ref.name]
    fake_api.fail_next("create", jobs_path, 403, "Forbidden", times=None)  # for good
    with pytest.raises(ForbiddenError):
        await backend.submit(spec(), key="never-allowed")
    assert fake_api.count("create", jobs_path) == 3 + 4


# -- references and attach -----------------------------------------------------------------


async def test_a_reference_is_followed_from_a_backend_of_another_namespace_and_dialect(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    ref = await make_backend("ml").submit(spec(), key="attach")
    elsewhere = make_backend("default", "kubeflow")
    run = await areattach(ref.to_json(), backend=elsewhere)
    waiting_task = asyncio.ensure_future(run.wait_completed())
    await operator.run_to(ref)
    outcome = await asyncio.wait_for(waiting_task, 10)
    assert outcome.succeeded
    assert (outcome.ref.namespace, outcome.ref.uid) == ("ml", ref.uid)


async def test_attach_refuses_a_reference_of_another_cluster(
    make_backend: Callable[..., KubernetesBackend],
) -> None:
    ref = await make_backend().submit(spec(), key="cluster")
    moved = JobRef.from_dict({**ref.to_dict(), "cluster": "https://10.9.9.9:6443"})
    with pytest.raises(KubeDLPrefectError, match=r"10\.9\.9\.9"):
        await make_backend().attach(moved)


async def test_attach_to_a_deleted_job_without_a_recorded_end_is_cancelled(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    ref = await backend.submit(spec(), key="gone")
    await operator.client.delete(PYTORCHJOBS, "ml", ref.name)
    with pytest.raises(JobCancelledError):
        await backend.attach(ref)


# -- replays -------------------------------------------------------------------------------


async def run_when_created(
    operator: FakeOperator, namespace: str, name: str, act: Callable[[JobRef], Awaitable[None]]
) -> None:
    await until(lambda: exists(operator, name, namespace))
    job = await operator.client.get(PYTORCHJOBS, namespace, name)
    ref = JobRef(
        backend="kubernetes",
        cluster="",
        dialect="kubedl",
        namespace=namespace,
        name=name,
        uid=job["metadata"]["uid"],
        api_version=job["apiVersion"],
        kind=job["kind"],
        key="",
        attempt=1,
        spec_hash="",
    )
    await act(ref)


async def test_a_replay_after_the_jobs_were_cleaned_up_does_not_train_again(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, fake_api: Any
) -> None:
    backend = make_backend()
    name = backend.manifest(spec(), key="ttl", attempt=1)["metadata"]["name"]
    playing = asyncio.ensure_future(run_when_created(operator, "ml", name, operator.run_to))
    first = await arun_to_completion(backend, spec(), key="ttl", retry=FAST_RETRY)
    await playing
    assert first.succeeded
    assert not first.replayed
    await operator.client.delete(PYTORCHJOBS, "ml", name)  # ttlSecondsAfterFinished
    await until(lambda: _not(exists(operator, name)))

    again = await arun_to_completion(backend, spec(), key="ttl", retry=FAST_RETRY)
    assert again.succeeded
    assert again.replayed
    assert again.ref.uid == first.ref.uid
    assert await jobs_in(operator) == []  # nothing was submitted


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


async def test_a_replay_after_a_recorded_eviction_resumes_at_the_next_attempt(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    ref = await backend.submit(spec(), key="evicted")
    waiting_task = asyncio.ensure_future(backend.wait_completed(ref))
    await operator.pods(ref, {"master": 1, "worker": 2})
    await operator.condition(ref, "Running")
    await operator.evict(ref, "worker-1")
    await operator.condition(ref, "Failed")
    outcome = await waiting_task
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category == FailureCategory.EVICTED
    await operator.client.delete(PYTORCHJOBS, "ml", ref.name)

    attempts: list[JobRef] = []
    second = backend.manifest(spec(), key="evicted", attempt=2)["metadata"]["name"]
    playing = asyncio.ensure_future(run_when_created(operator, "ml", second, operator.run_to))
    final = await arun_to_completion(
        backend, spec(), key="evicted", retry=FAST_RETRY, on_attempt=attempts.append
    )
    await playing
    assert [a.attempt for a in attempts] == [2]
    assert final.succeeded
    assert final.ref.attempt == 2


async def test_a_changed_spec_under_a_recorded_key_is_refused(
    make_backend: Callable[..., KubernetesBackend],
) -> None:
    backend = make_backend()
    await backend.submit(spec(), key="same")
    with pytest.raises(KubeDLPrefectError, match="another spec"):
        await backend.history(spec(image="ghcr.io/example/mnist:2.0"), key="same")


# -- retries -------------------------------------------------------------------------------


async def test_an_eviction_is_retried_with_the_same_checkpoint_and_the_next_attempt_succeeds(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    names = [backend.manifest(spec(), key="retry", attempt=n)["metadata"]["name"] for n in (1, 2)]

    async def evict(ref: JobRef) -> None:
        await operator.pods(ref, {"master": 1, "worker": 2})
        await operator.condition(ref, "Running")
        await operator.evict(ref, "worker-0")
        await operator.condition(ref, "Failed")

    async def play() -> None:
        await run_when_created(operator, "ml", names[0], evict)
        await run_when_created(operator, "ml", names[1], operator.run_to)

    playing = asyncio.ensure_future(play())
    attempts: list[JobRef] = []
    outcome = await arun_to_completion(
        backend, spec(), key="retry", retry=FAST_RETRY, on_attempt=attempts.append
    )
    await playing
    assert outcome.succeeded
    assert [a.attempt for a in attempts] == [1, 2]
    checkpoints = {
        env["value"]
        for name in names
        for role in (await operator.client.get(PYTORCHJOBS, "ml", name))["spec"][
            "pytorchReplicaSpecs"
        ].values()
        for env in role["template"]["spec"]["containers"][0].get("env", [])
        if env["name"] == "KUBEDL_PREFECT_CHECKPOINT_DIR"
    }
    assert len(checkpoints) == 1


async def test_a_user_code_failure_is_not_retried(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    name = backend.manifest(spec(), key="bug", attempt=1)["metadata"]["name"]

    async def crash(ref: JobRef) -> None:
        await operator.pods(ref, {"master": 1, "worker": 2})
        await operator.condition(ref, "Running")
        await operator.exit(ref, "master-0", 1)
        await operator.condition(ref, "Failed")

    playing = asyncio.ensure_future(run_when_created(operator, "ml", name, crash))
    with pytest.raises(JobFailedError) as caught:
        await arun_to_completion(backend, spec(), key="bug", retry=FAST_RETRY)
    await playing
    assert caught.value.attempts == 1
    assert caught.value.diagnosis is not None
    assert caught.value.diagnosis.category == FailureCategory.USER_CODE
    assert await jobs_in(operator) == [name]

    # A replay raises the recorded failure again, and submits nothing.
    await operator.client.delete(PYTORCHJOBS, "ml", name)
    with pytest.raises(JobFailedError, match="recorded"):
        await arun_to_completion(backend, spec(), key="bug", retry=FAST_RETRY)
    assert await jobs_in(operator) == []


# -- stuck jobs, deadlines, admission ------------------------------------------------------


async def test_an_image_that_cannot_be_pulled_fails_at_once_and_the_job_is_deleted(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    ref = await backend.submit(spec(), key="pull")
    waiting_task = asyncio.ensure_future(backend.wait_completed(ref))
    await operator.pods(ref, {"master": 1, "worker": 2})
    await operator.image_pull_error(ref, "worker-1")
    outcome = await asyncio.wait_for(waiting_task, 10)
    assert outcome.status.phase == Phase.FAILED
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category == FailureCategory.IMAGE_PULL
    assert not outcome.diagnosis.retryable
    assert await jobs_in(operator) == []


async def test_a_job_past_its_active_deadline_is_failed_and_deleted(
    make_backend: Callable[..., KubernetesBackend],
    operator: FakeOperator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "ACTIVE_DEADLINE_GRACE_S", 0.0)
    backend = make_backend()
    ref = await backend.submit(spec(activeDeadlineSeconds=1), key="deadline")
    waiting_task = asyncio.ensure_future(backend.wait_completed(ref))
    await operator.pods(ref, {"master": 1, "worker": 2})
    await operator.condition(ref, "Running")
    outcome = await asyncio.wait_for(waiting_task, 10)
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category == FailureCategory.DEADLINE_EXCEEDED
    assert await jobs_in(operator) == []


@pytest.mark.parametrize("delete", [True, False])
async def test_an_admission_timeout_names_the_reason_and_deletes_unless_asked_to_keep(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, delete: bool
) -> None:
    backend = make_backend()
    ref = await backend.submit(spec(), key=f"queue-{delete}")
    await operator.pods(ref, {"master": 1, "worker": 2}, scheduled=False)
    await operator.unschedulable(
        ref, "worker-1", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    )
    with pytest.raises(AdmissionTimeoutError, match=r"nvidia\.com/gpu") as caught:
        await backend.wait_admitted(ref, timeout_s=0.5, delete_on_timeout=delete)
    assert caught.value.last_reason
    assert "Insufficient" in caught.value.last_reason
    assert (await jobs_in(operator) == []) is delete


# -- callbacks -----------------------------------------------------------------------------


async def test_a_slow_callback_does_not_delay_another_jobs_terminal_report(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    slow_ref = await backend.submit(spec(), key="slow")
    fast_ref = await backend.submit(spec(), key="fast")
    blocked = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow(update: PhaseUpdate) -> None:
        if update.phase == Phase.RUNNING:
            loop.call_soon_threadsafe(blocked.set)
            time.sleep(3)

    slow_wait = asyncio.ensure_future(backend.wait_completed(slow_ref, on_phase=slow))
    fast_wait = asyncio.ensure_future(backend.wait_completed(fast_ref))
    await operator.pods(slow_ref, {"master": 1, "worker": 2})
    await operator.condition(slow_ref, "Running")
    await asyncio.wait_for(blocked.wait(), 5)  # the slow callback now sleeps for 3 s
    await operator.pods(fast_ref, {"master": 1, "worker": 2})
    await operator.condition(fast_ref, "Running")
    await operator.condition(fast_ref, "Succeeded")
    ended_at = time.monotonic()
    outcome = await asyncio.wait_for(fast_wait, 5)
    delay = time.monotonic() - ended_at
    assert outcome.succeeded
    assert delay < 0.1, f"the fast job's end was reported {delay:.3f}s late"
    await operator.condition(slow_ref, "Succeeded")
    assert (await asyncio.wait_for(slow_wait, 10)).succeeded


async def test_callbacks_never_run_on_the_runtime_loop_and_all_arrive_before_the_result(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    ref = await backend.submit(spec(), key="threads")
    seen: list[tuple[Phase, bool]] = []
    runtime = KubeRuntime.get()
    waiting_task = asyncio.ensure_future(
        backend.wait_completed(ref, on_phase=lambda u: seen.append((u.phase, runtime.in_runtime())))
    )
    await operator.run_to(ref)
    outcome = await waiting_task
    assert seen
    assert seen[-1][0] == Phase.SUCCEEDED
    assert not any(on_runtime for _, on_runtime in seen)
    assert [u.phase for u in outcome.history] == [p for p, _ in seen]


# -- records and namespaces ----------------------------------------------------------------


async def test_each_attempt_is_recorded_in_one_config_map_per_logical_job(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    ref = await backend.submit(spec(), key="record")
    task = asyncio.ensure_future(backend.wait_completed(ref))
    await operator.run_to(ref)
    await task
    record = await backend.history(spec(), key="record")
    assert record is not None
    assert record.latest is not None
    assert (record.latest.attempt, record.latest.uid, record.latest.phase) == (
        1,
        ref.uid,
        "Succeeded",
    )
    stored = await operator.client.get(CONFIG_MAPS, "ml", record_name("mnist", "record"))
    assert stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubedl-prefect"
    assert sorted(stored["data"]) == ["attempt-1"]

    # Adopting the finished job again keeps its recorded end.
    again = await backend.submit(spec(), key="record")
    assert again.uid == ref.uid
    kept = await backend.history(spec(), key="record")
    assert kept is not None
    assert kept.latest is not None
    assert kept.latest.succeeded


async def test_the_sync_face_submits_attaches_reads_history_and_cancels(
    fake_api: Any, pool: SessionPool, operator: FakeOperator
) -> None:
    backend = SyncTrainingBackend(
        KubernetesBackend(namespace="ml", credentials=fake_api.credentials, pool=pool)
    )

    def use() -> tuple[JobRef, JobRef, Any]:
        ref = backend.submit(spec(), key="sync")
        attached = backend.attach(ref)
        history = backend.history(spec(), key="sync")
        backend.cancel(ref, timeout_s=5)
        backend.cancel(ref, timeout_s=5)  # idempotent
        return ref, attached, history

    ref, attached, history = await asyncio.to_thread(use)  # the fake server runs on this loop
    assert attached == ref
    assert history is not None
    assert history.latest is not None
    assert await jobs_in(operator) == []


@pytest.mark.parametrize("delete", [True, False])
async def test_every_wait_that_gives_up_follows_one_rule_also_through_run_to_completion(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, delete: bool
) -> None:
    backend = make_backend()
    timeouts = WaitTimeouts(admission_s=0.5, delete_on_timeout=delete)
    name = backend.manifest(spec(), key=f"give-up-{delete}", attempt=1)["metadata"]["name"]

    async def queue_it(ref: JobRef) -> None:
        await operator.pods(ref, {"master": 1, "worker": 2}, scheduled=False)
        await operator.unschedulable(
            ref, "master-0", "0/2 nodes are available: 2 Insufficient cpu."
        )

    playing = asyncio.ensure_future(run_when_created(operator, "ml", name, queue_it))
    with pytest.raises(AdmissionTimeoutError, match="Insufficient cpu"):
        await arun_to_completion(
            backend, spec(), key=f"give-up-{delete}", retry=FAST_RETRY, timeouts=timeouts
        )
    await playing
    assert (await jobs_in(operator) == []) is delete

    # Called directly, the same rule: a start-up that never comes is given up on likewise.
    ref = await backend.submit(spec(), key=f"startup-{delete}")
    await operator.pods(ref, {"master": 1, "worker": 2})
    startup = WaitTimeouts(startup_s=0.5, delete_on_timeout=delete)
    with pytest.raises(StartupTimeoutError):
        await backend.wait_completed(ref, timeouts=startup)
    assert (ref.name in await jobs_in(operator)) is not delete


# -- jobs that can never start, and jobs nothing acts on -----------------------------------


def podgroup(ref: JobRef, queue: str) -> dict[str, Any]:
    """The PodGroup KubeDL makes for a gang job (labelled with the job's name)."""
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": ref.name,
            "namespace": ref.namespace,
            "labels": {"kubedl.io/gang-job-name": ref.name},
            "ownerReferences": [
                {
                    "apiVersion": ref.api_version,
                    "kind": ref.kind,
                    "name": ref.name,
                    "uid": ref.uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"minMember": 3, "queue": queue},
    }


def refusal(ref: JobRef, message: str) -> dict[str, Any]:
    """The event an operator writes on the job when the API server refuses a pod."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name}.refused", "namespace": ref.namespace},
        "involvedObject": {"kind": ref.kind, "name": ref.name, "namespace": ref.namespace},
        "reason": "FailedCreatePod",
        "type": "Warning",
        "message": f"Error creating: {message}",
        "lastTimestamp": "2026-12-01T10:00:00Z",
    }


async def test_a_missing_queue_fails_the_job_at_once_and_leaves_nothing_behind(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, fake_api: Any
) -> None:
    backend = make_backend()
    name = backend.manifest(spec(), key="no-queue", attempt=1)["metadata"]["name"]

    async def enqueue_nowhere(ref: JobRef) -> None:
        # Pods first: the fake API server has no garbage collector for pods made after the job
        # was deleted (the wait decides as soon as it sees the PodGroup).
        await operator.pods(ref, {"master": 1, "worker": 2}, scheduled=False)
        await operator.client.create(VOLCANO_PODGROUPS, "ml", podgroup(ref, "nosuch"))

    playing = asyncio.ensure_future(run_when_created(operator, "ml", name, enqueue_nowhere))
    started = time.monotonic()
    with pytest.raises(JobFailedError) as caught:
        await arun_to_completion(backend, spec(), key="no-queue", retry=FAST_RETRY)
    await playing
    assert time.monotonic() - started < 10
    diagnosis = caught.value.diagnosis
    assert diagnosis is not None
    assert diagnosis.category is FailureCategory.QUEUE_NOT_FOUND
    assert diagnosis.subject == "Queue nosuch"
    assert 'Queue "nosuch"' in str(caught.value)
    assert not caught.value.retryable
    assert caught.value.attempts == 1
    assert await jobs_in(operator) == []
    assert (await operator.client.list(VOLCANO_PODGROUPS, "ml")).items == []
    # The queue was read once, however many changes the wait saw.
    assert fake_api.count("get", "/apis/scheduling.volcano.sh/v1beta1/queues/nosuch") == 1


async def test_pods_the_api_server_refuses_fail_the_admission_wait_with_that_cause(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator
) -> None:
    backend = make_backend()
    ref = await backend.submit(spec(), key="invalid")
    await operator.client.create(VOLCANO_PODGROUPS, "ml", podgroup(ref, "default"))
    await operator.client.create(
        EVENTS,
        "ml",
        refusal(
            ref,
            f'Pod "{ref.name}-master-0" is invalid: spec.containers[0].volumeMounts[0].name: '
            'Not found: "nosuch"',
        ),
    )
    with pytest.raises(JobFailedError) as caught:
        await asyncio.wait_for(backend.wait_admitted(ref, timeout_s=30), 10)
    assert caught.value.diagnosis is not None
    assert caught.value.diagnosis.category is FailureCategory.POD_REFUSED
    assert f"{ref.name}-master-0" in caught.value.message
    assert await jobs_in(operator) == []
    record = await backend.history(spec(), key="invalid")
    assert record is not None
    assert record.latest is not None
    assert record.latest.phase == "Failed"


async def test_a_forbidden_read_is_said_instead_of_failing_the_wait(
    make_backend: Callable[..., KubernetesBackend], operator: FakeOperator, fake_api: Any
) -> None:
    fake_api.fail_next(
        "get", "/apis/scheduling.volcano.sh/v1beta1/queues", 403, "Forbidden", times=None
    )
    backend = make_backend()
    ref = await backend.submit(spec(), key="forbidden")
    await operator.client.create(VOLCANO_PODGROUPS, "ml", podgroup(ref, "nosuch"))
    with pytest.raises(AdmissionTimeoutError) as caught:
        await backend.wait_admitted(ref, timeout_s=1.0)
    assert caught.value.last_reason is not None
    assert "could not check: Queue nosuch (forbidden)" in caught.value.last_reason
    assert caught.value.blocker == "Waiting"
    assert await jobs_in(operator) == []  # given up on: deleted, as every wait that gives up
    # A refused read is not tried again in the same wait.
    assert fake_api.count("get", "/apis/scheduling.volcano.sh/v1beta1/queues/nosuch") == 1


async def test_a_job_no_operator_acts_on_is_reported_with_the_operator_to_check(
    make_backend: Callable[..., KubernetesBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operators, "OPERATOR_GRACE_S", 0.5)
    backend = make_backend()
    ref = await backend.submit(spec(), key="no-operator")
    seen: list[PhaseUpdate] = []
    started = time.monotonic()
    with pytest.raises(AdmissionTimeoutError) as caught:
        await backend.wait_completed(
            ref, timeouts=WaitTimeouts(admission_s=2.5), on_phase=seen.append
        )
    assert time.monotonic() - started < 5
    assert caught.value.blocker == "OperatorNotRunning"
    assert "the KubeDL operator" in (caught.value.last_reason or "")
    assert "--workloads" in (caught.value.hint or "")
    reported = [u for u in seen if u.admission is not None]
    assert reported
    assert reported[-1].phase is Phase.CREATED
    assert reported[-1].admission is not None
    assert reported[-1].admission.blocker is AdmissionBlocker.OPERATOR_NOT_RUNNING


async def test_a_kind_the_cluster_does_not_serve_is_refused_at_submission(
    make_backend: Callable[..., KubernetesBackend], fake_api: Any, operator: FakeOperator
) -> None:
    fake_api.fail_next(
        "create",
        "/apis/training.kubedl.io/",
        404,
        "NotFound",
        message="the server could not find the requested resource",
    )
    with pytest.raises(OperatorNotInstalledError) as caught:
        await make_backend().submit(spec(), key="no-crd")
    assert isinstance(caught.value, NotFoundError)
    assert "pytorchjobs.training.kubedl.io" in caught.value.message
    assert caught.value.diagnosis is not None
    assert caught.value.diagnosis.category is FailureCategory.OPERATOR_NOT_INSTALLED
    assert "KubeDL" in (caught.value.hint or "")
    assert await jobs_in(operator) == []


def test_a_job_suspended_outside_kueue_waits_for_whoever_resumes_it() -> None:
    from kubedl_prefect.lifecycle.admission import AdmissionBlocker
    from kubedl_prefect.lifecycle.kubernetes.blockers import find_blocker

    train_job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "mnist", "namespace": "ml"},
        "spec": {"suspend": True, "trainer": {"numNodes": 2}},
    }
    blocker = find_blocker(train_job, pods=[], now=0.0)
    assert blocker.category is AdmissionBlocker.WAITING
    assert not blocker.permanent
    assert blocker.message == (
        "TrainJob ml/mnist is suspended (spec.suspend: true): nothing runs until it is resumed"
    )
    assert "spec.suspend to false" in blocker.hint
    resumed = {**train_job, "spec": {"suspend": False, "trainer": {"numNodes": 2}}}
    assert "suspended" not in find_blocker(resumed, pods=[], now=0.0).message
