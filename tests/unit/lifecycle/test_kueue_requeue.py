"""Eviction is not failure: a job Kueue admits, evicts, requeues and admits again reads truthfully.

Sequences of the job (conditions as the Kubeflow training operator v1.9 writes them on suspend
and resume) and its Workload (conditions as Kueue v0.19.2 writes them on admission, eviction,
requeue and re-admission), read by the pure phase decision
(:func:`~kubedl_prefect.lifecycle.status.queued_status` over
:func:`~kubedl_prefect.lifecycle.kubernetes.kueue.queue_hold`).
"""

from __future__ import annotations

from typing import Any

import pytest

from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.kubernetes.kueue import queue_hold
from kubedl_prefect.lifecycle.status import (
    JobStatus,
    Phase,
    QueueHold,
    job_status,
    queued_status,
)
from kubedl_prefect.lifecycle.waiting import PhaseTracker

UID = "0d7e"
PREEMPTED = "Preempted to accommodate a workload (UID: 9a, JobUID: 9b) due to prioritization"


def condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": str(status), "reason": reason, "message": message}


def job(*conditions: dict[str, str], suspend: bool) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "mnist",
            "namespace": "ml",
            "uid": UID,
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
        },
        "spec": {"runPolicy": {"suspend": suspend}, "pytorchReplicaSpecs": {}},
        "status": {"conditions": list(conditions)},
    }


def workload(*conditions: dict[str, str], count: int = 0) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if count:
        status["requeueState"] = {"count": count}
    return {"metadata": {"name": "wl", "labels": {"kueue.x-k8s.io/job-uid": UID}}, "status": status}


CREATED = condition("Created", True, "PyTorchJobCreated")
SUSPENDED = condition("Suspended", True, "PyTorchJobSuspended")
RESUMED = condition("Suspended", False, "PyTorchJobResumed")
RUNNING = condition("Running", True, "PyTorchJobRunning")
STOPPED = condition("Running", False, "PyTorchJobSuspended")
SUCCEEDED = condition("Succeeded", True, "PyTorchJobSucceeded")

WAITING = condition(
    "QuotaReserved", False, "Pending", "insufficient unused quota ... 2 more needed"
)
RESERVED = condition("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue q")
ADMITTED = condition("Admitted", True, "Admitted", "The workload is admitted")
NOT_ADMITTED = condition("Admitted", False, "NoReservation", "The workload has no reservation")
EVICTED = condition("Evicted", True, "Preempted", PREEMPTED)
PREEMPTED_TOO = condition("Preempted", True, "InClusterQueue", PREEMPTED)
REQUEUED = condition("Requeued", True, "Preempted", PREEMPTED)
EVICTION_CLEARED = condition("Evicted", False, "QuotaReserved", "Previously: Preempted")
FINISHED = condition("Finished", True, "Succeeded", "Job finished successfully")

# suspend -> admit -> evict -> admit -> succeed: (step, job, workload, phase, reason)
SEQUENCE = [
    ("created suspended", job(CREATED, SUSPENDED, suspend=True), None, Phase.QUEUING, "Queued"),
    ("queued", job(CREATED, SUSPENDED, suspend=True), workload(WAITING), Phase.QUEUING, "Pending"),
    (
        "admitted, not resumed yet",
        job(CREATED, SUSPENDED, suspend=True),
        workload(RESERVED, ADMITTED),
        Phase.CREATED,
        "Admitted",
    ),
    (
        "resumed and running",
        job(CREATED, RESUMED, RUNNING, suspend=False),
        workload(RESERVED, ADMITTED),
        Phase.RUNNING,
        "PyTorchJobRunning",
    ),
    (
        "evicted, the pods still stopping",
        job(CREATED, RESUMED, RUNNING, suspend=True),
        workload(RESERVED, ADMITTED, EVICTED, PREEMPTED_TOO),
        Phase.QUEUING,
        "Requeued",
    ),
    (
        "suspended again",
        job(CREATED, STOPPED, SUSPENDED, suspend=True),
        workload(RESERVED, ADMITTED, EVICTED, PREEMPTED_TOO),
        Phase.QUEUING,
        "Requeued",
    ),
    (
        "requeued, waiting for quota",
        job(CREATED, STOPPED, SUSPENDED, suspend=True),
        workload(WAITING, NOT_ADMITTED, EVICTED, PREEMPTED_TOO, REQUEUED, count=1),
        Phase.QUEUING,
        "Requeued",
    ),
    (
        "admitted again",
        job(CREATED, STOPPED, SUSPENDED, suspend=True),
        workload(RESERVED, ADMITTED, EVICTION_CLEARED, REQUEUED, count=1),
        Phase.CREATED,
        "Admitted",
    ),
    (
        "running again (from its checkpoint)",
        job(CREATED, RESUMED, RUNNING, suspend=False),
        workload(RESERVED, ADMITTED, EVICTION_CLEARED, REQUEUED, count=1),
        Phase.RUNNING,
        "PyTorchJobRunning",
    ),
    (
        "succeeded",
        job(CREATED, RESUMED, STOPPED, SUCCEEDED, suspend=False),
        workload(RESERVED, ADMITTED, EVICTION_CLEARED, REQUEUED, FINISHED, count=1),
        Phase.SUCCEEDED,
        "PyTorchJobSucceeded",
    ),
]


def read(job_object: dict[str, Any], workload_object: dict[str, Any] | None) -> JobStatus:
    return queued_status(job_status(job_object), queue_hold(job_object, workload_object))


@pytest.mark.parametrize(
    ("step", "job_object", "workload_object", "phase", "reason"),
    SEQUENCE,
    ids=[step for step, *_ in SEQUENCE],
)
def test_each_step_reads_truthfully(
    step: str,
    job_object: dict[str, Any],
    workload_object: dict[str, Any] | None,
    phase: Phase,
    reason: str,
) -> None:
    status = read(job_object, workload_object)
    assert status.phase is phase, status
    assert status.reason == reason


def test_the_whole_sequence_never_fails_and_says_requeued_with_kueues_reason() -> None:
    tracker = PhaseTracker(None)
    for _, job_object, workload_object, _, _ in SEQUENCE:
        tracker.observe(read(job_object, workload_object), AdmissionState(admitted=False))
    phases = [update.phase for update in tracker.history]
    assert Phase.FAILED not in phases
    assert phases[-1] is Phase.SUCCEEDED
    # Admitted twice, evicted once in between: one job, no attempt counted.
    assert phases.count(Phase.RUNNING) == 2
    requeued = [u.status for u in tracker.history if u.status.reason == "Requeued"]
    assert requeued
    assert requeued[0].message == f"requeued: Preempted: {PREEMPTED}"


def test_a_requeued_job_whose_old_pods_are_still_stopping_is_queuing_not_admitted() -> None:
    # Seen on real pods: Kueue evicted the job, the operator is deleting its pods, which are
    # still bound to their node, so the pods alone would read admitted.
    status = read(
        job(CREATED, STOPPED, SUSPENDED, suspend=True),
        workload(RESERVED, NOT_ADMITTED, EVICTED, PREEMPTED_TOO, REQUEUED, count=1),
    )
    tracker = PhaseTracker(None)
    update = tracker.observe(status, AdmissionState(admitted=True, scheduled=2, expected=2))
    assert update is not None
    assert update.phase is Phase.QUEUING
    assert update.status.message.startswith("requeued: Preempted")
    # Admitted again by Kueue and the pods bound: admitted.
    admitted = read(
        job(CREATED, RESUMED, suspend=False),
        workload(RESERVED, ADMITTED, EVICTION_CLEARED, REQUEUED, count=1),
    )
    again = tracker.observe(admitted, AdmissionState(admitted=True, scheduled=2, expected=2))
    assert again is not None
    assert again.phase is Phase.ADMITTED


def test_the_requeue_count_and_a_backoff_are_kueues() -> None:
    hold = queue_hold(
        job(CREATED, STOPPED, SUSPENDED, suspend=True),
        workload(WAITING, NOT_ADMITTED, EVICTED, REQUEUED, count=3),
    )
    assert hold == QueueHold(
        admitted=False, requeued=True, reason="Preempted", message=PREEMPTED, requeues=3
    )


def test_a_pods_ready_timeout_is_requeued_while_its_backoff_runs() -> None:
    timeout = condition("Evicted", True, "PodsReadyTimeout", "Exceeded the PodsReady timeout ml/wl")
    backoff = condition("Requeued", False, "PodsReadyTimeout", "Exceeded the PodsReady timeout")
    status = read(
        job(CREATED, STOPPED, SUSPENDED, suspend=True), workload(WAITING, timeout, backoff)
    )
    assert (status.phase, status.reason) == (Phase.QUEUING, "Requeued")
    assert status.message.startswith("requeued: PodsReadyTimeout")


def test_a_deactivated_workload_is_not_requeued() -> None:
    deactivated = workload(condition("Evicted", True, "Deactivated", "The workload is deactivated"))
    deactivated["spec"] = {"active": False}
    hold = queue_hold(job(CREATED, SUSPENDED, suspend=True), deactivated)
    assert hold is not None
    assert not hold.requeued
    assert not hold.admitted


def test_a_job_no_queue_manages_keeps_the_operators_phase() -> None:
    paused = job(CREATED, SUSPENDED, suspend=True)
    del paused["metadata"]["labels"]
    assert queue_hold(paused, None) is None
    assert read(paused, None).phase is Phase.SUSPENDED


def test_a_terminal_job_stays_terminal_whatever_its_workload_says() -> None:
    failed = job(CREATED, condition("Failed", True, "PyTorchJobFailed"), suspend=True)
    status = read(failed, workload(WAITING, EVICTED))
    assert status.phase is Phase.FAILED


def test_a_preemption_says_how_kueue_preempted_and_the_status_carries_the_hold() -> None:
    evicted = job(CREATED, RESUMED, RUNNING, suspend=True)
    status = read(evicted, workload(RESERVED, ADMITTED, EVICTED, PREEMPTED_TOO))
    assert status.queue == QueueHold(
        admitted=False,
        requeued=True,
        reason="Preempted",
        message=PREEMPTED,
        preemption="InClusterQueue",
    )
    # Admitted again: Kueue resets Preempted (not True), and the hold no longer names it.
    again = read(evicted, workload(RESERVED, ADMITTED, EVICTION_CLEARED, REQUEUED, count=1))
    assert again.queue is not None
    assert again.queue.admitted
    assert again.queue.preemption == ""


def test_a_status_no_queue_holds_carries_no_hold() -> None:
    paused = job(CREATED, SUSPENDED, suspend=True)
    del paused["metadata"]["labels"]
    assert read(paused, None).queue is None
