"""Job references are untrusted input: checked where they are made, honoured where they act.

A reference comes back from a Prefect result, a saved file, a CLI argument. Its namespace, name,
uid and kind are checked when it is built (a name like ``..`` once turned a ConfigMap patch into
``PATCH /api/v1/namespaces/ml/``); cancelling by reference deletes only the job of that uid; and
run records live only in ConfigMaps that carry our label. Against the in-memory API server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubedl_prefect.errors import (
    AdoptionRefusedError,
    ConflictError,
    KubeDLPrefectError,
)
from kubedl_prefect.kube.resources import CONFIG_MAPS, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import SessionPool
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.records import record_name
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from tests.support.fakeapi import FakeKubeAPI

PYTORCHJOBS = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")


def ref_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schemaVersion": 2,
        "backend": "kubernetes",
        "cluster": "https://127.0.0.1:6443",
        "dialect": "kubedl",
        "namespace": "ml",
        "name": "mnist-x7k2m9q4ab3c-a1",
        "uid": "5f0c2b9e-51a4-4f58-9a43-0d6a4c1b2e77",
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "PyTorchJob",
        "key": "nightly",
        "attempt": 1,
        "specHash": "ab12",
    }
    data.update(changes)
    return data


def spec() -> TrainingJobSpec:
    return parse_spec(
        {
            "name": "mnist",
            "image": "ghcr.io/example/mnist:1.0",
            "replicas": {"master": 1, "worker": 1},
        }
    )


@pytest.fixture
async def pool() -> AsyncIterator[SessionPool]:
    made = SessionPool()
    yield made
    await KubeRuntime.get().run(made.close())


@pytest.fixture
def backend(fake_api: FakeKubeAPI, pool: SessionPool) -> KubernetesBackend:
    return KubernetesBackend(namespace="ml", credentials=fake_api.credentials, pool=pool)


# -- checked where they are made ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("namespace", "..", "namespace"),
        ("namespace", "", "namespace"),
        ("namespace", "ml/other", "namespace"),
        ("namespace", "ML", "namespace"),
        ("namespace", "ml\n", "namespace"),
        ("namespace", "n" * 64, "namespace"),
        ("name", "..", "name"),
        ("name", ".", "name"),
        ("name", "../../victim", "name"),
        ("name", "", "name"),
        ("name", "mnist-a1\n", "name"),
        ("name", "mnist/../../secrets", "name"),
        ("name", "m" * 254, "name"),
        ("uid", "../x", "uid"),
        ("uid", "a b", "uid"),
        ("uid", "u\n", "uid"),
        ("apiVersion", "../../api/v1", "apiVersion"),
        ("apiVersion", "training.kubedl.io/v1/../..", "apiVersion"),
        ("kind", "PyTorchJob/..", "kind"),
        ("kind", "", "kind"),
        ("attempt", 0, "attempt"),
        ("attempt", "first", "attempt"),
        ("attempt", None, "attempt"),
        ("schemaVersion", "two", "schemaVersion"),
        ("backend", "", "backend"),
    ],
)
def test_a_reference_with_a_field_kubernetes_would_never_give_is_refused(
    field: str, value: Any, words: str
) -> None:
    with pytest.raises(KubeDLPrefectError, match=words) as caught:
        JobRef.from_dict(ref_data(**{field: value}))
    assert caught.value.hint
    with pytest.raises(KubeDLPrefectError, match=words):
        JobRef.from_json(json.dumps(ref_data(**{field: value})))


def test_a_refused_value_is_shown_shortened() -> None:
    with pytest.raises(KubeDLPrefectError) as caught:
        JobRef.from_dict(ref_data(name="../" * 10_000))
    assert len(caught.value.message) < 600


def test_references_as_the_cluster_and_the_local_backend_make_them_are_accepted() -> None:
    assert JobRef.from_dict(ref_data()).name == "mnist-x7k2m9q4ab3c-a1"
    dotted = JobRef.from_dict(ref_data(name="mnist.v2-x7k2m9q4ab3c-a1", uid=""))
    assert dotted.uid == ""
    core = JobRef.from_dict(ref_data(apiVersion="v1", kind="Pod"))
    assert core.api_version == "v1"
    # The local backend's namespace is its workspace, a path: not a Kubernetes namespace.
    local = JobRef.from_dict(
        ref_data(
            backend="local",
            cluster="local://host",
            dialect="local",
            namespace="/home/me/.cache/kubedl-prefect/local",
            uid="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            apiVersion="kubedl-prefect.io/v1alpha1",
        )
    )
    assert local.namespace.startswith("/home/me")


def test_a_backend_for_a_namespace_that_cannot_exist_is_refused() -> None:
    with pytest.raises(KubeDLPrefectError, match="namespace") as caught:
        KubernetesBackend(namespace="../kube-system")
    assert caught.value.hint


async def test_find_jobs_refuses_a_namespace_that_cannot_exist(
    backend: KubernetesBackend, fake_api: FakeKubeAPI
) -> None:
    with pytest.raises(KubeDLPrefectError, match="namespace"):
        await backend.find_jobs({"a": "b"}, namespace="ml/../kube-system")
    assert fake_api.request_log == []


# -- honoured where they act: cancel deletes the job of the reference's uid only ---------------


async def test_cancelling_a_job_that_was_replaced_under_its_name_leaves_the_new_one_alone(
    backend: KubernetesBackend, fake_api: FakeKubeAPI
) -> None:
    ref = await backend.submit(spec(), key="replaced")
    job = fake_api.store.get(PYTORCHJOBS, "ml", ref.name)
    assert job is not None
    fake_api.store.delete(PYTORCHJOBS, "ml", ref.name)
    again = {k: v for k, v in job.items() if k != "status"}
    again["metadata"] = {
        k: v for k, v in job["metadata"].items() if k not in ("uid", "resourceVersion")
    }
    replacement = fake_api.store.create(again, PYTORCHJOBS)
    new_uid = replacement["metadata"]["uid"]
    assert new_uid != ref.uid

    with pytest.raises(ConflictError, match="replaced") as caught:
        await backend.cancel(ref, timeout_s=5)
    assert new_uid in caught.value.message
    assert ref.uid in caught.value.message
    assert caught.value.hint
    still = fake_api.store.get(PYTORCHJOBS, "ml", ref.name)
    assert still is not None
    assert still["metadata"]["uid"] == new_uid


async def test_cancelling_by_reference_still_deletes_its_own_job_and_is_idempotent(
    backend: KubernetesBackend, fake_api: FakeKubeAPI
) -> None:
    ref = await backend.submit(spec(), key="own")
    await backend.cancel(ref, timeout_s=5)
    assert fake_api.store.get(PYTORCHJOBS, "ml", ref.name) is None
    await backend.cancel(ref, timeout_s=5)


async def test_the_fake_api_server_refuses_a_uid_precondition_as_the_real_one_does(
    fake_client: Any, fake_api: FakeKubeAPI
) -> None:
    created = fake_api.store.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}},
        CONFIG_MAPS,
    )
    with pytest.raises(ConflictError) as caught:
        await fake_client.delete(CONFIG_MAPS, "ml", "c", uid="not-its-uid")
    assert caught.value.status == 409
    assert caught.value.reason == "Conflict"
    assert (
        'Operation cannot be fulfilled on ConfigMap "c": the UID in the precondition '
        f"(not-its-uid) does not match the UID in record ({created['metadata']['uid']}). The "
        "object might have been deleted and then recreated" in caught.value.message
    )
    assert fake_api.store.get(CONFIG_MAPS, "ml", "c") is not None
    await fake_client.delete(CONFIG_MAPS, "ml", "c", uid=created["metadata"]["uid"])
    assert fake_api.store.get(CONFIG_MAPS, "ml", "c") is None


# -- run records live only in ConfigMaps we label ----------------------------------------------


def foreign_config_map(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ml", "labels": {"app": "theirs"}},
        "data": {"settings": "keep me"},
    }


async def test_a_config_map_without_our_label_is_never_written_as_a_run_record(
    backend: KubernetesBackend, fake_api: FakeKubeAPI
) -> None:
    name = record_name("mnist", "taken")
    fake_api.store.create(foreign_config_map(name), CONFIG_MAPS)
    ref = await backend.submit(spec(), key="taken")
    await backend.close()  # every record write done
    stored = fake_api.store.get(CONFIG_MAPS, "ml", name)
    assert stored is not None
    assert stored["data"] == {"settings": "keep me"}
    assert fake_api.store.get(PYTORCHJOBS, "ml", ref.name) is not None  # the job runs on


async def test_a_config_map_without_our_label_is_not_read_as_a_run_record(
    backend: KubernetesBackend, fake_api: FakeKubeAPI
) -> None:
    name = record_name("mnist", "forged")
    forged = foreign_config_map(name)
    forged["metadata"]["annotations"] = {
        "kubedl-prefect.io/key": "forged",
        "kubedl-prefect.io/spec-name": "mnist",
    }
    forged["data"] = {
        "attempt-1": json.dumps({"attempt": 1, "name": "mnist-x-a1", "phase": "Succeeded"})
    }
    fake_api.store.create(forged, CONFIG_MAPS)
    with pytest.raises(AdoptionRefusedError, match="not a run record") as caught:
        await backend.history(spec(), key="forged")
    assert name in caught.value.message
    assert caught.value.hint


async def test_our_own_records_are_still_written_and_read(
    backend: KubernetesBackend,
) -> None:
    first = await backend.submit(spec(), key="mine")
    second = await backend.submit(spec(), key="mine", attempt=2)
    record = await backend.history(spec(), key="mine")
    assert record is not None
    assert [(a.attempt, a.uid) for a in record.attempts] == [(1, first.uid), (2, second.uid)]
