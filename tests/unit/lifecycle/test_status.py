from kubedl_prefect.lifecycle.status import Phase, ReplicaCounts, job_status


def condition(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def job(*conditions: dict, replica_statuses: dict | None = None) -> dict:
    return {
        "metadata": {"name": "j", "resourceVersion": "42"},
        "status": {"conditions": list(conditions), "replicaStatuses": replica_statuses or {}},
    }


def test_no_status_yet_is_created() -> None:
    status = job_status({"metadata": {"name": "j"}})
    assert status.phase is Phase.CREATED
    assert status.replicas == {}


def test_last_true_condition_gives_the_phase() -> None:
    status = job_status(
        job(
            condition("Created", reason="JobCreated"),
            condition("Running", reason="JobRunning", message="running"),
        )
    )
    assert status.phase is Phase.RUNNING
    assert (status.reason, status.message, status.resource_version) == (
        "JobRunning",
        "running",
        "42",
    )


def test_terminal_condition_wins_even_if_not_last() -> None:
    status = job_status(
        job(
            condition("Succeeded", reason="PyTorchJobSucceeded"),
            condition("Running", status="False"),
        )
    )
    assert status.phase is Phase.SUCCEEDED
    assert status.phase.terminal


def test_restarting_then_failed_kubeflow_reasons() -> None:
    status = job_status(
        job(
            condition("Created", reason="PyTorchJobCreated"),
            condition("Restarting", status="False"),
            condition("Failed", reason="PyTorchJobFailed", message="backoff limit"),
        )
    )
    assert status.phase is Phase.FAILED
    assert status.message == "backoff limit"


def test_replica_counts_are_lower_cased_by_role() -> None:
    status = job_status(
        job(
            condition("Running"),
            replica_statuses={"Master": {"active": 1}, "Worker": {"active": 1, "failed": 1}},
        )
    )
    assert status.replicas == {
        "master": ReplicaCounts(active=1),
        "worker": ReplicaCounts(active=1, failed=1),
    }
