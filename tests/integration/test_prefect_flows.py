"""The Prefect surface against a real Prefect server and the real test bed.

The session's Prefect test server (``prefect_server`` of tests/support, ``PREFECT_HOME`` in a
temporary directory); every test gets a fresh namespace and runs as the least-privilege
ServiceAccount of deploy/rbac.yaml. What a flow run leaves behind — events, artifacts, log
lines, states — is read back through the Prefect API, never from in-process state. Pods are
driven by the test bed's kwok stages (annotations) and print what ``pod_log`` writes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter
from prefect.transactions import transaction
from pydantic import SecretStr

from kubedl_prefect.kube.resources import PODS, VOLCANO_PODGROUPS, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.prefect import (
    CLEANUP_HOOKS,
    KubernetesCluster,
    RetrySettings,
    TrainingJob,
    TrainingResult,
    aflush_artifacts,
    arun_training_job,
    run_training_job,
)
from kubedl_prefect.spec import TrainingJobSpec, job_name, job_resource, loads_spec
from kubedl_prefect.testbed.podlogs import PodLog
from tests.support.prefect_reads import (
    cancel_flow_run,
    logs_of,
    read_flow_run,
    run_deployment,
    wait_for_final_state,
    wait_for_logs,
)

pytestmark = [
    pytest.mark.integration,
    # Prefect 3.9.1 leaks one HTTP connection per async flow run: results.py
    # _read_server_default_result_storage_block_id() never closes the sync client it makes.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
        "ignore:unclosed <socket.socket:ResourceWarning",
    ),
]

STAGE = "testbed.kubedl-prefect.io"
ROOT = Path(__file__).parents[2]
RBAC = ROOT / "deploy" / "rbac.yaml"


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def collect_prefects_leaked_connections() -> Iterator[None]:
    """Collect the connections Prefect leaks (see ``pytestmark``) while this test's filter holds.

    Left to the garbage collector, they would be reported in whichever test runs next.
    """
    yield
    gc.collect()


@pytest.fixture
def kubeconfig(namespace: str, service_account_kubeconfig: Callable[..., Path]) -> Path:
    """A kubeconfig of the ServiceAccount bound to the Role in deploy/rbac.yaml."""
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    role = next(d for d in documents if d["kind"] == "Role")
    return service_account_kubeconfig(namespace, role["rules"])


@pytest.fixture
def cluster(kubeconfig: Path, namespace: str) -> KubernetesCluster:
    return KubernetesCluster(kubeconfig_path=str(kubeconfig), namespace=namespace)


def spec(
    name: str = "mnist",
    *,
    run_duration: str = "4s",
    workers: int = 2,
    worker_annotations: dict[str, str] | None = None,
    worker_restart_policy: str = "OnFailure",
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
image: registry.example/mnist:1.0
command: [python, train.py]
resources: {{gpus: 1}}
annotations: {{"{STAGE}/run-duration": "{run_duration}"}}
checkpoint: {{location: "s3://checkpoints/team"}}
gang: {{scheduler: volcano}}
replicas:
  master: 1
  worker:
    count: {workers}
{template}"""
    )


def cluster_objects(namespace: str, kind: ResourceKind, kubeconfig: Path) -> list[dict[str, Any]]:
    """The objects of ``kind`` in ``namespace``, read from the cluster."""
    backend = KubernetesBackend(namespace=namespace, kubeconfig=str(kubeconfig))

    async def call() -> list[dict[str, Any]]:
        try:
            client = await backend._get_client()
            return (await client.list(kind, namespace)).items
        finally:
            await backend.close()

    return KubeRuntime.get().block_on(call())


def job_kind_of(dialect: str) -> ResourceKind:
    resource = job_resource(dialect, "pytorch")
    return ResourceKind.of({"apiVersion": resource.api_version, "kind": resource.kind})


async def events_of(flow_run_id: UUID, *, want: set[str], timeout_s: float = 30) -> list[Any]:
    """The kubedl.training-job.* events related to the flow run (waits for ``want``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with get_client() as client:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(prefix=["kubedl.training-job."]),
                    related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
                ),
                limit=50,
            )
        names = {e.event for e in page.events}
        if want <= names or time.monotonic() > deadline:
            return list(page.events)
        await asyncio.sleep(1.0)


# -- a flow run per dialect -----------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["kubedl", "kubeflow"])
async def test_a_flow_run_trains_and_leaves_events_artifacts_and_labelled_logs(
    prefect_server: dict[str, str],
    cluster: KubernetesCluster,
    namespace: str,
    dialect: str,
    pod_log: Callable[..., PodLog],
) -> None:
    job = TrainingJob(spec=spec(run_duration="6s"), cluster=cluster, dialect=dialect)
    key = f"every-replica-{dialect}"
    name = job_name("mnist", key, 1)
    replicas = ["master-0", "worker-0", "worker-1"]
    for replica in replicas:
        pod_log(namespace, f"{name}-{replica}", "pytorch").write(
            f"hello from {replica}", f"{replica} loading data"
        )
    pod_log(namespace, f"{name}-master-0", "pytorch").write(
        *(json.dumps({"step": step, "total": 100, "loss": 1 / step}) for step in (10, 50, 100))
    )

    if dialect == "kubedl":

        @flow(**CLEANUP_HOOKS)
        def train_sync() -> TrainingResult:
            return run_training_job(job, key=key)

        state = await asyncio.to_thread(train_sync, return_state=True)
    else:

        @flow(**CLEANUP_HOOKS)
        async def train_async() -> TrainingResult:
            return await arun_training_job(job, key=key)

        state = await train_async(return_state=True)

    assert state.is_completed(), state.message
    result = await state.result()
    assert isinstance(result, TrainingResult)
    assert result.phase == "Succeeded"
    assert result.ref["dialect"] == dialect
    assert [a.phase for a in result.attempts] == ["Succeeded"]
    assert result.checkpoint is not None
    assert result.checkpoint.startswith("s3://checkpoints/team/mnist-")
    flow_run_id = state.state_details.flow_run_id
    assert flow_run_id is not None

    events = await events_of(
        flow_run_id,
        want={
            "kubedl.training-job.created",
            "kubedl.training-job.admitted",
            "kubedl.training-job.running",
            "kubedl.training-job.succeeded",
        },
    )
    by_name = {e.event: e for e in events}
    assert {
        "kubedl.training-job.created",
        "kubedl.training-job.admitted",
        "kubedl.training-job.running",
        "kubedl.training-job.succeeded",
    } <= set(by_name), sorted(by_name)
    succeeded = by_name["kubedl.training-job.succeeded"]
    assert succeeded.resource.id == f"kubedl.training-job.{result.ref['uid']}"
    assert succeeded.resource["kubedl.namespace"] == namespace
    assert succeeded.resource["kubedl.name"] == name
    assert succeeded.resource["kubedl.attempt"] == "1"
    assert succeeded.payload["phase"] == "Succeeded"
    assert set(succeeded.payload["replicas"]) == {"master", "worker"}
    roles = {r.role for r in succeeded.related}
    assert {"flow-run", "task-run"} <= roles

    # The last artifacts (the summary, the bar at 100%) are sent in the background once the
    # task returned: flushed before they are read, as a script would.
    assert await aflush_artifacts(timeout_s=60)
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    by_type = {a.type: a for a in artifacts}
    assert {"table", "progress", "markdown"} <= set(by_type), [a.type for a in artifacts]
    # Two tables: the replicas, and the latest metrics beside the progress bar.
    by_key = {str(a.key).rsplit("-", 1)[-1]: a for a in artifacts if a.key}
    assert {"replicas", "metrics", "progress", "summary"} <= set(by_key), sorted(by_key)
    metrics = json.loads(str(by_key["metrics"].data))
    assert metrics[-1]["loss"] == 1 / 100, metrics
    table = json.loads(str(by_key["replicas"].data))
    assert sorted(f"{row['role']}-{row['index']}" for row in table) == replicas
    assert all(row["node"].startswith("kwok-node-") for row in table)
    assert {"role", "index", "pod", "node", "phase", "restarts"} == set(table[0])
    assert by_type["progress"].data == 100.0
    summary = str(by_type["markdown"].data)
    assert "Succeeded" in summary
    assert "admission wait" in summary
    assert result.checkpoint in summary
    assert f"kubectl logs -n {namespace}" in summary

    messages = await wait_for_logs(flow_run_id, [f"{r} | hello from {r}" for r in replicas])
    for replica in replicas:
        assert f"{replica} | hello from {replica}" in messages, messages
        assert f"{replica} | {replica} loading data" in messages


# -- failures, retries and keys -------------------------------------------------------------


async def test_a_permanent_failure_fails_the_task_once_with_the_diagnosis(
    prefect_server: dict[str, str], cluster: KubernetesCluster, namespace: str, kubeconfig: Path
) -> None:
    failing = spec(
        worker_annotations={f"{STAGE}/exit-code": "1", f"{STAGE}/fail-reason": "Error"},
        worker_restart_policy="Never",
        run_duration="1s",
    )
    job = TrainingJob(spec=failing, cluster=cluster)

    @flow
    async def train() -> TrainingResult:
        return await arun_training_job(job, key="doomed")

    state = await train(return_state=True)
    assert state.is_failed()
    async with get_client() as client:
        task_runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
            )
        )
    assert len(task_runs) == 1
    run = task_runs[0]
    assert run.run_count == 1  # the Prefect task was not retried
    assert run.state is not None
    assert run.state.is_failed()
    assert "UserCodeError" in (run.state.message or ""), run.state.message
    assert "not retryable" in (run.state.message or "")
    jobs = cluster_objects(namespace, job_kind_of("kubedl"), kubeconfig)
    assert [j["metadata"]["name"] for j in jobs] == [job_name("mnist", "doomed", 1)]


async def test_allowed_attempts_bound_the_jobs_across_prefect_retries_and_reruns(
    prefect_server: dict[str, str], cluster: KubernetesCluster, namespace: str, kubeconfig: Path
) -> None:
    # Every attempt is evicted (retryable); two attempts are allowed.
    evicted = spec(worker_annotations={f"{STAGE}/evict": "true"}, run_duration="2s", workers=1)
    job = TrainingJob(
        spec=evicted, cluster=cluster, retry=RetrySettings(max_attempts=2, backoff_s=0)
    )

    @flow
    def train() -> TrainingResult:
        return run_training_job.with_options(retries=3, retry_delay_seconds=0)(job, key="evicted")

    first = await asyncio.to_thread(train, return_state=True)
    again = await asyncio.to_thread(train, return_state=True)  # a re-run with the same key
    assert first.is_failed()
    assert again.is_failed()
    assert "after 2 attempts" in (first.message or ""), first.message
    assert "recorded by an earlier run" in (again.message or ""), again.message
    names = sorted(
        j["metadata"]["name"] for j in cluster_objects(namespace, job_kind_of("kubedl"), kubeconfig)
    )
    assert names == [job_name("mnist", "evicted", 1), job_name("mnist", "evicted", 2)]
    jobs = cluster_objects(namespace, job_kind_of("kubedl"), kubeconfig)
    checkpoints = {
        env["value"]
        for j in jobs
        for spec_ in j["spec"]["pytorchReplicaSpecs"].values()
        for container in spec_["template"]["spec"]["containers"]
        for env in container.get("env") or []
        if env["name"] == "KUBEDL_PREFECT_CHECKPOINT_DIR"
    }
    assert len(checkpoints) == 1


def test_a_flow_killed_mid_training_is_adopted_when_run_again_with_the_same_key(
    prefect_server: dict[str, str], kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json
            from prefect import flow
            from kubedl_prefect.prefect import KubernetesCluster, TrainingJob, run_training_job
            from kubedl_prefect.spec import loads_spec

            job = TrainingJob(
                spec=loads_spec({json.dumps(spec_yaml(run_duration="12s"))}),
                cluster=KubernetesCluster(kubeconfig_path={str(kubeconfig)!r},
                                          namespace={namespace!r}),
            )

            @flow
            def train():
                return run_training_job(job, key="crash-safe")

            print("RESULT", json.dumps(train().ref), flush=True)
            """
        )
    )
    kind = job_kind_of("kubedl")
    command = [sys.executable, str(script)]
    with subprocess.Popen(
        command, env=prefect_server, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as first:
        deadline = time.monotonic() + 120
        jobs: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not jobs:
            time.sleep(0.5)
            jobs = cluster_objects(namespace, kind, kubeconfig)
        assert jobs, "the first flow run never submitted its job"
        time.sleep(1.0)  # mid-training
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    uid = jobs[0]["metadata"]["uid"]

    second = subprocess.run(
        command, env=prefect_server, capture_output=True, text=True, timeout=240, check=False
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    line = next(line for line in second.stdout.splitlines() if line.startswith("RESULT "))
    ref = json.loads(line.removeprefix("RESULT "))
    assert ref["uid"] == uid
    assert [j["metadata"]["uid"] for j in cluster_objects(namespace, kind, kubeconfig)] == [uid]


@pytest.mark.long  # a real flow process and pods: 67 s on a loaded machine
def test_a_flow_process_that_exits_at_once_leaves_the_end_recorded_and_the_summary_written(
    prefect_server: dict[str, str], kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    """What the task no longer waits for — the job's end record, its last artifacts — is sent
    before the process exits, even when it exits as soon as the flow returned."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from prefect import flow
            from kubedl_prefect.prefect import KubernetesCluster, TrainingJob, run_training_job
            from kubedl_prefect.spec import loads_spec

            job = TrainingJob(
                spec=loads_spec({json.dumps(spec_yaml(run_duration="2s", workers=1))}),
                cluster=KubernetesCluster(kubeconfig_path={str(kubeconfig)!r},
                                          namespace={namespace!r}),
            )

            @flow
            def train():
                return run_training_job(job, key="exits-at-once")

            state = train(return_state=True)
            print("FLOW_RUN", state.state_details.flow_run_id, state.type.value, flush=True)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        env=prefect_server,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("FLOW_RUN "))
    _, flow_run_id, state = line.split()
    assert state == "COMPLETED", done.stderr[-3000:]

    backend = KubernetesBackend(namespace=namespace, kubeconfig=str(kubeconfig))

    async def history() -> Any:
        try:
            return await backend.history(spec(run_duration="2s", workers=1), key="exits-at-once")
        finally:
            await backend.close()

    record = KubeRuntime.get().block_on(history())
    assert record is not None
    latest = record.latest
    assert latest is not None
    assert (latest.attempt, latest.phase) == (1, "Succeeded")

    with_summary = []
    for artifact in asyncio.run(artifacts_of(UUID(flow_run_id))):
        if str(artifact.key).endswith("-summary"):
            with_summary.append(str(artifact.data))
    assert len(with_summary) == 1, done.stderr[-3000:]
    assert "# Training job `mnist`: Succeeded" in with_summary[0]


async def artifacts_of(flow_run_id: UUID) -> list[Any]:
    async with get_client() as client:
        return list(
            await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )
        )


def spec_yaml(**kwargs: Any) -> str:
    from kubedl_prefect.spec import dump_spec

    return dump_spec(spec(**kwargs))


# -- clean-up -------------------------------------------------------------------------------


def test_cancelling_a_deployment_flow_run_deletes_its_jobs_and_no_other(
    prefect_server: dict[str, str],
    cluster: KubernetesCluster,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    cluster_name = f"cancel-{namespace}"[:60]
    cluster.save(cluster_name, overwrite=True)
    # Someone else's job in the same namespace: it must survive the clean-up.
    other = TrainingJob(spec=spec("other", run_duration="300s"), cluster=cluster)
    other_run = other.start(key="someone-else")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec_yaml(run_duration="300s"))
    runner_log = (tmp_path / "runner.log").open("w")
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flows.training import train; train.serve(name='cancel-test')",
        ],
        cwd=ROOT,
        env=prefect_server,
        stdout=runner_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        flow_run = run_deployment(
            "train/cancel-test",
            {"spec": str(spec_file), "cluster": cluster_name, "key": "cancel-me"},
        )
        kind = job_kind_of("kubedl")
        ours = job_name("mnist", "cancel-me", 1)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = cluster_objects(namespace, PODS, kubeconfig)
            if sum(p["metadata"]["name"].startswith(ours) for p in pods) == 3:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the deployment's flow run never started its job's pods")

        asyncio.run(cancel_flow_run(flow_run))
        cancelled_at = time.monotonic()
        while time.monotonic() - cancelled_at < 30:
            left = [
                o["metadata"]["name"]
                for k in (kind, PODS, VOLCANO_PODGROUPS)
                for o in cluster_objects(namespace, k, kubeconfig)
                if o["metadata"]["name"].startswith(ours)
                or (o.get("metadata", {}).get("labels") or {}).get("kubedl.io/gang-job-name")
                == ours
            ]
            if not left:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"still there 30 s after the cancellation: {left}")
        remaining = [j["metadata"]["name"] for j in cluster_objects(namespace, kind, kubeconfig)]
        assert remaining == [other_run.ref.name]
        state = asyncio.run(read_flow_run(flow_run)).state
        assert state is not None
        assert state.is_cancelled() or state.is_cancelling()
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(timeout=30)
        runner_log.close()
        print((tmp_path / "runner.log").read_text()[-5000:])
        other_run.cancel()
        other_run.close()


def test_two_runs_of_one_schedule_slot_train_once(
    prefect_server: dict[str, str],
    cluster: KubernetesCluster,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    # A duplicate run of a slot (a second scheduler, a manual re-run of the slot) adopts the job.
    cluster_name = f"slot-{namespace}"[:60]
    cluster.save(cluster_name, overwrite=True)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec_yaml(run_duration="4s", workers=1))
    slot = dt.datetime.now(dt.UTC).replace(microsecond=0)
    key = f"slot-test@{slot:%Y-%m-%dT%H:%M:%SZ}"
    runner_log = (tmp_path / "runner.log").open("w")
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flows.training import retrain; retrain.serve(name='slot-test', limit=4)",
        ],
        cwd=ROOT,
        env=prefect_server,
        stdout=runner_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        parameters = {"spec": str(spec_file), "cluster": cluster_name}
        runs = [
            run_deployment("retrain/slot-test", parameters, scheduled_time=slot) for _ in range(2)
        ]
        states = [wait_for_final_state(run, timeout_s=180) for run in runs]
        assert all(s.is_completed() for s in states), [(s.type, s.message) for s in states]
        for run in runs:
            messages = asyncio.run(wait_for_logs(run, [f"(key {key})"]))
            assert any(f"(key {key})" in m for m in messages), messages[-20:]
        jobs = cluster_objects(namespace, job_kind_of("kubedl"), kubeconfig)
        assert [j["metadata"]["name"] for j in jobs] == [job_name("mnist", key, 1)]
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(timeout=30)
        runner_log.close()
        print((tmp_path / "runner.log").read_text()[-5000:])


async def test_a_failed_later_step_rolls_back_the_job_in_a_transaction(
    prefect_server: dict[str, str], cluster: KubernetesCluster, namespace: str, kubeconfig: Path
) -> None:
    job = TrainingJob(spec=spec(run_duration="2s", workers=1), cluster=cluster)

    @task
    def register(result: TrainingResult) -> None:
        raise RuntimeError(f"the registry refused {result.spec_name}")

    @flow
    def train_and_register() -> None:
        with transaction():
            result = run_training_job(job, key="rolled-back", rollback=True)
            register(result)

    state = await asyncio.to_thread(train_and_register, return_state=True)
    assert state.is_failed()
    assert cluster_objects(namespace, job_kind_of("kubedl"), kubeconfig) == []


# -- blocks and secrets ---------------------------------------------------------------------


async def test_token_blocks_round_trip_with_the_secret_hidden_in_the_api_and_logs(
    prefect_server: dict[str, str], kubeconfig: Path, namespace: str
) -> None:
    config = yaml.safe_load(await asyncio.to_thread(kubeconfig.read_text))
    token = config["users"][0]["user"]["token"]
    server = config["clusters"][0]["cluster"]["server"]
    ca_data = config["clusters"][0]["cluster"]["certificate-authority-data"]
    block = KubernetesCluster(
        server=server,
        token=SecretStr(token),
        ca_cert=ca_data,  # base64, as kubeconfigs carry it
        namespace=namespace,
    )
    name = f"token-{namespace}"[:60]
    await block.asave(name, overwrite=True)

    async with get_client() as client:
        document = await client.read_block_document_by_name(
            name, block_type_slug="kubedl-kubernetes-cluster", include_secrets=False
        )
    assert token not in json.dumps(document.model_dump(mode="json"))
    assert document.data["token"] != token
    assert document.data["server"] == server

    loaded = await KubernetesCluster.aload(name)
    assert loaded.token is not None
    assert loaded.token.get_secret_value() == token
    assert token not in repr(loaded)
    assert token not in repr(loaded.credentials())

    job = TrainingJob(spec=spec(run_duration="2s", workers=1), cluster=loaded)

    @flow
    async def train() -> TrainingResult:
        return await arun_training_job(job, key="with-a-token")

    state = await train(return_state=True)
    assert state.is_completed(), state.message
    messages = await logs_of(state.state_details.flow_run_id)
    assert messages
    assert not any(token in m for m in messages)
    events = await events_of(
        state.state_details.flow_run_id, want={"kubedl.training-job.succeeded"}
    )
    assert events
    assert not any(token in e.model_dump_json() for e in events)


def test_prefect_block_register_registers_both_block_types(
    prefect_server: dict[str, str],
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "block",
            "register",
            "-m",
            "kubedl_prefect.prefect.collection",
        ],
        env=prefect_server,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "KubeDL Kubernetes Cluster" in done.stdout
    assert "KubeDL Training Job" in done.stdout

    async def slugs() -> set[str]:
        async with get_client() as client:
            return {t.slug for t in await client.read_block_types()}

    assert {
        "kubedl-kubernetes-cluster",
        "kubedl-local-cluster",
        "kubedl-training-job",
        "kubedl-mlflow-registry",
        "kubedl-kserve-serving",
    } <= asyncio.run(slugs())
