from __future__ import annotations

from types import MappingProxyType

from kubedl_prefect.registry.events import PROMOTED, REGISTERED, ModelVersionEvent
from kubedl_prefect.serving.events import APPLIED, READY, InferenceServiceEvent


def test_inference_service_event_ids_follow_uid_event_and_resource_version() -> None:
    def event(name: str, rv: str, uid: str = "u-1") -> InferenceServiceEvent:
        return InferenceServiceEvent(name, "ml", "fraud", uid, rv, MappingProxyType({"x": rv}))

    assert event(APPLIED, "10").id == event(APPLIED, "10").id
    assert (
        len(
            {
                event(APPLIED, "10").id,
                event(APPLIED, "11").id,
                event(READY, "10").id,
                event(APPLIED, "10", uid="u-2").id,
            }
        )
        == 4
    )
    assert event(READY, "3").resource_id == "kubedl.inference-service.ml.fraud"


def test_model_version_event_ids_follow_the_version_and_payload() -> None:
    first = ModelVersionEvent(REGISTERED, "fraud", "3", MappingProxyType({"created": "true"}))
    retried = ModelVersionEvent(REGISTERED, "fraud", "3", MappingProxyType({"created": "true"}))
    promoted = ModelVersionEvent(PROMOTED, "fraud", "3")
    assert first.id == retried.id
    assert first.id != promoted.id
    assert promoted.resource_id == "kubedl.model-version.fraud.3"


def test_the_records_and_the_prefect_events_name_resources_alike() -> None:
    # One id per resource, under our own prefix, whichever layer builds the event.
    import doctest

    import kubedl_prefect.registry.events as registry_events
    import kubedl_prefect.serving.events as serving_events

    for module in (registry_events, serving_events):
        result = doctest.testmod(module, raise_on_error=False)
        assert result.attempted > 0
        assert result.failed == 0
