"""The canary: KServe's canaryStatuses in the readiness wait, and the documented promotion check."""

from __future__ import annotations

import copy
import math
from typing import Any

from kubedl_prefect.serving.canary import CanaryCheck, canary_state, canary_verdict
from kubedl_prefect.serving.readiness import ServingState, readiness
from tests.unit.serving.test_isvc_readiness import STANDARD_READY

CHECK = CanaryCheck(min_requests=4, max_error_rate=0.25, max_difference=0.1)
STABLE = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]


def with_canary(ready: bool | None) -> dict[str, Any]:
    """A Ready service whose spec has one canary; KServe's canaryStatuses as v0.20 writes them."""
    obj = copy.deepcopy(STANDARD_READY)
    obj["spec"] = {"predictor": {}, "canary": [{"predictor": {"name": "canary"}}]}
    if ready is not None:
        obj["status"]["canaryStatuses"] = [{"name": "canary", "ready": ready, "trafficPercent": 50}]
        obj["status"]["conditions"].append(
            {
                "type": "CanaryPredictorReady",
                "status": "True" if ready else "False",
                "reason": "AllCanariesReady" if ready else "CanariesNotReady",
            }
        )
    return obj


def test_ready_waits_for_the_canary_kserves_ready_leaves_out() -> None:
    unreported = readiness(with_canary(None), [])
    assert (unreported.state, unreported.reason) == (ServingState.PENDING, "CanaryNotReady")
    assert "not in status.canaryStatuses" in unreported.message
    waiting = readiness(with_canary(False), [])
    assert (waiting.state, waiting.message) == (
        ServingState.PENDING,
        "canary not ready, 50% of the traffic",
    )
    assert readiness(with_canary(True), []).state is ServingState.READY
    assert canary_state(with_canary(True), "other")[0] is False


def test_a_candidate_that_answers_like_the_stable_model_is_promoted() -> None:
    candidate = [[1.05, 2.0], [3.0, 4.02], [5.0, 6.0], None]  # one error of four: 25%
    verdict = canary_verdict(STABLE, candidate, CHECK)
    assert verdict.promote, verdict.reason
    assert (verdict.requests, verdict.errors) == (4, 1)
    assert verdict.largest_difference is not None
    assert math.isclose(verdict.largest_difference, 0.05, abs_tol=1e-9)


def test_a_candidate_is_rolled_back_on_each_documented_failure() -> None:
    cases: dict[str, list[Any]] = {
        "fewer than 4": STABLE[:3],
        "failed 2 of 4 requests (50%)": [None, None, [5.0, 6.0], [7.0, 8.0]],
        "answer 1 is not finite": [[1.0, 2.0], [math.nan, 4.0], [5.0, 6.0], [7.0, 8.0]],
        "differ from the stable model's by up to 1": [[2.0, 2.0], *STABLE[1:]],
        "answer 0 has 1 values": [[1.0], *STABLE[1:]],
    }
    for expected, candidate in cases.items():
        verdict = canary_verdict(STABLE, candidate, CHECK)
        assert not verdict.promote, expected
        assert expected in verdict.reason, verdict.reason
    # Without max_difference, answers are not compared with the stable model's.
    loose = CanaryCheck(min_requests=4)
    assert canary_verdict([], [[9.0], [9.0], [9.0], [9.0]], loose).promote


def predictor_pod(app: str, version: str, *, ready: bool) -> dict[str, Any]:
    """A pod of a predictor's Deployment, labelled as KServe labels it."""
    return {
        "metadata": {
            "name": f"{app}-{version}",
            "labels": {
                "app": app,
                "serving.kserve.io/inferenceservice": "fraud",
                "kubedl-prefect.io/model-version": version,
            },
        },
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_a_canarys_pods_are_not_the_stable_predictors_and_must_be_ready_themselves() -> None:
    version = {"kubedl-prefect.io/model-version": "2"}
    # Promoted: version 2 is the stable model now; the canary's pod of version 2 (ready, not
    # yet deleted) is no pod of the stable predictor, whose own pod is not Ready yet.
    promoted = dict(STANDARD_READY, spec={"predictor": {"labels": version}})
    canary_pod = predictor_pod("isvc.fraud-canary-predictor", "2", ready=True)
    stable_pod = predictor_pod("isvc.fraud-predictor", "2", ready=False)
    rolling = readiness(promoted, [canary_pod, stable_pod])
    assert (rolling.state, rolling.reason) == (ServingState.PENDING, "RollingOut")
    assert rolling.message.startswith("0 of 1 pods of the current predictor are Ready")
    # A canary KServe reports ready (an available replica: an earlier candidate's) whose pod
    # of the new candidate is not Ready yet.
    obj = with_canary(True)
    obj["spec"]["predictor"] = {"labels": {"kubedl-prefect.io/model-version": "1"}}
    obj["spec"]["canary"][0]["predictor"]["labels"] = version
    stable = predictor_pod("isvc.fraud-predictor", "1", ready=True)
    earlier = predictor_pod("isvc.fraud-canary-predictor", "3", ready=True)
    starting = predictor_pod("isvc.fraud-canary-predictor", "2", ready=False)
    waiting = readiness(obj, [stable, earlier, starting])
    assert (waiting.state, waiting.reason) == (ServingState.PENDING, "CanaryNotReady")
    assert waiting.message == "0 of 1 pods of canary are Ready"
    assert readiness(obj, [stable, earlier]).message == "0 of 0 pods of canary are Ready"
    up = predictor_pod("isvc.fraud-canary-predictor", "2", ready=True)
    assert readiness(obj, [stable, up]).state is ServingState.READY


def test_a_crash_loop_fails_the_spec_whose_pod_it_is_only() -> None:
    crashing = predictor_pod("isvc.fraud-canary-predictor", "2", ready=False)
    crashing["status"]["containerStatuses"] = [
        {
            "name": "kserve-container",
            "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        }
    ]
    stable = predictor_pod("isvc.fraud-predictor", "1", ready=True)
    # The spec with that canary fails...
    obj = with_canary(False)
    obj["spec"]["predictor"] = {"labels": {"kubedl-prefect.io/model-version": "1"}}
    obj["spec"]["canary"][0]["predictor"]["labels"] = {"kubedl-prefect.io/model-version": "2"}
    failed = readiness(obj, [stable, crashing])
    assert (failed.state, failed.reason) == (ServingState.FAILED, "CrashLoopBackOff")
    # ... and the rollback without it is Ready while the canary's pod is still going away.
    restored = copy.deepcopy(STANDARD_READY)
    restored["spec"] = {"predictor": {"labels": {"kubedl-prefect.io/model-version": "1"}}}
    assert readiness(restored, [stable, crashing]).state is ServingState.READY
