"""Readiness decisions on statuses as the real KServe controller (v0.20) writes them."""

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


# What KServe v0.20 writes in Standard mode once the predictor's Deployment is Available.
STANDARD_READY = isvc(
    observedGeneration=2,
    url="http://fraud-ml.example.com",
    modelStatus={
        "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"},
        "transitionStatus": "UpToDate",
    },
    conditions=conditions(IngressReady="True", PredictorReady="True", Ready="True"),
)
# A Knative-mode revision that failed (what KServe writes from the Knative Service).
REVISION_FAILED = isvc(
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
        STANDARD_READY,
        status={**STANDARD_READY["status"], "clusterServingRuntimeName": "kserve-mlserver"},
    )
    state = readiness(ready, [], AFTER_APPLY)
    assert state.state is ServingState.READY
    assert state.url == "http://fraud-ml.example.com"
    assert state.runtime == "kserve-mlserver"


@pytest.mark.parametrize(
    ("obj", "reason"),
    [(REVISION_FAILED, "ModelLoadFailed"), (NO_RUNTIME, "NoSupportingRuntime")],
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
    old = isvc(generation=1, rv="18", **STANDARD_READY["status"])
    ours = isvc(generation=2, rv="19", **STANDARD_READY["status"])
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
    # KServe keeps lastFailureInfo after the model loaded again.
    recovered = isvc(
        modelStatus={
            "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"},
            "transitionStatus": "UpToDate",
            "lastFailureInfo": {"reason": "ModelLoadFailed", "message": "Revision failed"},
        },
        conditions=conditions(IngressReady="True", PredictorReady="True", Ready="True"),
    )
    assert readiness(recovered, [], AFTER_APPLY).state is ServingState.READY


def test_ready_needs_the_model_status_to_agree() -> None:
    ready = conditions(IngressReady="True", PredictorReady="True", Ready="True")
    loading = isvc(
        modelStatus={
            "states": {"activeModelState": "", "targetModelState": "Pending"},
            "transitionStatus": "InProgress",
        },
        conditions=ready,
    )
    state = readiness(loading, [], AFTER_APPLY)
    assert state.state is ServingState.PENDING
    assert state.reason == "ModelPending"
    in_progress = isvc(modelStatus={"transitionStatus": "InProgress"}, conditions=ready)
    assert readiness(in_progress, [], AFTER_APPLY).reason == "InProgress"
    # A controller that reports no model status at all is trusted on its Ready condition.
    assert readiness(isvc(conditions=ready), [], AFTER_APPLY).state is ServingState.READY


def labelled(version: str, *, ready: bool, deleting: bool = False) -> dict[str, Any]:
    made = pod(phase="Running", conditions=[{"type": "Ready", "status": str(ready)}])
    made["metadata"]["labels"]["kubedl-prefect.io/model-version"] = version
    made["metadata"]["name"] = f"fraud-predictor-{version}-{ready}"
    if deleting:
        made["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    return made


def test_ready_waits_for_the_pods_of_the_current_predictor() -> None:
    # Standard mode: Ready stays True from the old ReplicaSet while the new one rolls out.
    service = dict(
        STANDARD_READY, spec={"predictor": {"labels": {"kubedl-prefect.io/model-version": "2"}}}
    )
    old = labelled("1", ready=True)
    rolling = readiness(service, [old, labelled("2", ready=False)], AFTER_APPLY)
    assert rolling.state is ServingState.PENDING
    assert rolling.reason == "RollingOut"
    assert rolling.message == "0 of 1 pods of the current predictor are Ready"
    # Not a single pod of the new spec yet: the rollout has not started.
    assert readiness(service, [old], AFTER_APPLY).reason == "RollingOut"
    done = readiness(
        service, [labelled("1", ready=False, deleting=True), labelled("2", ready=True)], AFTER_APPLY
    )
    assert done.state is ServingState.READY
    # Pods not looked at: the conditions decide.
    assert readiness(service, [], AFTER_APPLY).state is ServingState.READY
