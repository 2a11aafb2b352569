"""Kueue's reasons, decided: every Workload reason a blocker with its object, line and decision.

The fixtures in ``kueue/`` are written from Kueue v0.19.2's formats (``QuotaReserved=False``
messages of ``pkg/scheduler/flavorassigner``, the queue messages of
``pkg/controller/core/workload_controller.go``, the eviction and requeue conditions); the
``recorded-*`` ones were recorded from the real Kueue v0.19.2 on the test bed (a preemption and
the admission after it; tests/integration/test_kueue.py runs those flows). Each holds a suspended
PyTorchJob in LocalQueue ``ml/team-a``, its Workload, and the LocalQueue and ClusterQueue objects
the wait reads (``null``: it does not exist; absent: it could not be read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.errors import FailureCategory
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.kubernetes.admission import admission_state
from kubedl_prefect.lifecycle.kubernetes.blockers import fact_request
from kubedl_prefect.lifecycle.kubernetes.cluster import ClusterFacts
from kubedl_prefect.lifecycle.kubernetes.kueue import (
    KUEUE_GRACE_S,
    job_workload,
    kueue_blocker,
    queue_hold,
    suspended,
)
from kubedl_prefect.lifecycle.status import job_status, queued_status
from kubedl_prefect.lifecycle.waiting import PhaseTracker, ReasonKeeper

FIXTURES = Path(__file__).parent / "kueue"
B = AdmissionBlocker
CQ = "ClusterQueue team-gpu"
LQ = "LocalQueue ml/team-a"


def fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def facts_of(recorded: dict[str, Any]) -> ClusterFacts:
    return ClusterFacts(
        local_queues=recorded["localQueues"],
        cluster_queues=recorded["clusterQueues"],
        workloads=recorded["workloads"],
    )


def decide(recorded: dict[str, Any], facts: ClusterFacts | None = None) -> AdmissionState:
    return admission_state(recorded["job"], pods=[], facts=facts or facts_of(recorded))


# fixture: (blocker, permanent, subject, words the one-line reason must contain)
CASES: dict[str, tuple[AdmissionBlocker, bool, str, tuple[str, ...]]] = {
    "quota-in-use": (
        B.INSUFFICIENT_QUOTA,
        False,
        CQ,
        ("2 more nvidia.com/gpu needed in flavor gpu-a", "pod set worker", LQ),
    ),
    "quota-in-use-observability": (
        B.INSUFFICIENT_QUOTA,
        False,
        CQ,
        # Kueue counts over the pod sets: the worker's 16 includes the master's 500m.
        ("16 more cpu needed in flavor gpu-a (pod sets master, worker)", "8 more nvidia.com/gpu"),
    ),
    "one-flavor-fits-later": (B.INSUFFICIENT_QUOTA, False, CQ, ("4 more nvidia.com/gpu",)),
    "preempting": (
        B.WAITING_FOR_PREEMPTION,
        False,
        CQ,
        ("preempting 1 workload(s)", "4 more nvidia.com/gpu needed in flavor gpu-a"),
    ),
    "pending-evaluation": (B.WAITING, False, CQ, ("for Kueue to evaluate the job",)),
    "admission-checks": (B.WAITING, False, CQ, ("quota reserved", "gpu-provisioning (Pending)")),
    "above-max-quota": (
        B.QUEUE_CAPABILITY,
        True,
        CQ,
        ("needs 12 nvidia.com/gpu in flavor gpu-a", "at most 8"),
    ),
    "above-max-quota-pending": (B.QUEUE_CAPABILITY, True, CQ, ("needs 12", "at most 8")),
    "no-matching-flavor": (
        B.NO_MATCHING_FLAVOR,
        True,
        CQ,
        ("flavor gpu-a has the untolerated taint", "flavor cpu-only does not match"),
    ),
    "resource-not-covered": (
        B.NO_MATCHING_FLAVOR,
        True,
        CQ,
        ("no quota for nvidia.com/gpu in any flavor",),
    ),
    "local-queue-missing": (B.QUEUE_NOT_FOUND, True, LQ, ('LocalQueue "team-a" does not exist',)),
    "local-queue-missing-words": (B.QUEUE_NOT_FOUND, True, LQ, ('"team-a" does not exist',)),
    "cluster-queue-missing": (
        B.QUEUE_NOT_FOUND,
        True,
        CQ,
        ('ClusterQueue "team-gpu" of LocalQueue ml/team-a does not exist',),
    ),
    "local-queue-stopped": (B.QUEUE_CLOSED, True, LQ, ("is stopped (stopPolicy Hold)",)),
    "cluster-queue-stopped": (B.QUEUE_CLOSED, True, CQ, ("stopPolicy HoldAndDrain",)),
    "cluster-queue-inactive": (
        B.QUEUE_MISCONFIGURED,
        True,
        CQ,
        ("FlavorNotFound", "missing ResourceFlavor(s): gpu-a"),
    ),
    "cluster-queue-inactive-words": (B.QUEUE_MISCONFIGURED, True, CQ, ("is inactive",)),
    "preempted-requeued": (
        B.REQUEUED,
        False,
        CQ,
        ("requeued after eviction (Preempted)", "Preempted to accommodate a workload"),
    ),
    "pods-ready-timeout": (
        B.REQUEUED,
        False,
        CQ,
        ("(PodsReadyTimeout, 2 times so far)", "back in the queue at 2026-12-01T10:04:00Z"),
    ),
    "evicted-stopping": (
        B.REQUEUED,
        False,
        CQ,
        ("requeued after eviction (Preempted)", "Preempted to accommodate a workload"),
    ),
    "requeued-quota-in-use": (
        B.INSUFFICIENT_QUOTA,
        False,
        CQ,
        ("requeued after eviction (Preempted); now", "2 more nvidia.com/gpu"),
    ),
    "requeuing-limit": (
        B.REQUEUING_LIMIT,
        True,
        "Workload ml/pytorchjob-mnist-7c3e9a-a1-5d2f1",
        ("backoffLimitCount", "did not all get ready in time"),
    ),
    # Recorded from the real Kueue v0.19.2 (test bed): after a preemption the Workload is
    # QuotaReserved=False with the flavor message, one part per pod set, each counting the pod
    # sets before it ("2 more" for the master, "4 more" for master and worker together).
    "recorded-preempted-requeued": (
        B.INSUFFICIENT_QUOTA,
        False,
        "ClusterQueue cq-probe2",
        (
            "requeued after eviction (Preempted); now",
            "ClusterQueue cq-probe2 (LocalQueue probe2/gpu) has no room yet: 4 more "
            "nvidia.com/gpu needed in flavor kwok-gpu (pod sets master, worker)",
        ),
    ),
    "deactivated": (
        B.WORKLOAD_DEACTIVATED,
        True,
        "Workload ml/pytorchjob-mnist-7c3e9a-a1-5d2f1",
        ("The workload is deactivated",),
    ),
}


def test_every_fixture_has_a_case() -> None:
    # recorded-borrowed: admitted on borrowed quota (test_kueue_borrowing.py).
    expected = {*CASES, "admitted", "recorded-readmitted", "recorded-borrowed"}
    assert {p.stem for p in FIXTURES.glob("*.json")} == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_kueue_reason_is_a_blocker_with_its_object_line_fix_and_decision(name: str) -> None:
    blocker, permanent, subject, words = CASES[name]
    state = decide(fixture(name))
    assert not state.admitted
    assert state.blocker is blocker, state.reason
    assert state.permanent is permanent, state.reason
    assert state.subject == subject
    for word in words:
        assert word in state.reason, state.reason
    assert "\n" not in state.reason
    assert state.hint
    diagnosis = state.diagnosis()
    if permanent:
        assert diagnosis is not None
        assert diagnosis.category is FailureCategory(blocker.value)
        assert diagnosis.subject == subject
        assert not diagnosis.retryable
    else:
        assert diagnosis is None


def test_an_admitted_workload_holds_nothing_back() -> None:
    recorded = fixture("admitted")
    state = decide(recorded)
    assert state.blocker is B.NOT_CREATED  # the operator's turn: Kueue is done
    workload = job_workload(recorded["job"], recorded["workloads"])
    assert workload is not None
    assert (
        kueue_blocker(
            recorded["job"],
            workload=workload,
            workloads_read=True,
            local_queues=recorded["localQueues"],
            cluster_queues=recorded["clusterQueues"],
        )
        is None
    )


def test_one_shortfall_per_resource_and_flavor_kueue_counts_over_the_pod_sets() -> None:
    reason = decide(fixture("recorded-preempted-requeued")).reason
    assert "2 more" not in reason  # the master's part of the 4 the job needs
    assert reason.count("more nvidia.com/gpu needed") == 1


def test_requeues_are_counted_from_the_evictions_kueue_records() -> None:
    # A preempted Workload has no requeueState (that is waitForPodsReady's back-off): Kueue
    # v0.19.2 counts its evictions in status.schedulingStats.
    for name in ("recorded-preempted-requeued", "recorded-readmitted"):
        recorded = fixture(name)
        hold = queue_hold(recorded["job"], job_workload(recorded["job"], recorded["workloads"]))
        assert hold is not None
        assert hold.requeues == 1, name
    readmitted = fixture("recorded-readmitted")
    state = decide(readmitted)
    assert state.blocker is B.NOT_CREATED  # Kueue is done: the operator's turn
    assert (
        kueue_blocker(
            readmitted["job"],
            workload=job_workload(readmitted["job"], readmitted["workloads"]),
            workloads_read=True,
            local_queues=readmitted["localQueues"],
            cluster_queues=readmitted["clusterQueues"],
        )
        is None
    )


def test_a_job_without_a_queue_label_is_none_of_kueues_business() -> None:
    recorded = fixture("quota-in-use")
    job = json.loads(json.dumps(recorded["job"]))
    del job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert queue_hold(job, None) is None
    assert (
        kueue_blocker(job, workload=None, workloads_read=True, local_queues={}, cluster_queues={})
        is None
    )


def test_the_workload_is_found_by_the_jobs_uid_label() -> None:
    recorded = fixture("quota-in-use")
    other = json.loads(json.dumps(recorded["workloads"][0]))
    other["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] = "someone-else"
    assert job_workload(recorded["job"], [other]) is None
    going = json.loads(json.dumps(recorded["workloads"][0]))
    going["metadata"]["deletionTimestamp"] = "2026-12-01T10:01:00Z"
    assert job_workload(recorded["job"], [going]) is None
    assert job_workload(recorded["job"], [other, *recorded["workloads"]]) is not None


def test_the_queue_objects_decide_before_the_workload_exists() -> None:
    recorded = fixture("local-queue-missing")
    state = decide(recorded, ClusterFacts(local_queues={"team-a": None}, workloads=[]))
    assert (state.blocker, state.permanent) == (B.QUEUE_NOT_FOUND, True)


def test_without_facts_a_queued_job_waits_suspended_in_its_local_queue() -> None:
    state = admission_state(fixture("quota-in-use")["job"], pods=[])
    assert state.blocker is B.WAITING
    assert not state.permanent
    assert "suspended until Kueue admits it from LocalQueue ml/team-a" in state.reason


def test_a_job_kueue_makes_no_workload_for_waits_then_names_kueue() -> None:
    job = fixture("quota-in-use")["job"]
    created = 1_796_119_200.0  # 2026-12-01T10:00:00Z
    facts = ClusterFacts(local_queues=fixture("quota-in-use")["localQueues"], workloads=[])
    early = admission_state(job, pods=[], facts=facts, now=created + 5)
    assert early.blocker is B.WAITING
    assert early.recheck_in_s == pytest.approx(KUEUE_GRACE_S - 5)
    late = admission_state(job, pods=[], facts=facts, now=created + 60)
    assert late.blocker is B.OPERATOR_NOT_RUNNING
    assert not late.permanent
    assert "kubeflow.org/pytorchjob among its integrations.frameworks" in late.reason


def test_unreadable_workloads_are_said_and_the_verdict_waits() -> None:
    facts = ClusterFacts(unchecked=("Workloads (forbidden)",))
    state = admission_state(fixture("quota-in-use")["job"], pods=[], facts=facts)
    assert state.blocker is B.WAITING
    assert "could not check: Workloads (forbidden)" in state.reason


def test_the_wait_asks_for_the_queues_and_the_workloads_of_a_queued_job() -> None:
    job = fixture("quota-in-use")["job"]
    wanted = fact_request(job, pods=[])
    assert wanted.local_queues == ("team-a",)
    assert wanted.workloads == (job["metadata"]["uid"], "4711")
    assert fact_request(fixture("admitted")["job"] | {"metadata": {"name": "x"}}, pods=[]) == (
        fact_request({"metadata": {"name": "x"}}, pods=[])
    )


def test_a_requeued_job_is_queuing_with_its_reason_never_failed() -> None:
    tracker = PhaseTracker(None)
    keeper = ReasonKeeper()
    for name in ("quota-in-use", "preempted-requeued", "requeued-quota-in-use"):
        recorded = fixture(name)
        state = keeper.keep(decide(recorded))
        workload = job_workload(recorded["job"], recorded["workloads"])
        status = queued_status(job_status(recorded["job"]), queue_hold(recorded["job"], workload))
        update = tracker.observe(status, state)
        assert update is not None
        assert update.phase.value == "Queuing"
    assert [u.admission.blocker for u in tracker.history if u.admission] == [
        B.INSUFFICIENT_QUOTA,
        B.REQUEUED,
        B.INSUFFICIENT_QUOTA,
    ]


def test_suspension_is_read_where_each_kind_keeps_it() -> None:
    job = fixture("quota-in-use")["job"]
    assert suspended(job)
    assert not suspended(fixture("admitted")["job"])
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob"}
    assert suspended({**trainjob, "spec": {"suspend": True}})
    assert not suspended({**trainjob, "spec": {}})
