"""Event names, resources, payloads and deterministic ids (pure)."""

from __future__ import annotations

from kubedl_prefect.errors import Diagnosis, FailureCategory
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.status import JobStatus, Phase, ReplicaCounts
from kubedl_prefect.prefect.events import PHASE_EVENTS, JobEvent, job_event, phase_event

REF = JobRef(
    backend="kubernetes",
    cluster="https://10.0.0.1:6443",
    dialect="kubedl",
    namespace="ml",
    name="mnist-abc-a2",
    uid="0f1e-uid",
    api_version="training.kubedl.io/v1alpha1",
    kind="PyTorchJob",
    key="nightly",
    attempt=2,
    spec_hash="ab12",
)


def update(phase: Phase, admission: AdmissionState | None = None, rv: str = "7") -> PhaseUpdate:
    status = JobStatus(
        phase=phase,
        reason="JobFailed" if phase is Phase.FAILED else "",
        message="worker-1 exited with 1" if phase is Phase.FAILED else "",
        replicas={"worker": ReplicaCounts(active=2), "master": ReplicaCounts(active=1)},
        resource_version=rv,
    )
    return PhaseUpdate(phase=phase, status=status, admission=admission, observed_at=1_700_000_000.0)


def test_every_event_name_is_under_the_prefix() -> None:
    assert [e.event_name for e in JobEvent] == [
        f"kubedl.training-job.{what}"
        for what in (
            "created",
            "queued",
            "admitted",
            "running",
            "restarting",
            "succeeded",
            "failed",
            "cancelled",
            "requeued",
            "preempted",
        )
    ]
    told_otherwise = {JobEvent.CREATED, JobEvent.CANCELLED, JobEvent.REQUEUED, JobEvent.PREEMPTED}
    assert set(PHASE_EVENTS.values()) == set(JobEvent) - told_otherwise


def test_the_resource_is_one_attempt_of_one_job_and_holds_no_secret() -> None:
    spec = job_event(REF, JobEvent.CREATED, at=0.0)
    assert spec.resource == {
        "prefect.resource.id": "kubedl.training-job.0f1e-uid",
        "prefect.resource.name": "mnist-abc-a2",
        "kubedl.namespace": "ml",
        "kubedl.name": "mnist-abc-a2",
        "kubedl.uid": "0f1e-uid",
        "kubedl.attempt": "2",
        "kubedl.kind": "PyTorchJob",
        "kubedl.dialect": "kubedl",
        "kubedl.cluster": "https://10.0.0.1:6443",
    }
    assert spec.payload == {"attempt": 2, "key": "nightly", "phase": "Created"}


def test_queued_carries_the_one_line_reason_and_the_blocker() -> None:
    queued = AdmissionState(
        admitted=False,
        blocker=AdmissionBlocker.INSUFFICIENT_GPU,
        reason="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        scheduled=0,
        expected=3,
    )
    spec = phase_event(REF, update(Phase.QUEUING, queued))
    assert spec is not None
    assert spec.event == "kubedl.training-job.queued"
    assert spec.payload["reason"] == queued.reason
    assert spec.payload["blocker"] == "InsufficientGPU"
    assert (spec.payload["scheduled"], spec.payload["expected"]) == (0, 3)
    assert spec.payload["replicas"]["worker"] == {
        "active": 2,
        "succeeded": 0,
        "failed": 0,
        "evicted": 0,
    }


def test_failed_carries_the_reason_and_the_diagnosis() -> None:
    diagnosis = Diagnosis(FailureCategory.USER_CODE, False, "worker-1", 1, "exit 1", "read it")
    spec = job_event(REF, JobEvent.FAILED, update=update(Phase.FAILED), diagnosis=diagnosis)
    assert spec.payload["reason"] == "worker-1 exited with 1"
    assert spec.payload["diagnosis"]["category"] == "UserCodeError"
    assert phase_event(REF, update(Phase.RUNNING)) is not None
    assert "reason" not in job_event(REF, JobEvent.RUNNING, update=update(Phase.RUNNING)).payload


def test_ids_are_the_same_for_the_same_change_and_differ_otherwise() -> None:
    first = phase_event(REF, update(Phase.RUNNING, rv="9"))
    again = phase_event(REF, update(Phase.RUNNING, rv="9"))
    later = phase_event(REF, update(Phase.RUNNING, rv="10"))
    assert first is not None
    assert again is not None
    assert later is not None
    assert first.id == again.id
    assert first.id != later.id
    assert job_event(REF, JobEvent.CREATED).id == job_event(REF, JobEvent.CREATED).id
    assert job_event(REF, JobEvent.CREATED).id != job_event(REF, JobEvent.CANCELLED).id


def test_created_and_suspended_phases_tell_no_event() -> None:
    assert phase_event(REF, update(Phase.CREATED)) is None
    assert phase_event(REF, update(Phase.SUSPENDED)) is None
