"""The tasks and the run handle against a real Prefect server and an in-memory backend.

The backend is a scripted :class:`TrainingBackend` (no cluster): it records what the Prefect
surface asks of it and answers like a cluster would. What the flow runs leave in Prefect is read
back through the API.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)

from kubedl_prefect.errors import KubeConnectionError
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    LogCallback,
    LogLine,
    PhaseCallback,
    PhaseUpdate,
    TrainingBackend,
    WaitTimeouts,
)
from kubedl_prefect.lifecycle.records import AttemptRecord, RunRecord
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.prefect import runs, tasks
from kubedl_prefect.prefect.blocks import KubernetesCluster, TrainingJob
from kubedl_prefect.prefect.results import TrainingResult
from kubedl_prefect.spec import TrainingJobSpec, job_name, loads_spec, spec_hash

pytestmark = pytest.mark.filterwarnings(
    # Prefect 3.9.1 leaks one HTTP connection per async flow run (results.py,
    # _read_server_default_result_storage_block_id never closes its sync client).
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    "ignore:unclosed <socket.socket:ResourceWarning",
)

SPEC = loads_spec("{name: mnist, image: busybox, replicas: {master: 1, worker: 2}}")


@pytest.fixture(autouse=True)
def collect_prefects_leaked_connections() -> Iterator[None]:
    """Collect the connections Prefect leaks (see ``pytestmark``) while this test's filter holds.

    Left to the garbage collector, they would be reported in whichever test runs next.
    """
    yield
    gc.collect()


@dataclass
class ScriptedBackend:
    """Runs every job to success; the first ``flaky`` waits lose the connection."""

    flaky: int = 0
    submitted: list[tuple[str, int]] = field(default_factory=list)
    records: dict[str, RunRecord] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def _ref(self, spec: TrainingJobSpec, key: str, attempt: int) -> JobRef:
        return JobRef(
            backend="kubernetes",
            cluster="https://scripted:6443",
            dialect="kubedl",
            namespace="ml",
            name=job_name(spec.name, key, attempt),
            uid=f"uid-{job_name(spec.name, key, attempt)}",
            api_version="training.kubedl.io/v1alpha1",
            kind="PyTorchJob",
            key=key,
            attempt=attempt,
            spec_hash=spec_hash(spec),
        )

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        self.submitted.append((key, attempt))
        ref = self._ref(spec, key, attempt)
        record = self.records.get(key) or RunRecord(spec.name, key, spec_hash(spec))
        if record.get(attempt) is None:
            entry = AttemptRecord(attempt, ref.name, ref.uid, ref=ref.to_dict())
            record = RunRecord(record.spec_name, key, record.spec_hash, (*record.attempts, entry))
        self.records[key] = record
        return ref

    async def attach(self, ref: JobRef) -> JobRef:
        return ref

    async def history(self, spec: TrainingJobSpec, *, key: str) -> RunRecord | None:
        return self.records.get(key)

    def _update(self, phase: Phase) -> PhaseUpdate:
        return PhaseUpdate(phase, JobStatus(phase=phase), None, time.time())

    async def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        return AdmissionState(admitted=True, scheduled=3, expected=3)

    async def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        if self.flaky:
            self.flaky -= 1
            raise KubeConnectionError("the API server went away")
        for phase in (Phase.ADMITTED, Phase.RUNNING, Phase.SUCCEEDED):
            if on_phase is not None:
                on_phase(self._update(phase))
        await asyncio.sleep(0.3)  # the log follower delivers meanwhile
        record = self.records[ref.key]
        done = AttemptRecord(ref.attempt, ref.name, ref.uid, phase="Succeeded", ref=ref.to_dict())
        others = tuple(a for a in record.attempts if a.attempt != ref.attempt)
        self.records[ref.key] = RunRecord(
            record.spec_name, ref.key, record.spec_hash, (*others, done)
        )
        return JobOutcome(ref, JobStatus(phase=Phase.SUCCEEDED), history=())

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        for replica in ("master-0", "worker-0", "worker-1"):
            on_line(LogLine(replica, "pytorch", "2026-01-01T00:00:00Z", f"{replica} says hi"))

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        self.cancelled.append(ref.name)

    async def close(self) -> None:
        return None


class ScriptedCluster(KubernetesCluster):
    """A cluster block whose backend is the scripted one (the local twin's hook)."""

    _block_type_slug = "kubedl-scripted-cluster-for-tests"

    def backend(self, **_: Any) -> TrainingBackend:
        return SCRIPTED


SCRIPTED = ScriptedBackend()


@pytest.fixture
def scripted() -> ScriptedBackend:
    global SCRIPTED
    SCRIPTED = ScriptedBackend()
    return SCRIPTED


def job() -> TrainingJob:
    return TrainingJob(spec=SPEC, cluster=ScriptedCluster(kubeconfig_path="/unused"))


async def logs_of(flow_run_id: Any) -> list[str]:
    async with get_client() as client:
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )
    return [log.message for log in logs]


def test_every_async_task_and_method_has_a_sync_twin_with_the_same_signature() -> None:
    for name in tasks.__all__ if hasattr(tasks, "__all__") else dir(tasks):
        value = getattr(tasks, name)
        if not (
            name.startswith("a") and hasattr(value, "fn") and inspect.iscoroutinefunction(value.fn)
        ):
            continue
        twin = getattr(tasks, name[1:])
        assert not inspect.iscoroutinefunction(twin.fn), name
        assert inspect.signature(twin.fn) == inspect.signature(value.fn), name
        assert twin.name == value.name
    for name, method in inspect.getmembers(runs.TrainingJobRun, inspect.iscoroutinefunction):
        if name.startswith("_") or name in ("start", "attach"):
            continue
        twin = getattr(runs.SyncTrainingJobRun, name)
        assert not inspect.iscoroutinefunction(twin), name
        assert inspect.signature(twin) == inspect.signature(method), name


def test_a_retried_task_keeps_its_key_and_adopts_its_job(
    prefect_server: dict[str, str], scripted: ScriptedBackend
) -> None:
    scripted.flaky = 1

    @flow
    def train() -> TrainingResult:
        return tasks.run_training_job.with_options(retry_delay_seconds=0)(job())

    state = train(return_state=True)
    assert state.is_completed(), state.message
    keys = {key for key, _ in scripted.submitted}
    assert len(keys) == 1
    (key,) = keys
    assert key == f"{state.state_details.flow_run_id}/run-training-job"
    assert {attempt for _, attempt in scripted.submitted} == {1}  # adopted, never attempt 2

    async def task_runs() -> list[Any]:
        async with get_client() as client:
            return await client.read_task_runs(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
                )
            )

    (run,) = asyncio.run(task_runs())
    assert run.run_count == 2


async def test_async_tasks_submit_wait_and_forward_every_replicas_logs(
    prefect_server: dict[str, str], scripted: ScriptedBackend
) -> None:
    @flow
    async def train() -> TrainingResult:
        saved = await tasks.asubmit_training_job(job(), key="step-by-step")
        admitted = await tasks.awatch_admission(job(), saved)
        assert admitted["admitted"]
        return await tasks.awatch_completion(job(), saved)

    state = await train(return_state=True)
    assert state.is_completed(), state.message
    result = await state.result()
    assert result.phase == "Succeeded"
    assert result.key == "step-by-step"
    assert set(scripted.submitted) == {("step-by-step", 1)}  # submitted once, then adopted
    deadline = time.monotonic() + 15
    while True:
        messages = await logs_of(state.state_details.flow_run_id)
        if sum("says hi" in m for m in messages) == 3 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    for replica in ("master-0", "worker-0", "worker-1"):
        assert f"{replica} | {replica} says hi" in messages


def test_a_replay_of_a_finished_key_trains_nothing(
    prefect_server: dict[str, str], scripted: ScriptedBackend
) -> None:
    @flow
    def train() -> TrainingResult:
        return tasks.run_training_job(job(), key="done-already")

    first = train()
    again = train()
    assert first.phase == again.phase == "Succeeded"
    submissions = len(scripted.submitted)
    assert set(scripted.submitted) == {("done-already", 1)}
    assert submissions == 2  # trigger, then arun_to_completion adopting it; none for the replay
    assert again.replayed


def test_cancel_and_render_tasks(prefect_server: dict[str, str], scripted: ScriptedBackend) -> None:
    @flow
    def submit_then_cancel() -> dict[str, Any]:
        saved = tasks.submit_training_job(job(), key="to-cancel")
        tasks.cancel_training_job(job(), saved)
        return tasks.render_training_job(
            TrainingJob(spec=SPEC, cluster=KubernetesCluster(kubeconfig_path="/k")), key="to-cancel"
        )

    manifest = submit_then_cancel()
    assert scripted.cancelled == [job_name("mnist", "to-cancel", 1)]
    assert manifest["metadata"]["name"] == job_name("mnist", "to-cancel", 1)
    assert manifest["kind"] == "PyTorchJob"


def test_outside_a_flow_a_key_is_required(scripted: ScriptedBackend) -> None:
    from kubedl_prefect.errors import KubeDLPrefectError

    with pytest.raises(KubeDLPrefectError, match="pass key="):
        job().start()
    run = job().start(key="scripted")
    run.wait_for_completion()
    assert run.fetch_result().succeeded
    assert run.to_dict()["ref"]["name"] == job_name("mnist", "scripted", 1)
