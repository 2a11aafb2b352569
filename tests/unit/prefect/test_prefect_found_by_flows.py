"""What the flows written from the docs found (issue 21), each fixed and kept fixed.

- every attempt's ``failed`` event carries its diagnosis, once;
- a wait that runs out of time (the job is deleted) ends with a ``cancelled`` event;
- on a LocalCluster the replica table is kept and the checkpoint named is the workspace's;
- the ready ``train`` flow takes a LocalCluster block as well as a Kubernetes one.

Events are captured where the reporter sends them; no Prefect server is needed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.errors import (
    AdmissionTimeoutError,
    Diagnosis,
    FailureCategory,
    JobFailedError,
)
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    LogCallback,
    PhaseCallback,
    PhaseUpdate,
    TrainingBackend,
    WaitTimeouts,
)
from kubedl_prefect.lifecycle.records import RunRecord
from kubedl_prefect.lifecycle.replicas import ReplicaState
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.prefect import reporting
from kubedl_prefect.prefect.artifacts import ArtifactWriter
from kubedl_prefect.prefect.blocks import (
    KubernetesCluster,
    LocalCluster,
    RetrySettings,
    TrainingJob,
    WaitSettings,
)
from kubedl_prefect.prefect.events import EventSpec
from kubedl_prefect.prefect.flows import training
from kubedl_prefect.prefect.runs import TrainingJobRun
from kubedl_prefect.spec import TrainingJobSpec, job_name, loads_spec, spec_hash

SPEC = loads_spec("{name: mnist, image: busybox, replicas: {master: 1, worker: 2}}")

PREEMPTED = Diagnosis(FailureCategory.PREEMPTED, True, "worker-1", 143, "preempted", "again")
USER_CODE = Diagnosis(FailureCategory.USER_CODE, False, "worker-0", 1, "exit 1", "read the log")


@pytest.fixture(autouse=True)
def no_artifacts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Artifacts go nowhere: these runs are outside any Prefect flow run."""
    monkeypatch.setattr(ArtifactWriter, "_put", lambda *_: None)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[EventSpec]:
    captured: list[EventSpec] = []

    def emit(spec: EventSpec) -> bool:
        captured.append(spec)
        return True

    monkeypatch.setattr(reporting, "emit", emit)
    return captured


def of(sent: list[EventSpec], what: str) -> list[EventSpec]:
    return [e for e in sent if e.event == f"kubedl.training-job.{what}"]


@dataclass
class FailingBackend:
    """Each attempt is queued for GPUs, runs, then fails with the next diagnosis."""

    diagnoses: list[Diagnosis]
    timeout: AdmissionTimeoutError | None = None
    cancelled: list[str] = field(default_factory=list)

    def _ref(self, spec: TrainingJobSpec, key: str, attempt: int) -> JobRef:
        name = job_name(spec.name, key, attempt)
        return JobRef(
            backend="kubernetes",
            cluster="https://scripted:6443",
            dialect="kubedl",
            namespace="ml",
            name=name,
            uid=f"uid-{attempt}",
            api_version="training.kubedl.io/v1alpha1",
            kind="PyTorchJob",
            key=key,
            attempt=attempt,
            spec_hash=spec_hash(spec),
        )

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        return self._ref(spec, key, attempt)

    async def attach(self, ref: JobRef) -> JobRef:
        return ref

    async def history(self, spec: TrainingJobSpec, *, key: str) -> RunRecord | None:
        return None

    async def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        if self.timeout is not None:
            if on_phase is not None:
                on_phase(update(Phase.QUEUING, "1", queued=True))
            await self.cancel(ref)  # as the backends do: the job is deleted first
            raise self.timeout
        return AdmissionState(admitted=True)

    async def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        assert on_phase is not None
        on_phase(update(Phase.QUEUING, f"{ref.attempt}0", queued=True))
        if self.timeout is not None:
            await self.cancel(ref)
            raise self.timeout
        on_phase(update(Phase.RUNNING, f"{ref.attempt}1"))
        on_phase(update(Phase.FAILED, f"{ref.attempt}2"))
        await asyncio.sleep(0.05)  # the callback thread delivers meanwhile
        diagnosis = self.diagnoses.pop(0)
        return JobOutcome(ref, JobStatus(phase=Phase.FAILED), diagnosis)

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        return None

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        self.cancelled.append(ref.name)

    async def close(self) -> None:
        return None


def update(phase: Phase, rv: str, *, queued: bool = False) -> PhaseUpdate:
    admission = (
        AdmissionState(False, AdmissionBlocker.INSUFFICIENT_GPU, "Insufficient nvidia.com/gpu")
        if queued
        else None
    )
    status = JobStatus(phase=phase, message="worker exited", resource_version=rv)
    return PhaseUpdate(phase, status, admission, time.time())


BACKENDS: dict[str, TrainingBackend] = {}


class ScriptedCluster(KubernetesCluster):
    """A cluster block whose backend is the test's."""

    _block_type_slug = "kubedl-scripted-cluster-for-found-by-flows"

    def backend(self, **_: Any) -> TrainingBackend:
        return BACKENDS["now"]


def scripted_job(backend: TrainingBackend) -> TrainingJob:
    BACKENDS["now"] = backend
    return TrainingJob(
        spec=SPEC,
        cluster=ScriptedCluster(kubeconfig_path="/unused"),
        retry=RetrySettings(max_attempts=3, backoff_s=0),
        stream_logs=False,
    )


async def test_every_failed_attempt_tells_its_diagnosis_once(sent: list[EventSpec]) -> None:
    run = await TrainingJobRun.start(
        scripted_job(FailingBackend([PREEMPTED, USER_CODE])), key="nightly"
    )
    with pytest.raises(JobFailedError):
        await run.wait_for_completion()
    failed = of(sent, "failed")
    assert [e.resource["kubedl.uid"] for e in failed] == ["uid-1", "uid-2"]
    first, second = failed
    assert first.payload["diagnosis"] == PREEMPTED.to_dict()
    assert first.resource["kubedl.diagnosis"] == "Preempted"
    assert first.resource["kubedl.retryable"] == "true"
    assert first.resource["kubedl.replica"] == "worker-1"
    assert first.resource["kubedl.exit-code"] == "143"
    assert second.payload["diagnosis"]["hint"] == "read the log"
    assert second.resource["kubedl.reason"] == "UserCodeError"
    # Each attempt waited for GPUs first: its later events say so, for proactive triggers.
    assert {e.resource.get("kubedl.blocker") for e in of(sent, "running") + failed} == {
        "InsufficientGPU"
    }


def timeout_error() -> AdmissionTimeoutError:
    return AdmissionTimeoutError(
        "PyTorchJob ml/mnist was not admitted in 5 s: Insufficient nvidia.com/gpu",
        timeout_s=5,
        blocker="InsufficientGPU",
    )


async def test_an_admission_timeout_in_the_run_ends_with_a_cancelled_event(
    sent: list[EventSpec],
) -> None:
    backend = FailingBackend([], timeout=timeout_error())
    run = await TrainingJobRun.start(scripted_job(backend), key="nightly")
    with pytest.raises(AdmissionTimeoutError):
        await run.wait_for_completion()
    assert backend.cancelled  # the backend deleted the job...
    (cancelled,) = of(sent, "cancelled")  # ...and Prefect is told
    assert cancelled.resource["kubedl.reason"] == "AdmissionTimeout"
    assert cancelled.resource["kubedl.blocker"] == "InsufficientGPU"
    assert "not admitted" in cancelled.payload["reason"]


async def test_wait_for_admission_timing_out_ends_with_a_cancelled_event(
    sent: list[EventSpec],
) -> None:
    backend = FailingBackend([], timeout=timeout_error())
    run = await TrainingJobRun.start(scripted_job(backend), key="nightly")
    with pytest.raises(AdmissionTimeoutError):
        await run.wait_for_admission(timeout_s=5)
    (cancelled,) = of(sent, "cancelled")
    assert cancelled.resource["kubedl.reason"] == "AdmissionTimeout"
    assert [e.event.rsplit(".", 1)[1] for e in sent] == ["created", "queued", "cancelled"]


# -- on LocalCluster -------------------------------------------------------------------------


def local_job(workspace: Path, tmp_path: Path) -> TrainingJob:
    spec = loads_spec(
        "{name: tiny, image: python:3.11, replicas: {master: 1, worker: 1},"
        f" command: [{sys.executable!r}, -c, 'print(1)'],"
        " checkpoint: {location: /checkpoints, pvc: ckpt}}"
    )
    return TrainingJob(
        spec=spec,
        cluster=LocalCluster(
            workspace=str(workspace),
            working_dir=str(tmp_path),
            max_processes=2,
            cpus=2,
            memory_bytes=2**31,
            gpus=0,
        ),
        timeouts=WaitSettings(completion_s=60),
        stream_logs=False,
    )


async def test_a_local_run_keeps_a_replica_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sent: list[EventSpec]
) -> None:
    tables: list[tuple[ReplicaState, ...]] = []

    def replicas(
        self: ArtifactWriter, states: tuple[ReplicaState, ...], job: str, *, waiting: str = ""
    ) -> None:
        tables.append(tuple(states))

    monkeypatch.setattr(ArtifactWriter, "replicas", replicas)
    run = await TrainingJobRun.start(local_job(tmp_path / "ws", tmp_path), key="local")
    await run.wait_for_completion()
    assert (await run.fetch_result()).succeeded
    assert tables, "no replica table on a LocalCluster"
    last = tables[-1]
    assert [(r.replica, r.role, r.phase) for r in last] == [
        ("master-0", "master", "Succeeded"),
        ("worker-0", "worker", "Succeeded"),
    ]
    assert all(r.node and r.pod.startswith(run.ref.name) for r in last)


async def test_a_local_run_names_the_checkpoint_in_its_workspace(
    tmp_path: Path, sent: list[EventSpec]
) -> None:
    workspace = tmp_path / "ws"
    run = await TrainingJobRun.start(local_job(workspace, tmp_path), key="local")
    await run.wait_for_completion()
    result = await run.fetch_result()
    assert result.checkpoint is not None
    assert result.checkpoint.startswith(str(workspace.resolve()))
    assert await asyncio.to_thread(Path(result.checkpoint).is_dir)  # the replicas made it


def test_the_ready_training_flow_takes_a_local_cluster_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = LocalCluster(workspace=str(tmp_path))

    def load_kubernetes(name: str, *_: Any, **__: Any) -> KubernetesCluster:
        raise ValueError(f"Unable to find block document named {name}")

    def load_local(name: str, *_: Any, **__: Any) -> LocalCluster:
        assert name == "laptop"
        return saved

    monkeypatch.setattr(KubernetesCluster, "load", load_kubernetes)
    monkeypatch.setattr(LocalCluster, "load", load_local)
    job = training.training_job({"name": "m", "image": "x", "replicas": {"master": 1}}, "laptop")
    assert isinstance(job.cluster, LocalCluster)
    assert job.cluster.namespace == str(tmp_path.resolve())
