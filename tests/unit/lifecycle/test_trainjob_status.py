"""A Kubeflow Trainer v2 TrainJob's phase, counts, progress and objects, read the pure way.

The objects are shaped as Trainer v2.3.0 and JobSet v0.12.0 write them: conditions Suspended,
Complete and Failed only (the last two copied from the JobSet, with its reason and message),
``jobsStatus`` per replicated Job, ``trainerStatus`` from the status server.
"""

from __future__ import annotations

from typing import Any

from kubedl_prefect.kube.resources import VOLCANO_PODGROUPS
from kubedl_prefect.lifecycle.diagnosis import replica_name
from kubedl_prefect.lifecycle.kubernetes.dialects import COSCHEDULING_PODGROUPS, JOBSETS, JobObjects
from kubedl_prefect.lifecycle.replicas import replica_states
from kubedl_prefect.lifecycle.status import (
    Phase,
    ReplicaCounts,
    TrainerProgress,
    job_status,
    trainer_progress,
)
from kubedl_prefect.prefect.artifacts import parse_progress
from kubedl_prefect.spec import Dialect


def trainjob(*conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "x", "resourceVersion": "7"},
        "status": {"conditions": list(conditions), **status},
    }


def condition(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-08-06T10:00:00Z",
    }


def jobs(name: str = "node", **counts: int) -> dict[str, Any]:
    base = {"active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}
    return {"name": name, **base, **counts}


def test_a_new_trainjob_is_created() -> None:
    status = job_status(trainjob())
    assert (status.phase, status.reason, status.replicas) == (Phase.CREATED, "", {})
    assert status.resource_version == "7"


def test_suspended_is_queuing_never_failed() -> None:
    status = job_status(
        trainjob(
            condition("Suspended", reason="Suspended", message="TrainJob is suspended"),
            jobsStatus=[jobs(suspended=1)],
        )
    )
    assert status.phase is Phase.QUEUING
    assert not status.phase.terminal
    assert (status.reason, status.message) == ("Suspended", "TrainJob is suspended")


def test_resumed_runs_once_a_job_is_ready() -> None:
    resumed = condition("Suspended", status="False", reason="Resumed", message="resumed")
    waiting = job_status(trainjob(resumed, jobsStatus=[jobs()]))
    assert (waiting.phase, waiting.reason) == (Phase.CREATED, "Resumed")
    running = job_status(trainjob(resumed, jobsStatus=[jobs(active=1, ready=1)]))
    assert running.phase is Phase.RUNNING
    assert running.replicas == {"node": ReplicaCounts(active=1)}


def test_an_active_job_of_pending_pods_is_not_running() -> None:
    # JobSet counts a Job active while any pod is unfinished, Pending ones too: an oversize
    # gang that Volcano holds has active Jobs and no pod running (it once read as Running, so
    # the admission wait ended at once).
    held = job_status(trainjob(jobsStatus=[jobs(active=1)]))
    assert held.phase is Phase.CREATED
    assert held.replicas == {"node": ReplicaCounts(active=1)}
    mpi = job_status(trainjob(jobsStatus=[jobs("launcher", succeeded=1), jobs("node", active=1)]))
    assert mpi.phase is Phase.RUNNING


def test_complete_carries_the_jobsets_reason_and_message() -> None:
    status = job_status(
        trainjob(
            condition(
                "Complete", reason="AllJobsCompleted", message="jobset completed successfully"
            ),
            jobsStatus=[jobs(succeeded=1)],
        )
    )
    assert status.phase is Phase.SUCCEEDED
    assert (status.reason, status.message) == ("AllJobsCompleted", "jobset completed successfully")
    assert status.completion_time == "2026-08-06T10:00:00Z"


def test_failed_wins_and_carries_the_reason() -> None:
    status = job_status(
        trainjob(
            condition("Suspended", status="False", reason="Resumed"),
            condition(
                "Failed",
                reason="FailedJobs",
                message="jobset failed due to one or more job failures",
            ),
            jobsStatus=[jobs("launcher", failed=1), jobs("node", active=2)],
        )
    )
    assert status.phase is Phase.FAILED
    assert status.reason == "FailedJobs"
    assert status.replicas == {
        "launcher": ReplicaCounts(failed=1),
        "node": ReplicaCounts(active=2),
    }


def test_deadline_exceeded_is_a_failure() -> None:
    status = job_status(
        trainjob(condition("Failed", reason="DeadlineExceeded", message="exceeded its deadline"))
    )
    assert (status.phase, status.reason) == (Phase.FAILED, "DeadlineExceeded")


def test_garbage_counts_are_zero() -> None:
    status = job_status(trainjob(jobsStatus=[{"name": "node", "active": -3, "ready": True}, 5]))
    assert status.replicas == {"node": ReplicaCounts()}
    assert status.phase is Phase.CREATED


# --- trainerStatus ---------------------------------------------------------------------------


def test_trainer_status_is_parsed() -> None:
    job = trainjob(
        trainerStatus={
            "progressPercentage": 40,
            "estimatedRemainingSeconds": 120,
            "metrics": [{"name": "loss", "value": "0.25"}, {"name": "acc", "value": "0.9"}],
            "lastUpdatedTime": "2026-08-06T10:01:00Z",
        }
    )
    progress = trainer_progress(job)
    assert progress == TrainerProgress(
        percent=40,
        remaining_s=120,
        metrics={"loss": "0.25", "acc": "0.9"},
        updated="2026-08-06T10:01:00Z",
    )
    assert job_status(job).trainer == progress


def test_trainer_status_feeds_the_progress_lines() -> None:
    line = TrainerProgress(percent=40, remaining_s=120, metrics={"loss": "0.25"}).progress_line()
    assert line is not None
    parsed = parse_progress(line)
    assert parsed is not None
    assert parsed.percent == 40.0
    assert TrainerProgress(metrics={"loss": "1"}).progress_line() is None


def test_out_of_range_trainer_values_are_dropped() -> None:
    progress = trainer_progress(
        trainjob(
            trainerStatus={
                "progressPercentage": 140,
                "estimatedRemainingSeconds": -1,
                "metrics": [{"name": "loss"}, {"value": "1"}, "x", {"name": "ok", "value": "2"}],
            }
        )
    )
    assert progress == TrainerProgress(percent=None, remaining_s=None, metrics={"ok": "2"})


def test_no_trainer_status() -> None:
    assert trainer_progress(trainjob()) is None
    assert job_status(trainjob()).trainer is None
    assert trainer_progress({"status": {"trainerStatus": "nope"}}) is None


# --- the objects of a TrainJob -----------------------------------------------------------------


def pod(name: str, replicated_job: str, index: str, jobset: str = "x") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": jobset,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
                "batch.kubernetes.io/job-completion-index": index,
            },
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }


def test_trainjob_pods_are_found_by_their_jobset_label() -> None:
    select = JobObjects(Dialect.TRAINER, "x")
    assert select.pod_label == ("jobset.sigs.k8s.io/jobset-name", "x")
    assert select.is_pod(pod("x-node-0-0-abcde", "node", "0"))
    assert not select.is_pod(pod("y-node-0-0-abcde", "node", "0", jobset="y"))
    child = {"metadata": {"name": "x-node-0", "labels": {"jobset.sigs.k8s.io/jobset-name": "x"}}}
    assert select.is_child_job(child)
    assert not JobObjects(Dialect.KUBEFLOW, "x").is_child_job(child)


def test_trainjob_podgroup_is_named_like_the_job() -> None:
    select = JobObjects(Dialect.TRAINER, "x")
    assert select.is_podgroup({"metadata": {"name": "x"}})
    assert not select.is_podgroup({"metadata": {"name": "x-node"}})
    assert select.is_event({"involvedObject": {"name": "x-node-0-1-abcde"}})


def test_cancellation_deletes_the_podgroup_trainer_leaves() -> None:
    # Volcano's, or scheduler-plugins' under a coscheduling runtime.
    assert JobObjects(Dialect.TRAINER, "x").leftovers() == (
        (JOBSETS, "x"),
        (VOLCANO_PODGROUPS, "x"),
        (COSCHEDULING_PODGROUPS, "x"),
    )
    assert JobObjects(Dialect.KUBEFLOW, "x").leftovers() == ()


def test_trainjob_replicas_are_named_by_replicated_job_and_index() -> None:
    pods = [pod("x-node-0-1-b", "node", "1"), pod("x-launcher-0-0-a", "launcher", "0")]
    assert replica_name(pods[0]) == "node-1"
    states = replica_states(pods)
    assert [(s.replica, s.role, s.index) for s in states] == [
        ("launcher-0", "launcher", 0),
        ("node-1", "node", 1),
    ]


def test_a_trainjob_no_operator_acts_on_names_trainer() -> None:
    from kubedl_prefect.lifecycle.kubernetes.operators import operator_blocker

    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "x", "namespace": "ml", "creationTimestamp": "2026-08-06T10:00:00Z"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    blocker = operator_blocker(job, [], [], [], now=1_900_000_000.0, grace_s=30)
    assert blocker is not None
    assert "Kubeflow Trainer" in blocker.message
    assert "jobset" in blocker.hint


def test_what_a_trainjob_asks_of_the_cluster() -> None:
    from kubedl_prefect.lifecycle.kubernetes.demand import job_queues, job_total, placements
    from kubedl_prefect.spec import parse_spec, render

    spec = parse_spec(
        {
            "name": "x",
            "image": "i",
            "replicas": {"worker": 3},
            "resources": {"cpu": "2", "gpus": 1},
            "nodeSelector": {"pool": "gpu"},
            "gang": {"queue": "research"},
        }
    )
    job = render(spec, "trainer")
    (node,) = placements(job)
    assert (node.role, node.count, dict(node.node_selector)) == ("node", 3, {"pool": "gpu"})
    assert job_total(job, "requests.nvidia.com/gpu") == 3
    assert job_queues(job, []) == ["research"]
    mpi = render(
        parse_spec(
            {
                "name": "m",
                "image": "i",
                "framework": "mpi",
                "replicas": {"launcher": 1, "worker": 2},
            }
        ),
        "trainer",
    )
    assert [(p.role, p.count) for p in placements(mpi)] == [("launcher", 1), ("node", 2)]


def test_reported_progress_is_news_to_the_phase_tracker() -> None:
    from kubedl_prefect.lifecycle.admission import AdmissionState
    from kubedl_prefect.lifecycle.waiting import PhaseTracker

    seen: list[int | None] = []
    tracker = PhaseTracker(
        lambda update: seen.append(update.status.trainer.percent if update.status.trainer else None)
    )
    admitted = AdmissionState(admitted=True, scheduled=2, pods=2, expected=2)
    for percent in (10, 10, 20):
        job = trainjob(
            jobsStatus=[jobs(active=1)],
            trainerStatus={"progressPercentage": percent, "lastUpdatedTime": "t"},
        )
        tracker.observe(job_status(job), admitted)
    assert seen == [10, 20]


def test_a_missing_trainjob_crd_names_the_other_api() -> None:
    from kubedl_prefect.kube.resources import ResourceKind
    from kubedl_prefect.lifecycle.kubernetes.operators import operator_not_installed

    kind = ResourceKind("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
    blocker = operator_not_installed(
        kind, "trainer", "https://k", [("kubeflow", "kubeflow.org/v1")]
    )
    assert "Kubeflow Trainer v2" in blocker.hint
    assert blocker.hint.endswith('dialect="kubeflow": the cluster serves kubeflow.org/v1')
