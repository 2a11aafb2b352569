"""Readiness decisions on statuses as the test bed's kwok stages and the real KServe write them."""

from __future__ import annotations

from typing import Any

import pytest

from kubedl_prefect.serving.readiness import Applied, ServingState, readiness


def isvc(generation: int = 2, rv: str = "20", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "fraud", "generation": generation, "resourceVersion": rv},
        "status": status,
    }


def conditions(**states: str | tuple[str, str, str]) -> list[dict[str, str]]:
    out = []
    for kind, state in states.items():
        if isinstance(state, tuple):
            out.append({"type": kind, "status": state[0], "reason": state[1], "message": state[2]})
        else:
            out.append({"type": kind, "status": state})
    return out


# What the test bed's testbed-isvc-ready stage writes (kubedl_prefect/testbed/stages).
KWOK_READY = isvc(
    observedGeneration=2,
    url="http://fraud-ml.example.com",
    modelStatus={
        "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"},
        "transitionStatus": "UpToDate",
    },
    conditions=conditions(IngressReady="True", PredictorReady="True", Ready="True"),
)
# What testbed-isvc-never-ready writes.
KWOK_NEVER_READY = isvc(
    modelStatus={
        "states": {"activeModelState": "", "targetModelState": "FailedToLoad"},
        "transitionStatus": "BlockedByFailedLoad",
        "lastFailureInfo": {"reason": "ModelLoadFailed", "message": "Revision failed"},
    },
    conditions=conditions(
        IngressReady="True",
        PredictorReady=("False", "RevisionFailed", "Revision failed to become ready"),
        Ready=("False", "RevisionFailed", "Revision failed to become ready"),
    ),
)
# What KServe v0.20 writes for a format no runtime supports (shared/notes/kserve-controller.md).
NO_RUNTIME = isvc(
    modelStatus={
        "transitionStatus": "InvalidSpec",
        "states": {"activeModelState": "", "targetModelState": "FailedToLoad"},
        "lastFailureInfo": {
            "reason": "NoSupportingRuntime",
            "message": "No runtime found to support specified framework/version",
        },
    },
    conditions=conditions(PredictorReady="Unknown", IngressReady="Unknown", Ready="Unknown"),
)
AFTER_APPLY = Applied(generation=2, resource_version="19", changed=True)


def test_a_ready_service_reports_its_url_and_runtime() -> None:
    ready = dict(
        KWOK_READY, status={**KWOK_READY["status"], "clusterServingRuntimeName": "kserve-mlserver"}
    )
    state = readiness(ready, [], AFTER_APPLY)
    assert state.state is ServingState.READY
    assert state.url == "http://fraud-ml.example.com"
    assert state.runtime == "kserve-mlserver"


@pytest.mark.parametrize(
    ("obj", "reason"),
    [(KWOK_NEVER_READY, "ModelLoadFailed"), (NO_RUNTIME, "NoSupportingRuntime")],
)
def test_a_model_that_will_not_load_fails_at_once(obj: dict[str, Any], reason: str) -> None:
    state = readiness(obj, [], AFTER_APPLY)
    assert state.state is ServingState.FAILED
    assert state.reason == reason


def test_a_ready_condition_contradicted_by_the_model_status_is_a_failure() -> None:
    contradicted = isvc(
        modelStatus=NO_RUNTIME["status"]["modelStatus"], conditions=conditions(Ready="True")
    )
    assert readiness(contradicted, [], AFTER_APPLY).state is ServingState.FAILED


def test_a_status_older_than_our_apply_is_not_trusted() -> None:
    # The informer still holds generation 1, or holds our own write and nothing after it.
    old = isvc(generation=1, rv="18", **KWOK_READY["status"])
    ours = isvc(generation=2, rv="19", **KWOK_READY["status"])
    for obj in (old, ours):
        state = readiness(obj, [], AFTER_APPLY)
        assert state.state is ServingState.PENDING
        assert state.reason == "Reconciling"
    # An apply that changed nothing trusts the status as it is.
    same = Applied(generation=2, resource_version="19", changed=False)
    assert readiness(ours, [], same).state is ServingState.READY


def test_a_rollout_in_progress_is_pending_with_its_reason() -> None:
    rolling = isvc(
        conditions=conditions(
            PredictorReady=(
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            ),
            Ready="False",
        )
    )
    state = readiness(rolling, [], AFTER_APPLY)
    assert state.state is ServingState.PENDING
    assert state.reason == "MinimumReplicasUnavailable"
    assert readiness(isvc(), [], AFTER_APPLY).reason == "NoStatus"


def pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "fraud-predictor-abc",
            "namespace": "ml",
            "labels": {"serving.kserve.io/inferenceservice": "fraud"},
        },
        "spec": {"containers": [{"name": "kserve-container"}]},
        "status": status,
    }


def waiting(reason: str, restarts: int = 0) -> dict[str, Any]:
    return pod(
        phase="Pending",
        containerStatuses=[
            {
                "name": "kserve-container",
                "restartCount": restarts,
                "state": {"waiting": {"reason": reason, "message": f"{reason} happened"}},
            }
        ],
    )


def test_pods_that_cannot_start_fail_the_rollout() -> None:
    rolling = isvc(conditions=conditions(PredictorReady="Unknown", Ready="Unknown"))
    pulled = readiness(rolling, [waiting("ImagePullBackOff")], AFTER_APPLY)
    assert pulled.state is ServingState.FAILED
    assert pulled.reason == "ImagePullError"
    crashing = readiness(rolling, [waiting("CrashLoopBackOff", restarts=3)], AFTER_APPLY)
    assert crashing.state is ServingState.FAILED
    assert "keeps crashing" in crashing.message
    starting = readiness(rolling, [waiting("ContainerCreating")], AFTER_APPLY)
    assert starting.state is ServingState.PENDING


def test_unschedulable_pods_are_the_reason_while_pending() -> None:
    unscheduled = pod(
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    state = readiness(isvc(conditions=[]), [unscheduled], AFTER_APPLY)
    assert state.state is ServingState.PENDING
    assert state.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in state.message


def test_a_recovered_model_is_ready_although_its_last_failure_stays_recorded() -> None:
    # kwok's Ready stage merges its modelStatus over the never-ready one: lastFailureInfo stays.
    recovered = isvc(
        modelStatus={
            "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"},
            "transitionStatus": "UpToDate",
            "lastFailureInfo": {"reason": "ModelLoadFailed", "message": "Revision failed"},
        },
        conditions=conditions(IngressReady="True", PredictorReady="True", Ready="True"),
    )
    assert readiness(recovered, [], AFTER_APPLY).state is ServingState.READY
