"""The serving record: what a rollback restores, kept in a ConfigMap the InferenceService owns.

Against the in-memory API server, with KServe's controller played by ``FakeKserve``
(tests/support), which fails the ``broken`` model. The record used to
be two annotations of the InferenceService, which KServe copies into the predictors' pod
templates: the first test shows that a canary no longer changes what the stable predictor's
template is made from.
"""

from __future__ import annotations

import doctest
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest

import kubedl_prefect.serving.record as record_module
from kubedl_prefect.errors import InferenceServiceNotReadyError, KubeDLPrefectError, ServingError
from kubedl_prefect.kube.resources import CONFIG_MAPS, INFERENCE_SERVICES, KubeObject
from kubedl_prefect.serving import (
    Canary,
    DeploymentMode,
    InferenceServiceDeployer,
    InferenceServiceSpec,
)
from kubedl_prefect.serving.record import (
    LEGACY_ANNOTATION_APPLIED,
    LEGACY_ANNOTATION_PREVIOUS,
    ServingRecord,
    foreign_fields,
    record_name,
)
from kubedl_prefect.serving.render import render_inference_service
from kubedl_prefect.spec import Toleration
from tests.support.fakeapi import FakeKubeAPI
from tests.support.fakekserve import FakeKserve
from tests.support.polling import until
from tests.unit.serving.test_isvc_render import FULL, LINK

NAMESPACE = "ml"
RECORD = record_name("clf")
BROKEN = "s3://ml/broken/artifacts"
"""A model KServe's stand-in fails (``ReconcileFailed``)."""


@pytest.fixture
async def deployer(fake_api: FakeKubeAPI) -> AsyncIterator[InferenceServiceDeployer]:
    made = InferenceServiceDeployer(namespace=NAMESPACE, credentials=fake_api.credentials)
    async with FakeKserve(fake_api, NAMESPACE, failing_stable_uri=BROKEN).running():
        try:
            yield made
        finally:
            await made.close()


def spec(version: str, *, canary: str | None = None) -> InferenceServiceSpec:
    return InferenceServiceSpec(
        name="clf",
        storage_uri=f"s3://ml/{version}/artifacts",
        canary=Canary(f"s3://ml/{canary}/artifacts", traffic_percent=20) if canary else None,
    )


def live(api: FakeKubeAPI) -> KubeObject:
    found = api.store.get(INFERENCE_SERVICES, NAMESPACE, "clf")
    assert found is not None
    return found


def record(api: FakeKubeAPI) -> KubeObject | None:
    return api.store.get(CONFIG_MAPS, NAMESPACE, RECORD)


def uri(view: str | None) -> str:
    assert view is not None
    return str(json.loads(view)["spec"]["predictor"]["model"]["storageUri"])


async def test_a_canary_leaves_what_kserve_copies_into_the_stable_pods_unchanged(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    await deployer.deploy(spec("v1"), timeout_s=10)
    before = live(fake_api)
    await deployer.deploy(spec("v1", canary="v2"), timeout_s=10)
    with_canary = live(fake_api)
    await deployer.deploy(spec("v1"), timeout_s=10)
    after = live(fake_api)

    # KServe makes the stable predictor's pod template from the service's annotations and its
    # spec.predictor: neither changes while a canary comes and goes.
    for obj in (with_canary, after):
        assert obj["metadata"]["annotations"] == before["metadata"]["annotations"]
        assert obj["spec"]["predictor"] == before["spec"]["predictor"]
    assert with_canary["spec"]["canary"]
    annotations = before["metadata"]["annotations"]
    assert LEGACY_ANNOTATION_APPLIED not in annotations
    assert LEGACY_ANNOTATION_PREVIOUS not in annotations


async def test_the_record_holds_the_applied_and_the_previous_spec_and_is_owned_by_the_service(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    await deployer.deploy(spec("v1"), timeout_s=10)
    first = record(fake_api)
    assert first is not None
    assert uri(first["data"]["applied"]) == "s3://ml/v1/artifacts"
    assert "previous" not in first["data"]  # nothing served before

    await deployer.deploy(spec("v2"), timeout_s=10)
    second = record(fake_api)
    assert second is not None
    assert uri(second["data"]["applied"]) == "s3://ml/v2/artifacts"
    assert uri(second["data"]["previous"]) == "s3://ml/v1/artifacts"
    labels = second["metadata"]["labels"]
    assert labels["kubedl-prefect.io/serving-record"] == "true"
    assert labels["kubedl-prefect.io/inference-service"] == "clf"
    assert labels["app.kubernetes.io/managed-by"] == "kubedl-prefect"
    (owner,) = second["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("InferenceService", "clf")
    assert owner["uid"] == live(fake_api)["metadata"]["uid"]


async def test_a_failed_version_restores_the_recorded_spec_and_records_it_again(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    await deployer.deploy(spec("v1"), timeout_s=10)
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(spec("broken"), timeout_s=10, rollback_timeout_s=10)

    assert caught.value.rolled_back
    assert "the previous spec was restored and is Ready again" in caught.value.message
    assert live(fake_api)["spec"]["predictor"]["model"]["storageUri"] == "s3://ml/v1/artifacts"
    restored = record(fake_api)
    assert restored is not None
    assert uri(restored["data"]["applied"]) == "s3://ml/v1/artifacts"
    assert "previous" not in restored["data"]


async def test_a_new_service_that_fails_is_deleted_and_its_record_with_it(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(spec("broken"), timeout_s=10)

    assert "nothing was serving before, so the new service was deleted" in caught.value.message
    assert record(fake_api) is None


async def test_the_record_goes_with_its_service(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    await deployer.deploy(spec("v1"), timeout_s=10)
    assert record(fake_api) is not None
    await deployer.delete("clf")
    assert record(fake_api) is None


async def test_a_configmap_of_that_name_that_is_not_a_record_refuses_the_deployment(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    theirs = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": RECORD, "namespace": NAMESPACE},
        "data": {"applied": "theirs"},
    }
    fake_api.store.create(theirs, CONFIG_MAPS)

    with pytest.raises(ServingError) as caught:
        await deployer.deploy(spec("v1"), timeout_s=10)

    assert f"ConfigMap {NAMESPACE}/{RECORD} exists and is not kubedl-prefect's" in str(caught.value)
    assert "nothing was applied" in str(caught.value)
    assert fake_api.store.get(INFERENCE_SERVICES, NAMESPACE, "clf") is None
    still = record(fake_api)
    assert still is not None
    assert still["data"] == {"applied": "theirs"}


async def test_a_service_of_an_earlier_release_rolls_back_to_its_annotated_spec(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    # Deployed by a release that kept the record in annotations: the applied v1, Ready.
    manifest = deployer.manifest(spec("v1"))
    view = {
        "labels": manifest["metadata"]["labels"],
        "annotations": manifest["metadata"]["annotations"],
        "spec": manifest["spec"],
    }
    annotated = json.dumps(view, sort_keys=True, separators=(",", ":"))
    manifest["metadata"]["annotations"][LEGACY_ANNOTATION_APPLIED] = annotated
    fake_api.store.create(manifest, INFERENCE_SERVICES)

    async def reported() -> object:  # KServe's stand-in reports it Ready
        return live(fake_api).get("status")

    await until("KServe's stand-in reports v1", reported, within_s=10, every_s=0.02)

    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(spec("broken"), timeout_s=10, rollback_timeout_s=10)

    assert "the previous spec was restored and is Ready again" in caught.value.message
    assert live(fake_api)["spec"]["predictor"]["model"]["storageUri"] == "s3://ml/v1/artifacts"


def test_a_record_owned_by_another_uid_is_not_the_services() -> None:
    service = {"metadata": {"name": "clf", "uid": "new", "annotations": {}}}
    stale = {
        "metadata": {"ownerReferences": [{"uid": "old"}]},
        "data": {"applied": "{}", "previous": "{}"},
    }
    assert ServingRecord.of(service, stale) == ServingRecord(None, None)
    mine = {"metadata": {"ownerReferences": [{"uid": "new"}]}, "data": {"applied": "a"}}
    assert ServingRecord.of(service, mine) == ServingRecord("a", None)
    assert ServingRecord.of(None, mine) == ServingRecord(None, None)


def test_annotations_of_an_earlier_release_are_read_when_there_is_no_record() -> None:
    annotations: dict[str, Any] = {
        LEGACY_ANNOTATION_APPLIED: "a",
        LEGACY_ANNOTATION_PREVIOUS: "p",
    }
    service = {"metadata": {"name": "clf", "uid": "u", "annotations": annotations}}
    assert ServingRecord.of(service, None) == ServingRecord("a", "p")


def test_the_record_modules_examples_run() -> None:
    result = doctest.testmod(record_module)
    assert result.attempted >= 2
    assert result.failed == 0


async def test_a_rollback_restores_what_restore_names_instead_of_what_serves(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer
) -> None:
    await deployer.deploy(spec("v1"), timeout_s=10)
    await deployer.deploy(spec("v1", canary="v2"), timeout_s=10)
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(
            spec("broken"), timeout_s=10, rollback_timeout_s=10, restore=spec("v1")
        )

    assert "the previous spec was restored and is Ready again" in caught.value.message
    served = live(fake_api)["spec"]
    assert served["predictor"]["model"]["storageUri"] == "s3://ml/v1/artifacts"
    assert not served.get("canary")  # what restore named, not the spec with its canary


async def test_restore_must_name_the_same_service(deployer: InferenceServiceDeployer) -> None:
    other = InferenceServiceSpec(name="other", storage_uri="s3://ml/v1/artifacts")
    with pytest.raises(KubeDLPrefectError, match="restore names 'other'"):
        await deployer.deploy(spec("v2"), timeout_s=10, restore=other)


EVERY_FIELD = replace(
    FULL,  # the render tests' spec with every setting, plus what it leaves out
    model_format="sklearn",
    model_format_version="1",
    canary=Canary("s3://ml/v2/artifacts", traffic_percent=20, link=LINK),
    node_selector={"pool": "gpu"},
    tolerations=(Toleration(key="gpu", operator="Exists", effect="NoSchedule"),),
)


@pytest.mark.parametrize(
    "service",
    [
        EVERY_FIELD,
        replace(
            EVERY_FIELD,
            canary=None,
            canary_traffic_percent=10,
            deployment_mode=DeploymentMode.KNATIVE,
        ),
    ],
    ids=["standard-with-canary", "knative"],
)
def test_every_field_the_renderer_writes_may_be_restored(service: InferenceServiceSpec) -> None:
    manifest = render_inference_service(service)
    predictor = manifest["spec"]["predictor"]
    written = set(predictor) | {f"model.{key}" for key in predictor["model"]}
    assert {"serviceAccountName", "tolerations", "model.env", "model.resources"} <= written
    assert "model.readinessProbe" in written or service.deployment_mode is DeploymentMode.KNATIVE
    metadata = manifest["metadata"]
    view = {"labels": metadata["labels"], "annotations": metadata["annotations"]}
    assert foreign_fields(json.dumps({**view, "spec": manifest["spec"]})) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda p: p.update(containers=[{"name": "x", "image": "evil"}]), "containers"),
        (lambda p: p.update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "volumes"),
        (lambda p: p["model"].update(image="evil"), "model.image"),
        (
            lambda p: p["model"].update(readinessProbe={"exec": {"command": ["sh"]}}),
            "model.readinessProbe.exec",
        ),
        (
            lambda p: p["model"].update(env=[{"name": "T", "valueFrom": {"secretKeyRef": {}}}]),
            "model.env[0].valueFrom",
        ),
    ],
    ids=["containers", "volumes", "image", "exec-probe", "secret-env"],
)
async def test_a_record_whose_spec_to_restore_was_changed_refuses_the_deployment(
    fake_api: FakeKubeAPI,
    deployer: InferenceServiceDeployer,
    change: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    await deployer.deploy(spec("v1"), timeout_s=10)
    await deployer.deploy(spec("v2"), timeout_s=10)
    stored = record(fake_api)
    assert stored is not None
    view = json.loads(stored["data"]["previous"])
    change(view["spec"]["predictor"])
    forged = json.dumps(view)
    fake_api.store.merge(CONFIG_MAPS, NAMESPACE, RECORD, {"data": {"previous": forged}})
    before = live(fake_api)["metadata"]["resourceVersion"]

    # A retry of v2 would restore the recorded previous spec if v2 failed: it is refused first.
    with pytest.raises(ServingError) as caught:
        await deployer.deploy(spec("v2"), timeout_s=10)

    assert f"spec.predictor.{field}" in caught.value.message
    assert "it is not restored, and nothing was applied" in caught.value.message
    assert live(fake_api)["metadata"]["resourceVersion"] == before


async def test_without_rbac_for_configmaps_a_deployment_still_rolls_back_from_memory(
    fake_api: FakeKubeAPI, deployer: InferenceServiceDeployer, caplog: pytest.LogCaptureFixture
) -> None:
    # A serving Role written before the record existed: no ConfigMaps at all.
    fake_api.fail_next("*", "/api/v1/namespaces/ml/configmaps", 403, "Forbidden", times=None)
    await deployer.deploy(spec("v1"), timeout_s=10)
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(spec("broken"), timeout_s=10, rollback_timeout_s=10)

    assert "the previous spec was restored and is Ready again" in caught.value.message
    assert live(fake_api)["spec"]["predictor"]["model"]["storageUri"] == "s3://ml/v1/artifacts"
    warnings = [r.getMessage() for r in caught_warnings(caplog)]
    assert any("cannot read the serving record ml/clf-serving-record" in w for w in warnings)
    assert any("cannot write the serving record ml/clf-serving-record" in w for w in warnings)
    fake_api.clear_failures()
    assert record(fake_api) is None


def caught_warnings(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return [r for r in caplog.records if r.name == "kubedl_prefect.serving.record"]
