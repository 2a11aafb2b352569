"""The ``trainer`` dialect through the product: Prefect flows on the real Trainer v2 and JobSet.

Issue 18's "Done when", end to end: the ready ``train`` flow runs a PyTorch job, an MPI job and
a Volcano-gang PyTorch job as TrainJobs to Succeeded, from the same spec as the ``kubeflow``
dialect (the gang job names the test bed's Volcano-scheduled runtime instead of ``gang``); an
oversize gang is held with Volcano's reason and, past its admission timeout, fails with it and
is deleted; a cancelled flow run leaves no TrainJob, JobSet, Job, pod or PodGroup; a failed gang
job's clean-up leaves no PodGroup (Trainer leaves it: kubeflow/trainer#4033). No operator may
restart meanwhile. Jobs run as the least-privilege ServiceAccount of deploy/rbac.yaml; pods are
kwok pods driven by the test bed's annotations.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
)

from kubedl_prefect.errors import AdmissionTimeoutError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PODS, VOLCANO_PODGROUPS, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.backend import PhaseUpdate
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.kubernetes.dialects import BATCH_JOBS, JOBSET_NAME_LABEL, JOBSETS
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.prefect import KubernetesCluster
from kubedl_prefect.prefect.flows.training import train
from kubedl_prefect.spec import (
    Dialect,
    job_name,
    job_resource,
    loads_spec,
    spec_to_data,
    validate,
)
from kubedl_prefect.testbed.podlogs import PodLog
from kubedl_prefect.testbed.testbed import Testbed
from tests.support.prefect_reads import (
    cancel_flow_run,
    run_deployment,
    wait_for_final_state,
    wait_for_logs,
)

pytestmark = [
    pytest.mark.integration,
    # Prefect leaks one HTTP connection per flow run (see test_prefect_flows.py).
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
        "ignore:unclosed <socket.socket:ResourceWarning",
    ),
]

STAGE = "testbed.kubedl-prefect.io"
ROOT = Path(__file__).parents[2]
RBAC = ROOT / "deploy" / "rbac.yaml"
#: The test bed's runtime with Volcano gang scheduling enforced (docs/testbed.md).
VOLCANO_RUNTIME = "torch-distributed-volcano-scheduler"
TRAINJOBS = ResourceKind.of(
    {
        "apiVersion": job_resource("trainer", "pytorch").api_version,
        "kind": job_resource("trainer", "pytorch").kind,
    }
)


# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def collect_prefects_leaked_connections() -> Iterator[None]:
    yield
    gc.collect()


@pytest.fixture
def kubeconfig(namespace: str, service_account_kubeconfig: Callable[..., Path]) -> Path:
    """A kubeconfig of the ServiceAccount bound to the Role in deploy/rbac.yaml."""
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    role = next(d for d in documents if d["kind"] == "Role")
    return service_account_kubeconfig(namespace, role["rules"])


@pytest.fixture
def cluster_block(prefect_server: dict[str, str], kubeconfig: Path, namespace: str) -> str:
    """The name of a saved cluster block for the namespace (what ``train`` loads)."""
    name = f"trainer-{namespace}"[:60]
    KubernetesCluster(kubeconfig_path=str(kubeconfig), namespace=namespace).save(
        name, overwrite=True
    )
    return name


def objects(namespace: str, kind: ResourceKind, kubeconfig: Path) -> list[dict[str, Any]]:
    """The objects of ``kind`` in ``namespace``, read as the administrator."""

    async def call() -> list[dict[str, Any]]:
        client = await KubeClient.from_kubeconfig(str(kubeconfig))
        try:
            return (await client.list(kind, namespace)).items
        finally:
            await client.close()

    return KubeRuntime.get().block_on(call())


def left_of(namespace: str, name: str, kubeconfig: Path) -> list[str]:
    """``Kind/name`` of every TrainJob, JobSet, Job, pod and PodGroup of the job ``name``."""
    left = []
    for kind in (TRAINJOBS, JOBSETS, BATCH_JOBS, PODS, VOLCANO_PODGROUPS):
        for obj in objects(namespace, kind, kubeconfig):
            metadata = obj["metadata"]
            labels = metadata.get("labels") or {}
            if metadata["name"] == name or labels.get(JOBSET_NAME_LABEL) == name:
                left.append(f"{kind.kind}/{metadata['name']}")
    return left


def wait_until_gone(namespace: str, name: str, kubeconfig: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := left_of(namespace, name, kubeconfig)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"still there {timeout_s:g}s later: {left}"


class NodeLogs:
    """Writes ``hello from <replica>`` into each pod of a JobSet as soon as the pod exists.

    A TrainJob's pod names end with the Job controller's random suffix, so the logs cannot be
    written before submission: this thread writes them while the pods wait (``start-delay``).
    """

    def __init__(
        self, namespace: str, name: str, kubeconfig: Path, pod_log: Callable[..., PodLog]
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.kubeconfig = kubeconfig
        self.pod_log = pod_log
        self.written: dict[str, str] = {}  # pod -> replica
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for pod in objects(self.namespace, PODS, self.kubeconfig):
                    metadata = pod["metadata"]
                    labels = metadata.get("labels") or {}
                    if labels.get(JOBSET_NAME_LABEL) != self.name:
                        continue
                    if metadata["name"] in self.written:
                        continue
                    replica = (
                        f"{labels['jobset.sigs.k8s.io/replicatedjob-name']}-"
                        f"{labels['batch.kubernetes.io/job-completion-index']}"
                    )
                    self.pod_log(self.namespace, metadata["name"], "node").write(
                        f"hello from {replica}"
                    )
                    self.written[metadata["name"]] = replica
                time.sleep(0.2)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def __enter__(self) -> NodeLogs:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


async def replica_table(flow_run_id: UUID) -> list[dict[str, Any]]:
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    tables = [a for a in artifacts if a.type == "table" and str(a.key).endswith("-replicas")]
    assert tables, [(a.type, a.key) for a in artifacts]
    rows: list[dict[str, Any]] = json.loads(str(tables[-1].data))
    return rows


# -- the specs: the kubeflow dialect's, run as TrainJobs ---------------------------------------

#: Pods wait (scheduled) this long before they run: time for NodeLogs to write their logs.
START = f'"{STAGE}/start-delay": "3s", "{STAGE}/run-duration": "3s"'


def pytorch_spec(
    name: str = "mnist", *, gang: str = "", gpus: int = 0, nodes: int = 2, annotations: str = START
) -> str:
    return f"""
name: {name}
framework: pytorch
image: registry.example/mnist:1.0
command: [python, train.py]
resources: {{cpu: 1, memory: 1Gi, gpus: {gpus}}}
annotations: {{{annotations}}}
{gang}replicas:
  master: 1
  worker: {nodes - 1}
"""


def mpi_spec() -> str:
    return f"""
name: allreduce
framework: mpi
image: registry.example/mpi:1.0
command: [mpirun, python, train.py]
resources: {{cpu: 1, memory: 1Gi}}
annotations: {{{START}}}
replicas:
  launcher: 1
  worker: 2
"""


#: ``(id, spec YAML, what the kubeflow dialect reads instead, replicas)``: the flow runs the
#: same spec in both dialects; only the gang job differs (``gang`` vs the Volcano runtime).
CASES = {
    "pytorch": (pytorch_spec(), pytorch_spec(), ["node-0", "node-1"]),
    "mpi": (mpi_spec(), mpi_spec(), ["launcher-0", "node-0", "node-1"]),
    "volcano-gang": (
        pytorch_spec("gang", gang=f"runtime: {{name: {VOLCANO_RUNTIME}}}\n"),
        pytorch_spec("gang", gang="gang: {scheduler: volcano}\n"),
        ["node-0", "node-1"],
    ),
}


# -- 1. three kinds to Succeeded from the `train` flow -----------------------------------------


@pytest.mark.parametrize("case", list(CASES))
async def test_the_train_flow_runs_each_kind_as_a_train_job_to_success(
    case: str,
    cluster_block: str,
    namespace: str,
    admin_kubeconfig: Path,
    pod_log: Callable[..., PodLog],
    unchanged_operators: None,
) -> None:
    text, kubeflow_text, replicas = CASES[case]
    spec = loads_spec(text)
    validate(loads_spec(kubeflow_text), Dialect.KUBEFLOW)  # the v1 version is a valid job too
    validate(spec, Dialect.TRAINER)
    key = f"trainer-{case}"
    name = job_name(spec.name, key, 1)

    with NodeLogs(namespace, name, admin_kubeconfig, pod_log) as node_logs:
        state = await asyncio.to_thread(
            train,
            spec=spec_to_data(spec),
            cluster=cluster_block,
            dialect="trainer",
            key=key,
            max_attempts=1,
            return_state=True,
        )
    assert not node_logs.errors, node_logs.errors
    assert state.is_completed(), state.message
    result = await state.result()
    assert result.phase == "Succeeded"
    assert result.ref["dialect"] == "trainer"
    assert result.ref["kind"] == "TrainJob"
    assert result.ref["name"] == name
    assert [a.phase for a in result.attempts] == ["Succeeded"]
    flow_run_id = state.state_details.flow_run_id
    assert flow_run_id is not None

    rows = await replica_table(flow_run_id)
    assert sorted(f"{row['role']}-{row['index']}" for row in rows) == replicas, rows
    assert all(row["node"].startswith("kwok-node-") for row in rows), rows
    assert {row["pod"] for row in rows} == set(node_logs.written), (rows, node_logs.written)

    needles = [f"{r} | hello from {r}" for r in replicas]
    messages = await wait_for_logs(flow_run_id, needles)
    for needle in needles:
        assert needle in messages, messages[-40:]
    train_jobs = await asyncio.to_thread(objects, namespace, TRAINJOBS, admin_kubeconfig)
    assert [j["metadata"]["name"] for j in train_jobs] == [name]
    if case == "volcano-gang":
        assert train_jobs[0]["spec"]["runtimeRef"]["name"] == VOLCANO_RUNTIME
        pods = await asyncio.to_thread(objects, namespace, PODS, admin_kubeconfig)
        assert {p["spec"]["schedulerName"] for p in pods} == {"volcano"}


# -- 2. an oversize gang: held with Volcano's reason, then failed and deleted ------------------


async def test_an_oversize_gang_is_held_with_volcanos_reason_then_times_out_and_is_deleted(
    namespace: str,
    kubeconfig: Path,
    admin_kubeconfig: Path,
    testbed: Testbed,
    unchanged_operators: None,
) -> None:
    nodes, gpus = testbed.status().nodes, testbed.status().gpus_per_node
    spec = loads_spec(
        pytorch_spec(
            "huge", gang=f"runtime: {{name: {VOLCANO_RUNTIME}}}\n", gpus=gpus, nodes=nodes + 1
        )
    )
    backend = KubernetesBackend(namespace=namespace, dialect="trainer", kubeconfig=str(kubeconfig))
    updates: list[PhaseUpdate] = []
    try:
        ref = await backend.submit(spec, key="too-big", attempt=1)
        with pytest.raises(AdmissionTimeoutError) as caught:
            await backend.wait_admitted(ref, timeout_s=15, on_phase=updates.append)
        # Created may come first (the TrainJob before its JobSet and PodGroup); never Running.
        phases = [u.phase for u in updates]
        assert phases[-1] is Phase.QUEUING, updates
        assert set(phases) <= {Phase.CREATED, Phase.QUEUING}, updates
        reasons = [u.admission for u in updates if u.admission is not None]
        assert reasons, updates
        last = reasons[-1]
        assert last.blocker is AdmissionBlocker.INSUFFICIENT_GPU, last
        assert "nvidia.com/gpu" in last.reason, last
        assert "nvidia.com/gpu" in (caught.value.last_reason or ""), caught.value
        assert last.reason in str(caught.value), caught.value  # the line, in the failure
        assert caught.value.timeout_s == 15
        await asyncio.to_thread(wait_until_gone, namespace, ref.name, admin_kubeconfig)
    finally:
        await backend.close()


# -- 3. cancellation leaves nothing; a failed gang's clean-up leaves no PodGroup ---------------


def test_cancelling_a_train_job_flow_run_leaves_no_train_job_jobset_job_pod_or_podgroup(
    prefect_server: dict[str, str],
    cluster_block: str,
    namespace: str,
    admin_kubeconfig: Path,
    tmp_path: Path,
    unchanged_operators: None,
) -> None:
    spec = loads_spec(pytorch_spec("cancel", gang=f"runtime: {{name: {VOLCANO_RUNTIME}}}\n"))
    data = spec_to_data(spec)
    data["annotations"] = {f"{STAGE}/run-duration": "300s"}
    name = job_name(spec.name, "cancel-me", 1)
    runner_log = (tmp_path / "runner.log").open("w")
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flows.training import train; train.serve(name='trainer-cancel-test')",
        ],
        cwd=ROOT,
        env=prefect_server,
        stdout=runner_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        flow_run = run_deployment(
            "train/trainer-cancel-test",
            {"spec": data, "cluster": cluster_block, "dialect": "trainer", "key": "cancel-me"},
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = [
                p
                for p in objects(namespace, PODS, admin_kubeconfig)
                if (p["metadata"].get("labels") or {}).get(JOBSET_NAME_LABEL) == name
                and p["status"].get("phase") == "Running"
            ]
            if len(running) == 2:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the deployment's flow run never ran its TrainJob's pods")
        there = left_of(namespace, name, admin_kubeconfig)
        for kind in ("TrainJob", "JobSet", "Job", "Pod", "PodGroup"):
            assert any(o.startswith(f"{kind}/") for o in there), there

        asyncio.run(cancel_flow_run(flow_run))
        wait_until_gone(namespace, name, admin_kubeconfig, timeout_s=60)
        state = wait_for_final_state(flow_run, timeout_s=30)
        assert state.is_cancelled(), state
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(timeout=30)
        runner_log.close()
        print((tmp_path / "runner.log").read_text()[-5000:])


async def test_a_failed_gang_train_jobs_clean_up_leaves_no_podgroup(
    namespace: str, kubeconfig: Path, admin_kubeconfig: Path, unchanged_operators: None
) -> None:
    spec = loads_spec(pytorch_spec("doomed", gang=f"runtime: {{name: {VOLCANO_RUNTIME}}}\n"))
    data = spec_to_data(spec)
    data["annotations"] = {
        f"{STAGE}/run-duration": "1s",
        f"{STAGE}/exit-code": "1",
        f"{STAGE}/fail-reason": "Error",
    }
    spec = loads_spec(yaml.safe_dump(data))
    backend = KubernetesBackend(namespace=namespace, dialect="trainer", kubeconfig=str(kubeconfig))
    try:
        ref = await backend.submit(spec, key="doomed", attempt=1)
        outcome = await asyncio.wait_for(backend.wait_completed(ref), 120)
        assert not outcome.succeeded, outcome
        assert outcome.status.phase is Phase.FAILED, outcome
        groups = await asyncio.to_thread(objects, namespace, VOLCANO_PODGROUPS, admin_kubeconfig)
        assert [g["metadata"]["name"] for g in groups] == [ref.name]  # still there once failed
        await backend.cancel(ref, timeout_s=60)
        await asyncio.to_thread(wait_until_gone, namespace, ref.name, admin_kubeconfig)
    finally:
        await backend.close()


# -- 4. a suspended TrainJob is queued, never failed -------------------------------------------


async def test_a_suspended_train_job_reads_as_queuing_never_failed_and_runs_when_resumed(
    namespace: str, kubeconfig: Path, admin_kubeconfig: Path, unchanged_operators: None
) -> None:
    spec = loads_spec(pytorch_spec("held", annotations=f'"{STAGE}/run-duration": "2s"'))
    backend = KubernetesBackend(namespace=namespace, dialect="trainer", kubeconfig=str(kubeconfig))
    admin = await KubeClient.from_kubeconfig(str(admin_kubeconfig))
    seen: list[PhaseUpdate] = []
    suspended = asyncio.Event()

    def on_phase(update: PhaseUpdate) -> None:
        seen.append(update)
        if update.status.reason == "Suspended" and update.phase is Phase.QUEUING:
            suspended.set()

    try:
        ref = await backend.submit(spec, key="held", attempt=1)
        # As Kueue (or a user) does: suspend it; Trainer suspends its JobSet, whose Jobs go.
        await admin.patch(TRAINJOBS, namespace, ref.name, {"spec": {"suspend": True}})
        waiting = asyncio.ensure_future(backend.wait_completed(ref, on_phase=on_phase))
        await asyncio.wait_for(suspended.wait(), 30)
        await asyncio.sleep(3)  # held: still queuing, not failed, nothing ends the wait
        assert not waiting.done()
        assert seen[-1].phase is Phase.QUEUING, seen[-1]
        assert seen[-1].status.message == "TrainJob is suspended", seen[-1]
        await admin.patch(TRAINJOBS, namespace, ref.name, {"spec": {"suspend": False}})
        outcome = await asyncio.wait_for(waiting, 60)
    finally:
        await admin.close()
        await backend.close()
    assert outcome.succeeded, outcome
    phases = [u.phase for u in seen]
    assert Phase.FAILED not in phases, phases
    assert phases[-1] is Phase.SUCCEEDED
    resumed = phases[len(phases) - phases[::-1].index(Phase.QUEUING) :]
    assert Phase.RUNNING in resumed, phases
