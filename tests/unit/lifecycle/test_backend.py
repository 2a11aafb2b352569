import inspect

import pytest

from kubedl_prefect.lifecycle.backend import JobRef, SyncBackend, TrainingBackend
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend

PUBLIC_ASYNC = [
    name
    for name, member in inspect.getmembers(TrainingBackend)
    if not name.startswith("_") and inspect.iscoroutinefunction(member)
]


def test_the_protocol_has_the_lifecycle_calls() -> None:
    assert set(PUBLIC_ASYNC) == {
        "submit",
        "wait_admitted",
        "wait_completed",
        "follow_logs",
        "cancel",
        "close",
    }


@pytest.mark.parametrize("name", PUBLIC_ASYNC)
def test_every_async_call_has_a_sync_twin_with_the_same_signature(name: str) -> None:
    twin = getattr(SyncBackend, name)
    assert not inspect.iscoroutinefunction(twin)
    assert inspect.signature(twin) == inspect.signature(getattr(TrainingBackend, name))


@pytest.mark.parametrize("name", PUBLIC_ASYNC)
def test_the_kubernetes_backend_accepts_every_protocol_argument(name: str) -> None:
    ours = inspect.signature(getattr(KubernetesBackend, name)).parameters
    protocol = inspect.signature(getattr(TrainingBackend, name)).parameters
    for parameter in protocol.values():
        assert parameter.name in ours
        assert ours[parameter.name].kind == parameter.kind
        assert ours[parameter.name].default == parameter.default


def test_job_ref_survives_a_round_trip_through_plain_data() -> None:
    ref = JobRef(
        backend="kubernetes",
        namespace="ml",
        name="mnist-1a2b3c-a2",
        uid="u",
        api_version="training.kubedl.io/v1alpha1",
        kind="PyTorchJob",
        key="nightly",
        attempt=2,
        spec_hash="h",
    )
    assert JobRef.from_dict(ref.to_dict()) == ref
