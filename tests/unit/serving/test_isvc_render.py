from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from kubedl_prefect.errors import InferenceServiceSpecError
from kubedl_prefect.serving.render import (
    DEPLOYMENT_MODE_ANNOTATION,
    LABEL_MODEL,
    LABEL_MODEL_VERSION,
    LABEL_TRAINING_JOB,
    label_value,
    render_inference_service,
)
from kubedl_prefect.serving.spec import (
    Canary,
    DeploymentMode,
    InferenceServiceSpec,
    ModelLink,
    Protocol,
    ServingResources,
)
from kubedl_prefect.spec import Toleration
from tests.unit.serving.kserve_schema import inference_service_schema

PROCESS_NODE = {"testbed.kubedl-prefect.io/process-node": "true"}
PROCESS_TOLERATION = Toleration(
    key="testbed.kubedl-prefect.io/process-node", operator="Exists", effect="NoSchedule"
)

LINK = ModelLink("team/fraud detector", "7", "ml", "fraud-x7k2m9q4ab3c-a2", "0f1e")

FULL = InferenceServiceSpec(
    name="fraud",
    namespace="serving",
    storage_uri="s3://ml-artifacts/3/models/m-ab12/artifacts",
    runtime="kserve-mlserver",
    service_account="model-storage",
    resources=ServingResources(cpu="2", memory="4Gi", gpus=1),
    min_replicas=1,
    max_replicas=3,
    env={"MLSERVER_PARALLEL_WORKERS": "1"},
    labels={"team": "fraud"},
    annotations={"owner": "ml-platform"},
    link=LINK,
)


def test_the_manifest_has_what_kserve_needs_for_an_mlflow_model() -> None:
    manifest = render_inference_service(FULL)
    assert manifest["apiVersion"] == "serving.kserve.io/v1beta1"
    assert manifest["kind"] == "InferenceService"
    predictor = manifest["spec"]["predictor"]
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "mlflow"}  # no version: mlserver declares 1 and 2
    assert model["protocolVersion"] == "v2"
    assert model["runtime"] == "kserve-mlserver"
    assert model["storageUri"] == "s3://ml-artifacts/3/models/m-ab12/artifacts"
    assert model["resources"]["limits"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1}
    assert model["resources"]["requests"] == model["resources"]["limits"]
    assert model["env"] == [{"name": "MLSERVER_PARALLEL_WORKERS", "value": "1"}]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 3)
    assert predictor["serviceAccountName"] == "model-storage"
    assert "canaryTrafficPercent" not in predictor
    metadata = manifest["metadata"]
    assert metadata["annotations"][DEPLOYMENT_MODE_ANNOTATION] == "Standard"
    assert metadata["annotations"]["kubedl-prefect.io/model-uri"] == "models:/team/fraud detector/7"
    assert metadata["annotations"]["kubedl-prefect.io/training-job-uid"] == "0f1e"
    labels = metadata["labels"]
    assert labels[LABEL_MODEL] == "team-fraud-detector"
    assert labels[LABEL_MODEL_VERSION] == "7"
    assert labels[LABEL_TRAINING_JOB] == "fraud-x7k2m9q4ab3c-a2"
    assert labels["team"] == "fraud"
    assert predictor["labels"] == labels  # the pods carry the lineage too


@pytest.mark.parametrize(
    "service",
    [
        FULL,
        InferenceServiceSpec(name="m", storage_uri="pvc://store/m"),
        InferenceServiceSpec(
            name="fraud-canary",
            storage_uri="gs://b/m",
            deployment_mode=DeploymentMode.KNATIVE,
            canary_traffic_percent=10,
            min_replicas=0,
        ),
        InferenceServiceSpec(
            name="torch", storage_uri="s3://b/t", model_format="pytorch", protocol=Protocol.V1
        ),
        dataclasses.replace(FULL, node_selector=PROCESS_NODE, tolerations=(PROCESS_TOLERATION,)),
    ],
    ids=["full", "minimal", "knative-canary", "pytorch-v1", "placed"],
)
@pytest.mark.parametrize(
    "canary",
    [None, Canary("s3://ml-artifacts/3/models/m-cd34/artifacts", 25, link=LINK)],
    ids=["", "standard-canary"],
)
def test_manifests_pass_kserves_crd_schema_strictly(
    service: InferenceServiceSpec, canary: Canary | None
) -> None:
    if canary is not None:
        if service.deployment_mode is not DeploymentMode.STANDARD:
            return  # refused, see test_a_standard_canary_is_refused_where_kserve_refuses_it
        service = dataclasses.replace(service, canary=canary)
    assert inference_service_schema().errors(render_inference_service(service)) == []


def test_the_offline_check_catches_what_the_api_server_would_prune() -> None:
    manifest = render_inference_service(FULL)
    typo = copy.deepcopy(manifest)
    model = typo["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")
    errors = inference_service_schema().errors(typo)
    assert any("storageURI" in error for error in errors)


def test_canary_is_knative_only_never_silently_ignored() -> None:
    knative = InferenceServiceSpec(
        name="f",
        storage_uri="s3://b/m",
        deployment_mode=DeploymentMode.KNATIVE,
        canary_traffic_percent=20,
    )
    manifest = render_inference_service(knative)
    assert manifest["spec"]["predictor"]["canaryTrafficPercent"] == 20
    assert manifest["metadata"]["annotations"][DEPLOYMENT_MODE_ANNOTATION] == "Knative"
    standard = InferenceServiceSpec(name="f", storage_uri="s3://b/m", canary_traffic_percent=20)
    with pytest.raises(InferenceServiceSpecError) as caught:
        render_inference_service(standard)
    (issue,) = caught.value.issues
    assert issue.path == "canaryTrafficPercent"
    assert "ignores canaryTrafficPercent in Standard mode" in issue.problem
    assert "canary=Canary(" in issue.fix


def test_a_standard_canary_is_kserves_spec_canary_next_to_the_stable_model() -> None:
    candidate = ModelLink("team/fraud detector", "8", "ml", "fraud-x7k2m9q4ab3c-a3", "1a2b")
    service = dataclasses.replace(
        FULL, canary=Canary("s3://ml-artifacts/3/models/m-cd34/artifacts", 25, link=candidate)
    )
    manifest = render_inference_service(service)
    stable = manifest["spec"]["predictor"]
    assert stable["model"]["storageUri"] == "s3://ml-artifacts/3/models/m-ab12/artifacts"
    (entry,) = manifest["spec"]["canary"]
    assert entry["trafficPercent"] == 25
    predictor = entry["predictor"]
    assert predictor["name"] == "canary"
    assert predictor["model"] == {
        **stable["model"],
        "name": "kserve-container",
        "storageUri": "s3://ml-artifacts/3/models/m-cd34/artifacts",
    }
    assert predictor["labels"][LABEL_MODEL_VERSION] == "8"
    assert predictor["labels"][LABEL_TRAINING_JOB] == "fraud-x7k2m9q4ab3c-a3"
    assert stable["labels"][LABEL_MODEL_VERSION] == "7"
    # Without a link of its own, the candidate's pods carry the service's.
    unlinked = dataclasses.replace(FULL, canary=Canary("s3://b/m2", 10))
    labels = render_inference_service(unlinked)["spec"]["canary"][0]["predictor"]["labels"]
    assert labels[LABEL_MODEL_VERSION] == "7"


def test_a_standard_canary_is_refused_where_kserve_refuses_it() -> None:
    bad = InferenceServiceSpec(
        name="f",
        storage_uri="s3://b/m",
        deployment_mode=DeploymentMode.KNATIVE,
        canary=Canary("models:/f/2", 120, name="Canary_1"),
        canary_traffic_percent=5,
    )
    paths = sorted(issue.path for issue in bad.issues())
    assert paths == [
        "canary",
        "canary",
        "canary.predictor.model.storageUri",
        "canary.predictor.name",
        "canary.trafficPercent",
    ]
    long_name = InferenceServiceSpec(
        name="f" * 50, storage_uri="s3://b/m", canary=Canary("s3://b/m2", 5, name="c" * 5)
    )
    (issue,) = long_name.issues()
    assert issue.path == "canary.predictor.name"
    assert "-<name>-predictor" in issue.problem


def test_the_mode_annotation_cannot_be_overridden_by_user_annotations() -> None:
    service = InferenceServiceSpec(
        name="f", storage_uri="s3://b/m", annotations={DEPLOYMENT_MODE_ANNOTATION: "Knative"}
    )
    annotations = render_inference_service(service)["metadata"]["annotations"]
    assert annotations[DEPLOYMENT_MODE_ANNOTATION] == "Standard"


def test_every_problem_is_refused_before_anything_is_sent() -> None:
    bad = InferenceServiceSpec(
        name="Fraud_" + "x" * 60,
        storage_uri="models:/fraud@champion",
        protocol=Protocol.V1,
        model_format_version="2",
        resources=ServingResources(cpu="lots", gpus=-1),
        min_replicas=0,
        max_replicas=0,
        env={"1BAD": "x"},
    )
    with pytest.raises(InferenceServiceSpecError) as caught:
        render_inference_service(bad)
    paths = [issue.path for issue in caught.value.issues]
    assert paths == [
        "name",
        "storageUri",
        "protocolVersion",
        "modelFormat.version",
        "resources.cpu",
        "resources.gpus",
        "maxReplicas",
        "minReplicas",
        "env.1BAD",
    ]
    assert "ModelRegistry.resolve" in caught.value.issues[1].fix


def test_the_manifest_is_plain_json_and_deterministic() -> None:
    assert json.dumps(render_inference_service(FULL)) == json.dumps(render_inference_service(FULL))


def test_label_values_are_valid_kubernetes_label_values() -> None:
    assert label_value("a" * 70) != label_value("a" * 71)
    assert len(label_value("a" * 70)) <= 63
    assert label_value("-x.") == "x"


def test_a_predictor_host_name_longer_than_a_dns_label_is_refused() -> None:
    # KServe's predictor host is <name>-predictor-<namespace>; too long fails every reconcile.
    service = InferenceServiceSpec(name="fraud", storage_uri="s3://b/m")
    namespace = "n" * 48  # fraud-predictor- is 16 characters: 64 in all
    with pytest.raises(InferenceServiceSpecError) as caught:
        render_inference_service(service, namespace=namespace)
    (issue,) = caught.value.issues
    assert issue.path == "name"
    assert "64 characters" in issue.problem
    assert render_inference_service(service, namespace="n" * 47)["metadata"]["namespace"]
    canary = dataclasses.replace(service, canary=Canary("s3://b/m2", 10))
    assert [i.path for i in canary.issues("n" * 41)] == ["name"]  # fraud-canary-predictor-: 23
    assert canary.issues("n" * 40) == []


def test_the_predictor_can_be_placed_by_node_selector_and_tolerations() -> None:
    service = dataclasses.replace(
        FULL,
        node_selector=PROCESS_NODE,
        tolerations=(PROCESS_TOLERATION,),
        canary=Canary("s3://b/m2", 50),
    )
    manifest = render_inference_service(service)
    predictor = manifest["spec"]["predictor"]
    assert predictor["nodeSelector"] == PROCESS_NODE
    assert predictor["tolerations"] == [
        {
            "key": "testbed.kubedl-prefect.io/process-node",
            "operator": "Exists",
            "effect": "NoSchedule",
        }
    ]
    # KServe merges the canary's predictor over the stable one: its pods are placed alike.
    assert "nodeSelector" not in manifest["spec"]["canary"][0]["predictor"]
    assert "nodeSelector" not in render_inference_service(FULL)["spec"]["predictor"]


def test_a_node_selector_that_is_not_labels_is_refused() -> None:
    bad = InferenceServiceSpec(
        name="f", storage_uri="s3://b/m", node_selector={"bad key!": "x", "ok": "v" * 64}
    )
    (issue,) = bad.issues()
    assert issue.path == "predictor.nodeSelector"
    assert "2 key(s) or value(s)" in issue.problem
    wrong = InferenceServiceSpec(
        name="f",
        storage_uri="s3://b/m",
        tolerations=({"key": "k"},),  # type: ignore[arg-type]
    )
    (issue,) = wrong.issues()
    assert issue.path == "predictor.tolerations[0]"
    assert "not a Toleration" in issue.problem


def test_standard_v2_models_are_ready_once_their_model_loaded() -> None:
    # KServe's own default is a TCP probe of 8080, which MLServer passes before the model loads.
    model = render_inference_service(FULL)["spec"]["predictor"]["model"]
    assert model["readinessProbe"] == {
        "httpGet": {"path": "/v2/models/fraud/ready", "port": 8080},
        "periodSeconds": 5,
        "failureThreshold": 3,
    }
    canary = render_inference_service(dataclasses.replace(FULL, canary=Canary("s3://b/m2", 50)))
    assert (
        canary["spec"]["canary"][0]["predictor"]["model"]["readinessProbe"]
        == (model["readinessProbe"])
    )
    for other in (
        dataclasses.replace(FULL, model_ready_probe=False),
        dataclasses.replace(FULL, deployment_mode=DeploymentMode.KNATIVE),
        dataclasses.replace(FULL, model_format="pytorch", protocol=Protocol.V1),
    ):
        assert "readinessProbe" not in render_inference_service(other)["spec"]["predictor"]["model"]
