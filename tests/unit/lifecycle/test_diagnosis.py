import pytest

from kubedl_prefect.lifecycle.diagnosis import FailureCategory, diagnose, replica_name


def pod(
    role: str = "Worker",
    index: int = 0,
    *,
    terminated: dict | None = None,
    waiting: dict | None = None,
    reason: str | None = None,
    conditions: list[dict] | None = None,
    kubeflow: bool = False,
) -> dict:
    prefix = "training.kubeflow.org/" if kubeflow else ""
    state: dict = {}
    if terminated is not None:
        state["terminated"] = terminated
    if waiting is not None:
        state["waiting"] = waiting
    status: dict = {"containerStatuses": [{"name": "pytorch", "state": state}]}
    if reason:
        status["reason"] = reason
        status["message"] = f"pod {reason}"
    if conditions:
        status["conditions"] = conditions
    return {
        "metadata": {
            "name": f"j-{role.lower()}-{index}",
            "labels": {f"{prefix}replica-type": role.lower(), f"{prefix}replica-index": str(index)},
        },
        "status": status,
    }


JOB = {"metadata": {"name": "j"}, "status": {}}


def test_replica_name_from_either_operator() -> None:
    assert replica_name(pod("Master", 0)) == "master-0"
    assert replica_name(pod("Worker", 3, kubeflow=True)) == "worker-3"
    assert replica_name({"metadata": {"name": "plain"}}) == "plain"


@pytest.mark.parametrize(
    ("waiting_reason", "category"),
    [
        ("ErrImagePull", FailureCategory.IMAGE_PULL),
        ("ImagePullBackOff", FailureCategory.IMAGE_PULL),
        ("InvalidImageName", FailureCategory.INVALID_IMAGE),
        ("CreateContainerConfigError", FailureCategory.CONTAINER_CONFIG),
    ],
)
def test_configuration_errors_are_permanent(waiting_reason: str, category: FailureCategory) -> None:
    found = diagnose(JOB, pods=[pod(waiting={"reason": waiting_reason, "message": "boom"})])
    assert found.category is category
    assert not found.retryable
    assert found.replica == "worker-0"


@pytest.mark.parametrize(
    ("code", "reason", "category", "retryable"),
    [
        (137, "Error", FailureCategory.KILLED, True),
        (143, "Error", FailureCategory.KILLED, True),
        (137, "OOMKilled", FailureCategory.OUT_OF_MEMORY, False),
        (127, "Error", FailureCategory.COMMAND_NOT_RUNNABLE, False),
        (1, "Error", FailureCategory.USER_CODE, False),
    ],
)
def test_exit_codes(code: int, reason: str, category: FailureCategory, retryable: bool) -> None:
    found = diagnose(JOB, pods=[pod(terminated={"exitCode": code, "reason": reason})])
    assert (found.category, found.retryable, found.exit_code) == (category, retryable, code)


def test_eviction_explains_the_other_replicas_exit() -> None:
    found = diagnose(
        JOB,
        pods=[
            pod("Master", terminated={"exitCode": 1, "reason": "Error"}),
            pod("Worker", 1, reason="Evicted"),
        ],
    )
    assert found.category is FailureCategory.EVICTED
    assert found.retryable
    assert found.replica == "worker-1"


def test_image_error_wins_over_eviction() -> None:
    found = diagnose(
        JOB,
        pods=[
            pod("Worker", 1, reason="Evicted"),
            pod("Master", waiting={"reason": "ErrImagePull"}),
        ],
    )
    assert found.category is FailureCategory.IMAGE_PULL


@pytest.mark.parametrize(
    ("cause", "category"),
    [
        ("PreemptionByScheduler", FailureCategory.PREEMPTED),
        ("DeletionByTaintManager", FailureCategory.NODE_LOST),
        ("EvictionByEvictionAPI", FailureCategory.EVICTED),
    ],
)
def test_disruption_conditions(cause: str, category: FailureCategory) -> None:
    condition = {"type": "DisruptionTarget", "status": "True", "reason": cause, "message": "m"}
    found = diagnose(JOB, pods=[pod(conditions=[condition])])
    assert found.category is category
    assert found.retryable


def test_nccl_timeout_in_logs_is_retryable() -> None:
    found = diagnose(
        JOB,
        pods=[pod(terminated={"exitCode": 1, "reason": "Error"})],
        log_tails={
            "worker-0": ["step 10", "[Rank 1] Watchdog caught collective operation timeout"]
        },
    )
    assert found.category is FailureCategory.NCCL_TIMEOUT
    assert found.retryable
    assert found.replica == "worker-0"


def test_sigkill_explains_user_code_errors_of_peers() -> None:
    found = diagnose(
        JOB,
        pods=[
            pod("Master", terminated={"exitCode": 1, "reason": "Error"}),
            pod("Worker", terminated={"exitCode": 137, "reason": "Error"}),
        ],
    )
    assert found.category is FailureCategory.KILLED


def test_deadline_from_job_condition() -> None:
    job = {
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                }
            ]
        }
    }
    found = diagnose(job, pods=[])
    assert found.category is FailureCategory.DEADLINE_EXCEEDED
    assert "deadline" in found.summary()


def test_nothing_found_is_unknown_and_not_retryable() -> None:
    found = diagnose(JOB, pods=[pod(terminated={"exitCode": 0, "reason": "Completed"})])
    assert found.category is FailureCategory.UNKNOWN
    assert not found.retryable
