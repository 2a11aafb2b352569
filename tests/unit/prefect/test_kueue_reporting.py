"""What Prefect is told of a job Kueue queues, admits, preempts, requeues and admits again.

The statuses are the phase decision's reading (:func:`queued_status` over :func:`queue_hold`) of
job and Workload conditions as the Kubeflow training operator v1.9 and Kueue v0.19.2 write them
(the same shapes ``tests/unit/lifecycle/test_kueue_requeue.py`` walks), fed through the
:class:`PhaseTracker` to the run's :class:`JobReporter` (events captured, not sent).
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import replace
from typing import Any

import pytest

from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.kubernetes.kueue import queue_hold
from kubedl_prefect.lifecycle.status import JobStatus, job_status, queued_status
from kubedl_prefect.lifecycle.waiting import PhaseTracker
from kubedl_prefect.prefect import reporting
from kubedl_prefect.prefect.artifacts import summary_markdown
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import EventSpec
from kubedl_prefect.prefect.results import training_result

UID = "0d7e"
REF = JobRef(
    backend="kubernetes",
    cluster="https://k:6443",
    dialect="kubeflow",
    namespace="ml",
    name="mnist-abc-a1",
    uid=UID,
    api_version="kubeflow.org/v1",
    kind="PyTorchJob",
    key="nightly",
    attempt=1,
    spec_hash="h",
)
PREEMPTED = "Preempted to accommodate a workload (UID: 9a, JobUID: 9b) due to prioritization"
SHORT = (
    "ClusterQueue gpu (LocalQueue ml/team-a) has no room yet: 2 more nvidia.com/gpu needed in "
    "flavor kwok-gpu"
)


def condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": str(status), "reason": reason, "message": message}


def job(*conditions: dict[str, str], suspend: bool, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": REF.name,
            "namespace": "ml",
            "uid": UID,
            "resourceVersion": rv,
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
        },
        "spec": {"runPolicy": {"suspend": suspend}, "pytorchReplicaSpecs": {}},
        "status": {"conditions": list(conditions)},
    }


def workload(*conditions: dict[str, str], evictions: int = 0) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if evictions:
        status["schedulingStats"] = {"evictions": [{"reason": "Preempted", "count": evictions}]}
    return {"metadata": {"name": "wl", "labels": {"kueue.x-k8s.io/job-uid": UID}}, "status": status}


CREATED = condition("Created", True, "PyTorchJobCreated")
SUSPENDED = condition("Suspended", True, "PyTorchJobSuspended")
RESUMED = condition("Suspended", False, "PyTorchJobResumed")
RUNNING = condition("Running", True, "PyTorchJobRunning")
STOPPED = condition("Running", False, "PyTorchJobSuspended")
SUCCEEDED = condition("Succeeded", True, "PyTorchJobSucceeded")
WAITING = condition("QuotaReserved", False, "Pending", "insufficient unused quota")
RESERVED = condition("QuotaReserved", True, "QuotaReserved", "Quota reserved")
ADMITTED = condition("Admitted", True, "Admitted", "The workload is admitted")
NOT_ADMITTED = condition("Admitted", False, "NoReservation", "The workload has no reservation")
EVICTED = condition("Evicted", True, "Preempted", PREEMPTED)
PREEMPTED_BY = condition("Preempted", True, "InClusterQueue", PREEMPTED)
REQUEUED = condition("Requeued", True, "Preempted", PREEMPTED)
CLEARED = condition("Evicted", False, "QuotaReserved", "Previously: Preempted")
FINISHED = condition("Finished", True, "Succeeded", "Job finished successfully")

QUOTA = AdmissionState(
    False, AdmissionBlocker.INSUFFICIENT_QUOTA, SHORT, subject="ClusterQueue gpu"
)
REQUEUED_WAIT = AdmissionState(
    False,
    AdmissionBlocker.REQUEUED,
    f"requeued after eviction (Preempted): {PREEMPTED}",
    subject="ClusterQueue gpu",
)
IN = AdmissionState(True, scheduled=2, expected=2)

# (seconds since submission, job, its Workload, the admission state the wait decided)
STEPS = [
    (1.0, job(CREATED, SUSPENDED, suspend=True, rv="2"), workload(WAITING), QUOTA),
    (30.0, job(CREATED, SUSPENDED, suspend=True, rv="3"), workload(RESERVED, ADMITTED), IN),
    (31.0, job(CREATED, RESUMED, RUNNING, suspend=False, rv="4"), workload(RESERVED, ADMITTED), IN),
    (
        50.0,
        job(CREATED, RESUMED, RUNNING, suspend=True, rv="5"),
        workload(RESERVED, ADMITTED, EVICTED, PREEMPTED_BY, evictions=1),
        REQUEUED_WAIT,
    ),
    (
        52.0,
        job(CREATED, STOPPED, SUSPENDED, suspend=True, rv="6"),
        workload(WAITING, NOT_ADMITTED, EVICTED, PREEMPTED_BY, REQUEUED, evictions=1),
        QUOTA,
    ),
    (
        70.0,
        job(CREATED, STOPPED, SUSPENDED, suspend=True, rv="7"),
        workload(RESERVED, ADMITTED, CLEARED, REQUEUED, evictions=1),
        IN,
    ),
    (
        71.0,
        job(CREATED, RESUMED, RUNNING, suspend=False, rv="8"),
        workload(RESERVED, ADMITTED, CLEARED, REQUEUED, evictions=1),
        IN,
    ),
    (
        90.0,
        job(CREATED, RESUMED, STOPPED, SUCCEEDED, suspend=False, rv="9"),
        workload(RESERVED, ADMITTED, CLEARED, REQUEUED, FINISHED, evictions=1),
        IN,
    ),
]
SUBMITTED_AT = 1_700_000_000.0


def updates() -> list[PhaseUpdate]:
    """The phase updates a wait makes of :data:`STEPS`, at their times."""
    tracker = PhaseTracker(None)
    made = []
    for after, job_object, workload_object, admission in STEPS:
        status: JobStatus = queued_status(
            job_status(job_object), queue_hold(job_object, workload_object)
        )
        update = tracker.observe(status, admission)
        if update is not None:
            made.append(replace(update, observed_at=SUBMITTED_AT + after))
    return made


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[EventSpec]:
    captured: list[EventSpec] = []

    def emit(spec: EventSpec) -> bool:
        captured.append(spec)
        return True

    monkeypatch.setattr(reporting, "emit", emit)
    return captured


class NoReplicas:
    """A backend that cannot list replicas (only events and the timeline matter here)."""


def reporter() -> reporting.JobReporter:
    ctx = RunContext(
        None, None, None, None, None, None, None, None, logging.getLogger("t"),
        contextvars.copy_context(),
    )  # fmt: skip
    made = reporting.JobReporter(ctx, NoReplicas(), "mnist-abc")  # type: ignore[arg-type]
    made.attempt(REF)
    made.timeline.attempts[-1].submitted_at = SUBMITTED_AT
    return made


def test_queued_admitted_preempted_requeued_and_admitted_again_are_events(
    sent: list[EventSpec],
) -> None:
    report = reporter()
    for update in updates():
        report._phase(update)
    told = [(e.event.rpartition(".")[2], e.resource.get("kubedl.reason")) for e in sent]
    assert told == [
        ("created", None),
        ("queued", "InsufficientQuota"),
        ("admitted", None),
        ("running", None),
        ("preempted", "InClusterQueue"),
        ("requeued", "Preempted"),
        ("queued", "Requeued"),
        ("queued", "InsufficientQuota"),
        ("admitted", None),
        ("running", None),
        ("succeeded", None),
    ]
    requeued = sent[5]
    assert requeued.resource["kubedl.blocker"] == "Requeued"
    assert requeued.resource["kubedl.uid"] == UID  # the same job: no new attempt
    assert requeued.resource["kubedl.attempt"] == "1"
    assert requeued.payload["evicted"] == "Preempted"
    assert requeued.payload["requeues"] == 1
    assert requeued.payload["reason"] == f"requeued: Preempted: {PREEMPTED}"
    assert len({e.id for e in sent}) == len(sent)  # every event its own id


def test_an_automation_can_match_queued_for_insufficient_quota(sent: list[EventSpec]) -> None:
    report = reporter()
    report._phase(updates()[0])
    queued = sent[-1]
    assert queued.event == "kubedl.training-job.queued"
    assert queued.resource["kubedl.reason"] == "InsufficientQuota"
    assert queued.payload["reason"] == SHORT


def test_the_summary_counts_requeues_and_the_time_queued_across_them(
    sent: list[EventSpec],
) -> None:
    report = reporter()
    for update in updates():
        report._phase(update)
    timeline = report.timeline
    # Queued from submission to the first admission (30 s), and again from the eviction (50 s)
    # to the next admission (70 s); running 31-50 s and 71-90 s.
    assert timeline.requeues() == 1
    assert timeline.requeued_s() == pytest.approx(20.0)
    assert timeline.queued_s() == pytest.approx(50.0)
    assert timeline.running_s() == pytest.approx(39.0)
    result = training_result(
        spec_name="mnist",
        key="nightly",
        ref=REF,
        phase="Succeeded",
        timeline=timeline,
        record=None,
        started_at=SUBMITTED_AT,
        ended_at=SUBMITTED_AT + 91.0,
        checkpoint="s3://ckpt/mnist",
    )
    assert (result.requeues, result.queued_s, result.requeued_s) == (1, 50.0, 20.0)
    text = summary_markdown(result)
    assert "| requeues | 1 |" in text
    assert "| admission wait | 50s (20s of it after 1 requeue) |" in text


def test_a_job_never_requeued_says_so(sent: list[EventSpec]) -> None:
    report = reporter()
    first = updates()[:3]  # queued, admitted, running
    for update in first:
        report._phase(update)
    assert report.timeline.requeues() == 0
    assert report.timeline.requeued_s() is None
    assert report.timeline.queued_s() == pytest.approx(30.0)


def test_a_job_admitted_on_borrowed_quota_says_so_in_the_run_log(
    sent: list[EventSpec], caplog: pytest.LogCaptureFixture
) -> None:
    lent = (
        "admitted on quota borrowed from cohort research: 2 nvidia.com/gpu in flavor kwok-gpu "
        "(ClusterQueue gpu: nominal quota 2, 4 in use)"
    )
    tracker = PhaseTracker(None)
    report = reporter()
    for job_object, workload_object, admission in [
        (STEPS[0][1], STEPS[0][2], QUOTA),
        (STEPS[1][1], STEPS[1][2], replace(IN, reason=lent)),
    ]:
        status = queued_status(job_status(job_object), queue_hold(job_object, workload_object))
        update = tracker.observe(status, admission)
        assert update is not None
        with caplog.at_level(logging.INFO, logger="t"):
            report._phase(update)
    assert f"training job {REF.name}: Admitted ({lent})" in caplog.messages
    assert [e.event.rpartition(".")[2] for e in sent][-1] == "admitted"
