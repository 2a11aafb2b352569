"""Which spec a rollback restores (pure: computed from the live object and its record)."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubedl_prefect.serving.deploy import previous_spec
from kubedl_prefect.serving.record import ServingRecord
from kubedl_prefect.serving.render import render_inference_service
from kubedl_prefect.serving.spec import InferenceServiceSpec

V1 = render_inference_service(
    InferenceServiceSpec(name="f", namespace="ml", storage_uri="s3://b/1")
)
V2 = render_inference_service(
    InferenceServiceSpec(name="f", namespace="ml", storage_uri="s3://b/2")
)


def view(manifest: dict[str, Any]) -> str:
    metadata = manifest["metadata"]
    return json.dumps(
        {
            "annotations": metadata["annotations"],
            "labels": metadata["labels"],
            "spec": manifest["spec"],
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def live(ready: bool) -> dict[str, Any]:
    status = "True" if ready else "False"
    return {
        "metadata": {"name": "f", "uid": "u", "generation": 1},
        "status": {"conditions": [{"type": "Ready", "status": status}]},
    }


def recorded(applied: dict[str, Any], previous: str | None = None) -> ServingRecord:
    return ServingRecord(view(applied), previous)


def test_nothing_to_restore_for_a_new_service() -> None:
    assert previous_spec(None, ServingRecord(None, None), V1) is None


def test_a_change_over_a_ready_service_keeps_the_current_spec() -> None:
    assert previous_spec(live(ready=True), recorded(V1), V2) == view(V1)


def test_a_retry_of_the_same_deployment_keeps_what_the_first_try_recorded() -> None:
    assert previous_spec(live(ready=False), recorded(V2, view(V1)), V2) == view(V1)


def test_over_a_failed_service_the_last_good_spec_is_kept() -> None:
    v3 = render_inference_service(
        InferenceServiceSpec(name="f", namespace="ml", storage_uri="s3://b/3")
    )
    assert previous_spec(live(ready=False), recorded(V2, view(V1)), v3) == view(V1)


def test_a_ready_service_without_a_record_restores_itself_as_it_is_live() -> None:
    current = {
        **live(ready=True),
        **copy.deepcopy({"spec": V1["spec"], "metadata": V1["metadata"]}),
    }
    current["metadata"]["uid"] = "u"
    current["spec"]["predictor"]["model"]["resources"] = {}  # as KServe's defaulter writes it
    current["spec"]["predictor"]["timeout"] = 60  # a field the renderer never writes
    restored = previous_spec(current, ServingRecord(None, None), V2)
    assert restored is not None
    view = json.loads(restored)
    assert view["spec"]["predictor"]["model"]["storageUri"] == "s3://b/1"
    assert "timeout" not in view["spec"]["predictor"]
    assert view["labels"] == V1["metadata"]["labels"]


def test_a_failed_service_without_a_record_has_nothing_to_restore() -> None:
    assert previous_spec(live(ready=False), ServingRecord(None, None), V2) is None
