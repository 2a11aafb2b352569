"""Which spec a rollback restores (pure: computed from the live object before applying)."""

from __future__ import annotations

import json
from typing import Any

from kubedl_prefect.serving.deploy import ANNOTATION_APPLIED, ANNOTATION_PREVIOUS, previous_spec
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


def live(applied: dict[str, Any], *, ready: bool, previous: str | None = None) -> dict[str, Any]:
    annotations = {ANNOTATION_APPLIED: view(applied)}
    if previous is not None:
        annotations[ANNOTATION_PREVIOUS] = previous
    status = "True" if ready else "False"
    return {
        "metadata": {"name": "f", "annotations": annotations, "generation": 1},
        "status": {"conditions": [{"type": "Ready", "status": status}]},
    }


def test_nothing_to_restore_for_a_new_service() -> None:
    assert previous_spec(None, V1) is None


def test_a_change_over_a_ready_service_keeps_the_current_spec() -> None:
    assert previous_spec(live(V1, ready=True), V2) == view(V1)


def test_a_retry_of_the_same_deployment_keeps_what_the_first_try_recorded() -> None:
    current = live(V2, ready=False, previous=view(V1))
    assert previous_spec(current, V2) == view(V1)


def test_over_a_failed_service_the_last_good_spec_is_kept() -> None:
    v3 = render_inference_service(
        InferenceServiceSpec(name="f", namespace="ml", storage_uri="s3://b/3")
    )
    assert previous_spec(live(V2, ready=False, previous=view(V1)), v3) == view(V1)
