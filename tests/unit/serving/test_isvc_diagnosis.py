"""Which container's log tells why a predictor is not Ready, and the model server's error in it."""

from __future__ import annotations

from typing import Any

from kubedl_prefect.serving.diagnosis import LogSource, server_error, telling_container

#: What MLServer 1.7 logs for a model it cannot load (then it exits with code 0).
MLSERVER_LOG = [
    "INFO:     Uvicorn running on http://0.0.0.0:8080 (Press CTRL+C to quit)",
    "2026-12-03 15:54:23,943 [mlserver] ERROR - Some of the models failed to load during startup!",
    "Traceback (most recent call last):",
    '  File "/x/mlserver_mlflow/runtime.py", line 185, in load',
    "    raise MlflowException(",
    'mlflow.exceptions.MlflowException: Model does not have the "python_function" flavor',
    "2026-12-03 15:54:24,146 [mlserver.grpc] INFO - gRPC server shutdown complete",
]


def pod(
    name: str,
    *,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"containerStatuses": containers, "initContainerStatuses": init or []},
    }


RUNNING: dict[str, Any] = {"state": {"running": {}}}


def test_the_exception_line_is_the_servers_own_error() -> None:
    assert server_error(MLSERVER_LOG) == (
        'mlflow.exceptions.MlflowException: Model does not have the "python_function" flavor'
    )
    # Without a traceback, the last logged ERROR.
    assert server_error(MLSERVER_LOG[:2]) == MLSERVER_LOG[1]
    assert server_error(MLSERVER_LOG[:1]) is None
    assert len(server_error(["ValueError: " + "x" * 1000]) or "") == 400


def test_a_restarted_server_is_read_from_its_previous_instance() -> None:
    crashing = {
        "name": "kserve-container",
        "ready": False,
        "restartCount": 2,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    }
    assert telling_container([pod("p", containers=[crashing])]) == LogSource(
        "p", "kserve-container", previous=True
    )
    loading = {"name": "kserve-container", "ready": False, "restartCount": 0, **RUNNING}
    assert telling_container([pod("p", containers=[loading])]) == LogSource(
        "p", "kserve-container", previous=False
    )


def test_a_failed_storage_initializer_comes_first_and_ready_or_unstarted_pods_say_nothing() -> None:
    failed_init = {
        "name": "storage-initializer",
        "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
    }
    waiting = {"name": "kserve-container", "ready": False, "state": {"waiting": {"reason": "X"}}}
    assert telling_container([pod("p", containers=[waiting], init=[failed_init])]) == LogSource(
        "p", "storage-initializer", previous=False
    )
    # Never started (pending, pulling): no log to read.
    assert telling_container([pod("p", containers=[waiting])]) is None
    ready = {"name": "kserve-container", "ready": True, **RUNNING}
    assert telling_container([pod("p", containers=[ready])]) is None


def test_only_pods_of_the_applied_spec_count() -> None:
    loading = {"name": "kserve-container", "ready": False, **RUNNING}
    old = pod("old", containers=[loading], labels={"kubedl-prefect.io/model-version": "1"})
    new = pod("new", containers=[loading], labels={"kubedl-prefect.io/model-version": "2"})
    found = telling_container([old, new], {"kubedl-prefect.io/model-version": "2"})
    assert found is not None
    assert found.pod == "new"
