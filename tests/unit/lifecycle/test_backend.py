import inspect
import json

import pytest

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.lifecycle.backend import (
    JOB_REF_SCHEMA,
    JobRef,
    SyncTrainingBackend,
    TrainingBackend,
)
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend

PUBLIC_ASYNC = [
    name
    for name, member in inspect.getmembers(TrainingBackend)
    if not name.startswith("_") and inspect.iscoroutinefunction(member)
]


def test_the_protocol_has_the_lifecycle_calls() -> None:
    assert set(PUBLIC_ASYNC) == {
        "submit",
        "attach",
        "history",
        "wait_admitted",
        "wait_completed",
        "follow_logs",
        "cancel",
        "close",
    }


@pytest.mark.parametrize("name", PUBLIC_ASYNC)
def test_every_async_call_has_a_sync_twin_with_the_same_signature(name: str) -> None:
    twin = getattr(SyncTrainingBackend, name)
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


def make_ref(**changes: object) -> JobRef:
    data: dict[str, object] = {
        "backend": "kubernetes",
        "cluster": "https://127.0.0.1:6443",
        "dialect": "kubedl",
        "namespace": "ml",
        "name": "mnist-x7k2m9q4ab3c-a2",
        "uid": "u",
        "api_version": "training.kubedl.io/v1alpha1",
        "kind": "PyTorchJob",
        "key": "nightly",
        "attempt": 2,
        "spec_hash": "h",
    }
    data.update(changes)
    return JobRef(**data)  # type: ignore[arg-type]


def test_job_ref_survives_a_round_trip_through_plain_data_and_json() -> None:
    ref = make_ref()
    assert JobRef.from_dict(ref.to_dict()) == ref
    assert JobRef.from_json(ref.to_json()) == ref
    assert json.loads(ref.to_json())["schemaVersion"] == JOB_REF_SCHEMA
    assert set(ref.to_dict()) >= {"cluster", "dialect", "namespace", "uid", "specHash"}


def test_a_version_1_reference_is_read_with_its_dialect_inferred() -> None:
    old = {
        "backend": "kubernetes",
        "namespace": "ml",
        "name": "mnist-1a2b3c-a1",
        "uid": "u",
        "api_version": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "key": "k",
        "attempt": 1,
        "spec_hash": "h",
    }
    ref = JobRef.from_dict(old)
    assert ref.dialect == "kubeflow"
    assert ref.cluster == ""
    assert ref.schema_version == JOB_REF_SCHEMA


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({**make_ref().to_dict(), "schemaVersion": JOB_REF_SCHEMA + 1}, "layout version"),
        ({"backend": "kubernetes"}, "lacks"),
        ([1, 2], "mapping"),
    ],
)
def test_a_malformed_reference_is_refused_with_a_hint(data: object, match: str) -> None:
    with pytest.raises(KubeDLPrefectError, match=match) as caught:
        JobRef.from_dict(data)  # type: ignore[arg-type]
    assert caught.value.hint


def test_a_reference_holds_no_credential() -> None:
    text = make_ref().to_json()
    for word in ("token", "password", "certificate", "kubeconfig"):
        assert word not in text.lower()
