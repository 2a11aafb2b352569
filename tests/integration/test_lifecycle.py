"""The lifecycle against the real test bed: real API server, operators, Volcano and kwok pods.

Every test runs as the least-privilege ServiceAccount of deploy/rbac.yaml in a fresh namespace.
Pod behaviour is driven by the test bed's kwok stages through pod annotations.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import (
    AdmissionTimeoutError,
    AdoptionRefusedError,
    InvalidObjectError,
    JobFailedError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PODS, VOLCANO_PODGROUPS, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import session_pool
from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.backend import (
    JobRef,
    LogLine,
    PhaseUpdate,
    SyncTrainingBackend,
    checkpoint_location,
)
from kubedl_prefect.lifecycle.diagnosis import FailureCategory
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.retry import RetryPolicy, arun_to_completion
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import CHECKPOINT_ENV, TrainingJobSpec, dump_spec, job_name, loads_spec
from kubedl_prefect.testbed.testbed import Testbed

pytestmark = pytest.mark.integration

STAGE = "testbed.kubedl-prefect.io"
RBAC = Path(__file__).parents[2] / "deploy" / "rbac.yaml"


def pytorch_spec(
    name: str = "mnist",
    *,
    workers: int = 2,
    gpus: int = 1,
    worker_annotations: dict[str, str] | None = None,
    image: str = "registry.example/mnist:1.0",
    gang: bool = True,
    worker_restart_policy: str = "OnFailure",
    run_duration: str = "2s",
    extra: str = "",
) -> TrainingJobSpec:
    template = f"    restartPolicy: {worker_restart_policy}\n"
    if worker_annotations:
        template += "    podTemplate:\n      metadata:\n        annotations:\n" + "".join(
            f"          {k}: {v!r}\n" for k, v in worker_annotations.items()
        )
    return loads_spec(
        f"""
name: {name}
framework: pytorch
image: {image}
command: [python, train.py]
resources: {{gpus: {gpus}}}
annotations: {{"{STAGE}/run-duration": "{run_duration}"}}
checkpoint: {{location: "s3://checkpoints/team"}}
{"gang: {scheduler: volcano}" if gang else ""}
replicas:
  master: 1
  worker:
    count: {workers}
{template}{extra}
"""
    )


@pytest.fixture
def least_privilege_kubeconfig(
    namespace: str, service_account_kubeconfig: Callable[..., Path]
) -> Path:
    """A kubeconfig of the ServiceAccount bound to the Role in deploy/rbac.yaml."""
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    role = next(d for d in documents if d["kind"] == "Role")
    return service_account_kubeconfig(namespace, role["rules"])


@pytest.fixture
async def backend(namespace: str, least_privilege_kubeconfig: Path) -> Any:
    made = KubernetesBackend(
        namespace=namespace, dialect="kubedl", kubeconfig=str(least_privilege_kubeconfig)
    )
    yield made
    await made.close()


async def list_objects(backend: KubernetesBackend, kind: ResourceKind) -> list[dict[str, Any]]:
    """The objects of ``kind`` in the backend's namespace, read with the backend's own client."""

    async def call() -> list[dict[str, Any]]:
        client = await backend.client()
        return (await client.list(kind, backend.namespace)).items

    return await KubeRuntime.get().run(call())


async def test_kubedl_job_runs_to_success_through_every_phase(backend: KubernetesBackend) -> None:
    spec = pytorch_spec()
    seen: list[PhaseUpdate] = []
    ref = await backend.submit(spec, key="success", attempt=1)
    outcome = await backend.wait_completed(ref, on_phase=seen.append)
    assert outcome.succeeded, outcome
    phases = [u.phase for u in seen]
    assert phases[-1] is Phase.SUCCEEDED
    assert Phase.RUNNING in phases
    assert phases.index(Phase.RUNNING) < phases.index(Phase.SUCCEEDED)
    assert all(a.observed_at <= b.observed_at for a, b in itertools.pairwise(seen))
    assert outcome.diagnosis is None


async def test_resubmitting_the_same_key_adopts_instead_of_duplicating(
    backend: KubernetesBackend, namespace: str
) -> None:
    spec = pytorch_spec(worker_annotations={f"{STAGE}/run-duration": "30s"})
    first = await backend.submit(spec, key="adopt", attempt=1)
    again = await backend.submit(spec, key="adopt", attempt=1)
    assert again.uid == first.uid
    assert again.name == first.name

    listing = await list_objects(
        backend, ResourceKind.of({"apiVersion": first.api_version, "kind": first.kind})
    )
    assert [j["metadata"]["name"] for j in listing] == [first.name]

    changed = pytorch_spec(workers=1, worker_annotations={f"{STAGE}/run-duration": "30s"})
    with pytest.raises(AdoptionRefusedError, match="another spec"):
        await backend.submit(changed, key="adopt", attempt=1)
    await backend.cancel(first)


async def test_too_many_gpus_times_out_with_the_reason_and_deletes_the_job(
    backend: KubernetesBackend,
) -> None:
    spec = pytorch_spec(gpus=16)  # 3 replicas x 16 GPUs; the test bed has 2 nodes x 8
    ref = await backend.submit(spec, key="too-big", attempt=1)
    with pytest.raises(AdmissionTimeoutError) as caught:
        await backend.wait_admitted(ref, timeout_s=20)
    assert "nvidia.com/gpu" in (caught.value.last_reason or "")
    assert caught.value.timeout_s == 20
    remaining = await list_objects(backend, PODS)
    assert [p for p in remaining if p["metadata"]["name"].startswith(ref.name)] == []
    podgroups = await list_objects(backend, VOLCANO_PODGROUPS)
    assert podgroups == []


async def test_admission_reason_is_classified(backend: KubernetesBackend) -> None:
    ref = await backend.submit(pytorch_spec(gpus=16), key="classified", attempt=1)
    updates: list[PhaseUpdate] = []
    with pytest.raises(AdmissionTimeoutError):
        await backend.wait_admitted(ref, timeout_s=15, on_phase=updates.append)
    reasons = [u.admission for u in updates if u.admission is not None]
    assert {u.phase for u in updates} == {Phase.QUEUING}
    assert reasons[-1].blocker is AdmissionBlocker.INSUFFICIENT_GPU, reasons


async def test_image_pull_error_fails_at_once_with_that_reason(backend: KubernetesBackend) -> None:
    spec = pytorch_spec(worker_annotations={f"{STAGE}/waiting-reason": "ErrImagePull"})
    ref = await backend.submit(spec, key="bad-image", attempt=1)
    outcome = await asyncio.wait_for(backend.wait_completed(ref), timeout=60)
    assert not outcome.succeeded
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category is FailureCategory.IMAGE_PULL
    assert not outcome.diagnosis.retryable
    assert outcome.diagnosis.replica is not None
    assert outcome.diagnosis.replica.startswith("worker-")


async def test_cancel_leaves_no_pod_or_podgroup_and_is_idempotent(
    backend: KubernetesBackend,
) -> None:
    spec = pytorch_spec(worker_annotations={f"{STAGE}/run-duration": "300s"})
    ref = await backend.submit(spec, key="cancel", attempt=1)
    await backend.wait_admitted(ref, timeout_s=60)
    await backend.cancel(ref, timeout_s=60)
    assert await list_objects(backend, PODS) == []
    assert await list_objects(backend, VOLCANO_PODGROUPS) == []
    await backend.cancel(ref, timeout_s=10)  # again: nothing to do, no error


async def test_evicted_worker_resumes_as_next_attempt_with_same_checkpoint(
    backend: KubernetesBackend,
) -> None:
    spec = pytorch_spec(
        worker_annotations={f"{STAGE}/evict-on-attempt": "1"},
        worker_restart_policy="Never",
    )
    attempts: list[Any] = []
    outcome = await arun_to_completion(
        backend,
        spec,
        key="evicted",
        retry=RetryPolicy(max_attempts=3, backoff_s=0.5),
        on_attempt=attempts.append,
    )
    assert outcome.succeeded
    assert [r.attempt for r in attempts] == [1, 2]
    manifests = [backend.manifest(spec, key="evicted", attempt=n) for n in (1, 2)]
    locations = {_env(m, CHECKPOINT_ENV) for m in manifests}
    assert locations == {checkpoint_location(spec, "evicted")}
    assert checkpoint_location(spec, "evicted") != checkpoint_location(spec, "other-key")


async def test_user_code_failure_is_not_retried(backend: KubernetesBackend) -> None:
    spec = pytorch_spec(
        worker_annotations={f"{STAGE}/exit-code": "1", f"{STAGE}/fail-reason": "Error"},
        worker_restart_policy="Never",
    )
    attempts: list[Any] = []
    with pytest.raises(JobFailedError) as caught:
        await arun_to_completion(
            backend,
            spec,
            key="user-bug",
            retry=RetryPolicy(backoff_s=0.5),
            on_attempt=attempts.append,
        )
    assert caught.value.attempts == 1
    assert len(attempts) == 1
    assert "UserCodeError" in str(caught.value)


def test_sync_facade_runs_the_same_lifecycle(
    namespace: str, least_privilege_kubeconfig: Path
) -> None:
    backend = SyncTrainingBackend(
        KubernetesBackend(namespace=namespace, kubeconfig=str(least_privilege_kubeconfig))
    )
    try:
        ref = backend.submit(pytorch_spec(), key="sync")
        outcome = backend.wait_completed(ref)
        assert outcome.succeeded
    finally:
        backend.close()


def _env(manifest: dict[str, Any], name: str) -> str:
    for role in manifest["spec"]["pytorchReplicaSpecs"].values():
        for container in role["template"]["spec"]["containers"]:
            for entry in container.get("env", []):
                if entry["name"] == name:
                    return str(entry["value"])
    raise AssertionError(f"{name} not set")


async def test_kubeflow_job_is_admitted_through_its_podgroup_and_succeeds(
    namespace: str, least_privilege_kubeconfig: Path
) -> None:
    backend = KubernetesBackend(
        namespace=namespace, dialect="kubeflow", kubeconfig=str(least_privilege_kubeconfig)
    )
    try:
        seen: list[PhaseUpdate] = []
        ref = await backend.submit(pytorch_spec(), key="kubeflow", attempt=1)
        assert ref.api_version == "kubeflow.org/v1"
        outcome = await backend.wait_completed(ref, on_phase=seen.append)
        assert outcome.succeeded
        assert [u.phase for u in seen][-1] is Phase.SUCCEEDED
        assert Phase.ADMITTED in [u.phase for u in seen] or Phase.RUNNING in [u.phase for u in seen]
    finally:
        await backend.close()


async def test_kubeflow_job_too_big_reports_the_podgroup_reason(
    namespace: str, least_privilege_kubeconfig: Path
) -> None:
    backend = KubernetesBackend(
        namespace=namespace, dialect="kubeflow", kubeconfig=str(least_privilege_kubeconfig)
    )
    try:
        ref = await backend.submit(pytorch_spec(gpus=16), key="kubeflow-big", attempt=1)
        with pytest.raises(AdmissionTimeoutError) as caught:
            await backend.wait_admitted(ref, timeout_s=20)
        assert caught.value.last_reason
    finally:
        await backend.close()


async def test_active_deadline_fails_the_job_with_that_cause(backend: KubernetesBackend) -> None:
    # KubeDL v0.5.0 logs JobFailed at the deadline but never writes the condition (see
    # docs/operators.md); the wait fails and deletes such a job once the grace has passed.
    spec = pytorch_spec(run_duration="120s", extra="activeDeadlineSeconds: 3\n")
    ref = await backend.submit(spec, key="deadline", attempt=1)
    outcome = await asyncio.wait_for(backend.wait_completed(ref), timeout=90)
    assert outcome.status.phase is Phase.FAILED
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category is FailureCategory.DEADLINE_EXCEEDED
    assert not outcome.diagnosis.retryable
    assert await list_objects(backend, PODS) == []


async def test_dry_run_creates_nothing_and_strict_validation_refuses_unknown_fields(
    backend: KubernetesBackend,
) -> None:
    kind = ResourceKind.of(backend.manifest(pytorch_spec(), key="dry", attempt=1))
    ref = await backend.submit(pytorch_spec(), key="dry", attempt=1, dry_run=True)
    assert ref.name.startswith("mnist-")
    assert await list_objects(backend, kind) == []

    bad = pytorch_spec(extra="podTemplate: {spec: {notAPodField: 1}}\n")
    with pytest.raises(InvalidObjectError, match="notAPodField"):
        await backend.submit(bad, key="dry", attempt=1)


@pytest.mark.exclusive  # counts the API server's open watches: other tests' too
async def test_fifty_jobs_are_followed_through_one_watch_connection(
    backend: KubernetesBackend, namespace: str, admin_kubeconfig: Path
) -> None:
    spec = pytorch_spec(workers=1, gpus=0, gang=False)
    refs = await asyncio.gather(*(backend.submit(spec, key=f"many-{i}") for i in range(50)))
    waits = asyncio.gather(*(backend.wait_completed(ref) for ref in refs))

    async def watches_of_pytorchjobs_in_namespaces() -> int:
        admin = await KubeClient.from_kubeconfig(str(admin_kubeconfig))
        try:
            metrics = await admin.get_text("/metrics")
        finally:
            await admin.close()
        total = 0
        for line in metrics.splitlines():
            if (
                line.startswith("apiserver_longrunning_requests{")
                and 'resource="pytorchjobs"' in line
                and 'scope="namespace"' in line
                and 'verb="WATCH"' in line
            ):
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    await asyncio.sleep(1.0)  # all 50 waiters subscribed
    open_watches = await KubeRuntime.get().run(watches_of_pytorchjobs_in_namespaces())
    outcomes = await waits
    assert all(o.succeeded for o in outcomes)
    assert open_watches == 1

    async def informer_watches() -> list[int]:
        return [
            informer.stats.lists
            for informer in session_pool().informers()
            if informer.namespace == namespace and informer.kind.plural == "pytorchjobs"
        ]

    assert await KubeRuntime.get().run(informer_watches()) == [1]


def test_restarted_waiter_adopts_its_job_instead_of_creating_another(
    namespace: str, least_privilege_kubeconfig: Path, tmp_path: Path
) -> None:
    script = tmp_path / "waiter.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from kubedl_prefect.lifecycle.backend import SyncTrainingBackend
            from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
            from kubedl_prefect.spec import load_spec

            backend = SyncTrainingBackend(KubernetesBackend(
                namespace={namespace!r}, kubeconfig={str(least_privilege_kubeconfig)!r}))
            ref = backend.submit(load_spec(sys.argv[1]), key="crash-safe")
            print("uid", ref.uid, flush=True)
            outcome = backend.wait_completed(ref)
            print("phase", outcome.status.phase, flush=True)
            """
        )
    )
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        dump_spec(pytorch_spec(worker_annotations={f"{STAGE}/run-duration": "8s"}))
    )
    command = [sys.executable, str(script), str(spec_file)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as first:
        assert first.stdout is not None
        uid_line = first.stdout.readline().split()
        first.kill()  # the flow crashes while waiting
    second = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    lines = dict(line.split(" ", 1) for line in second.stdout.splitlines())
    assert uid_line[0] == "uid"
    assert lines["uid"] == uid_line[1]
    assert lines["phase"] == "Succeeded"


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.exclusive  # stops or restarts a shared component
async def test_logs_of_every_replica_arrive_labelled_once_across_a_broken_stream(
    backend: KubernetesBackend, namespace: str, testbed: Testbed
) -> None:
    spec = pytorch_spec(gpus=0, gang=False, run_duration="25s")
    name = job_name(spec.name, "logs", 1)
    replicas = ["master-0", "worker-0", "worker-1"]
    logs = {r: testbed.pod_log(namespace, f"{name}-{r}", "pytorch") for r in replicas}
    for replica, log in logs.items():
        log.write(f"{replica} line 0")

    lines: list[LogLine] = []
    first_lines = asyncio.Event()
    loop = asyncio.get_running_loop()

    def collect(line: LogLine) -> None:  # called on a delivery thread of its own
        lines.append(line)
        if {seen.replica for seen in lines} == set(replicas):
            loop.call_soon_threadsafe(first_lines.set)

    ref = await backend.submit(spec, key="logs", attempt=1)
    following = asyncio.ensure_future(backend.follow_logs(ref, collect))
    await asyncio.wait_for(first_lines.wait(), 60)
    for i in range(1, 6):
        for replica, log in logs.items():
            log.write(f"{replica} line {i}")
    await asyncio.sleep(1)
    await asyncio.to_thread(testbed.restart, "kwok")  # every open log stream breaks
    for i in range(6, 11):
        for replica, log in logs.items():
            log.write(f"{replica} line {i}")

    outcome = await asyncio.wait_for(backend.wait_completed(ref), 120)
    assert outcome.succeeded
    await asyncio.wait_for(following, 60)
    for replica in replicas:
        texts = [line.text for line in lines if line.replica == replica]
        assert texts == [f"{replica} line {i}" for i in range(11)], replica
    assert {line.container for line in lines} == {"pytorch"}
    assert {line.attempt for line in lines} == {1}


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.exclusive  # stops or restarts a shared component
async def test_every_terminal_state_is_reported_once_across_an_apiserver_restart(
    backend: KubernetesBackend, testbed: Testbed
) -> None:
    spec = pytorch_spec(workers=1, gpus=0, gang=False, run_duration="15s")
    refs = [await backend.submit(spec, key=f"restart-{i}") for i in range(5)]
    updates: dict[str, list[PhaseUpdate]] = {ref.name: [] for ref in refs}
    waits = asyncio.gather(
        *(backend.wait_completed(ref, on_phase=updates[ref.name].append) for ref in refs)
    )
    await asyncio.sleep(3)
    downtime = await asyncio.to_thread(testbed.restart, "kube-apiserver")
    outcomes = await asyncio.wait_for(waits, 180)
    assert downtime > 0
    assert all(outcome.succeeded for outcome in outcomes)
    for name, seen in updates.items():
        assert [u.phase for u in seen].count(Phase.SUCCEEDED) == 1, name


def test_a_reference_saved_in_one_process_is_attached_and_followed_in_another(
    namespace: str, least_privilege_kubeconfig: Path, tmp_path: Path
) -> None:
    submit = tmp_path / "submit.py"
    submit.write_text(
        textwrap.dedent(
            f"""
            import sys
            from kubedl_prefect import KubernetesBackend, SyncTrainingBackend, load_spec

            backend = SyncTrainingBackend(KubernetesBackend(
                namespace={namespace!r}, kubeconfig={str(least_privilege_kubeconfig)!r}))
            print(backend.submit(load_spec(sys.argv[1]), key="hand-over").to_json())
            """
        )
    )
    follow = tmp_path / "follow.py"
    follow.write_text(
        textwrap.dedent(
            f"""
            import asyncio, sys
            from kubedl_prefect import KubeconfigFile, KubernetesBackend, areattach

            async def main() -> None:
                # Another default namespace and dialect: the reference says where the job is.
                backend = KubernetesBackend(namespace="default", dialect="kubeflow",
                    credentials=KubeconfigFile({str(least_privilege_kubeconfig)!r}))
                run = await areattach(sys.argv[1], backend=backend)
                outcome = await run.wait_completed()
                print(outcome.status.phase, outcome.ref.uid, outcome.ref.namespace)
                await backend.close()

            asyncio.run(main())
            """
        )
    )
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(dump_spec(pytorch_spec(run_duration="4s")))
    submitted = subprocess.run(
        [sys.executable, str(submit), str(spec_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    ref = JobRef.from_json(submitted.stdout.strip())
    followed = subprocess.run(
        [sys.executable, str(follow), ref.to_json()],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    assert followed.stdout.split() == ["Succeeded", ref.uid, namespace]
    assert ref.cluster.startswith("https://127.0.0.1:")


async def test_a_finished_logical_job_deleted_by_ttl_is_not_trained_again(
    backend: KubernetesBackend,
) -> None:
    spec = pytorch_spec(gpus=0, gang=False, extra="ttlSecondsAfterFinished: 1\n")
    first = await arun_to_completion(backend, spec, key="ttl", retry=RetryPolicy(backoff_s=0.5))
    assert first.succeeded
    assert not first.replayed
    kind = ResourceKind.of(backend.manifest(spec, key="ttl", attempt=1))

    async def deleted_by_the_operator() -> None:
        for _ in range(300):  # checked every 0.2 s: the operator's TTL clean-up is not watched
            if not await list_objects(backend, kind):
                return
            await asyncio.sleep(0.2)
        raise AssertionError("the operator did not delete the job after its TTL")

    await deleted_by_the_operator()
    again = await arun_to_completion(backend, spec, key="ttl", retry=RetryPolicy(backoff_s=0.5))
    assert again.replayed
    assert again.succeeded
    assert again.ref.uid == first.ref.uid
    assert await list_objects(backend, kind) == []  # nothing was submitted again


async def test_two_backends_share_the_watches_and_closing_one_keeps_the_other_waiting(
    namespace: str, least_privilege_kubeconfig: Path
) -> None:
    first, second = (
        KubernetesBackend(namespace=namespace, kubeconfig=str(least_privilege_kubeconfig))
        for _ in range(2)
    )
    spec = pytorch_spec(gpus=0, gang=False, run_duration="6s")
    ref_a = await first.submit(spec, key="share-a")
    ref_b = await second.submit(spec, key="share-b")
    wait_b = asyncio.ensure_future(second.wait_completed(ref_b))
    assert (await first.wait_completed(ref_a)).succeeded

    async def watched() -> list[tuple[str, str | None]]:
        return [
            (i.kind.plural, i.namespace)
            for i in session_pool().informers()
            if i.namespace == namespace
        ]

    kinds = await KubeRuntime.get().run(watched())
    assert len(kinds) == len(set(kinds))
    assert ("pytorchjobs", namespace) in kinds
    assert (await first.session()) is (await second.session())
    await first.close()
    assert (await asyncio.wait_for(wait_b, 120)).succeeded
    await second.close()
