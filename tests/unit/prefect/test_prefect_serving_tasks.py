"""The serving side of the model chain: the serving block, events, the summary, rendering (pure)."""

from __future__ import annotations

import doctest
import inspect
import uuid
from types import MappingProxyType

import pytest

from kubedl_prefect.errors import InferenceServiceNotReadyError, InferenceServiceSpecError
from kubedl_prefect.prefect import chain, events, serving_tasks
from kubedl_prefect.prefect.artifacts import serving_markdown
from kubedl_prefect.prefect.blocks import KubernetesCluster
from kubedl_prefect.prefect.events import inference_service_event
from kubedl_prefect.prefect.model_blocks import KServeServing
from kubedl_prefect.serving import (
    DeploymentMode,
    InferenceServiceEvent,
    ModelLink,
    Readiness,
    ServingOutcome,
    ServingState,
)
from kubedl_prefect.serving import events as serving_events
from kubedl_prefect.spec.kube_types import Toleration

LINK = ModelLink("fraud", "3", "ml", "fraud-x7k2-a1", "uid-job")


def test_every_async_serving_task_has_a_sync_twin_with_the_same_signature() -> None:
    found = 0
    for name, value in vars(serving_tasks).items():
        if not (name.startswith("a") and inspect.iscoroutinefunction(getattr(value, "fn", None))):
            continue
        twin = getattr(serving_tasks, name[1:])
        assert not inspect.iscoroutinefunction(twin.fn), name
        assert inspect.signature(twin.fn) == inspect.signature(value.fn), name
        assert twin.name == value.name
        assert value.retry_condition_fn is chain.TASK_OPTIONS["retry_condition_fn"]
        found += 1
    assert found == 2


def test_the_serving_block_makes_the_spec_with_its_settings() -> None:
    block = KServeServing(
        cluster=KubernetesCluster(kubeconfig_path="/k", namespace="training"),
        cpu="1",
        memory="2Gi",
        min_replicas=1,
        max_replicas=3,
        deployment_mode="Knative",
    )
    spec = block.service("fraud", "s3://ml/3/models/m-ab/artifacts", link=LINK)
    assert spec.namespace == "training"  # the cluster's namespace without one of its own
    assert spec.runtime == "kserve-mlserver"
    assert spec.deployment_mode is DeploymentMode.KNATIVE
    assert (spec.resources.cpu, spec.resources.memory, spec.resources.gpus) == ("1", "2Gi", 0)
    assert (spec.min_replicas, spec.max_replicas, spec.link) == (1, 3, LINK)
    assert (
        block.service("fraud", "s3://x/m", canary_traffic_percent=10).canary_traffic_percent == 10
    )
    assert KServeServing(namespace="serving", runtime="").service("f", "s3://x/m").runtime is None
    assert KServeServing(namespace="serving").deployer().namespace == "serving"


def test_the_serving_block_places_the_predictor_and_keeps_it_through_save_and_load() -> None:
    process_node = "testbed.kubedl-prefect.io/process-node"
    block = KServeServing(
        namespace="serving",
        node_selector={process_node: "true"},
        tolerations=[{"key": process_node, "operator": "Exists", "effect": "NoSchedule"}],
    )
    toleration = Toleration(key=process_node, operator="Exists", effect="NoSchedule")
    spec = block.service("fraud", "s3://ml/3/models/m-ab/artifacts")
    assert dict(spec.node_selector) == {process_node: "true"}
    assert spec.tolerations == (toleration,)
    predictor = serving_tasks.render_inference_service.fn(spec, block)["spec"]["predictor"]
    assert predictor["nodeSelector"] == {process_node: "true"}
    assert predictor["tolerations"] == [
        {"key": process_node, "operator": "Exists", "effect": "NoSchedule"}
    ]
    # What the block keeps (a Prefect server stores this JSON) reads back the same.
    again = KServeServing.model_validate(block.model_dump(mode="json"))
    assert again.service("fraud", "s3://x/m").tolerations == (toleration,)
    assert KServeServing().service("fraud", "s3://x/m").node_selector == {}
    with pytest.raises(ValueError, match="cannot have a value"):
        KServeServing(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}])


def test_the_render_task_checks_and_renders_without_sending_anything() -> None:
    block = KServeServing(namespace="serving")
    manifest = serving_tasks.render_inference_service.fn(
        block.service("fraud", "s3://ml/3/models/m-ab/artifacts", link=LINK), block
    )
    assert manifest["metadata"]["namespace"] == "serving"
    assert manifest["metadata"]["labels"]["kubedl-prefect.io/model-version"] == "3"
    assert manifest["spec"]["predictor"]["model"]["storageUri"] == (
        "s3://ml/3/models/m-ab/artifacts"
    )
    with pytest.raises(InferenceServiceSpecError, match="storageUri") as caught:
        serving_tasks.render_inference_service.fn(block.service("fraud", "models:/fraud/3"), block)
    assert [issue.path for issue in caught.value.issues] == ["storageUri"]


def test_a_service_relates_to_its_model_version_and_training_job() -> None:
    spec = KServeServing(namespace="ml").service("fraud", "s3://x/m", link=LINK)
    assert serving_tasks.service_related(spec) == [
        {
            "prefect.resource.id": "kubedl.model-version.fraud.3",
            "prefect.resource.role": "model-version",
            "prefect.resource.name": "fraud v3",
        },
        {
            "prefect.resource.id": "kubedl.training-job.uid-job",
            "prefect.resource.role": "training-job",
            "prefect.resource.name": "fraud-x7k2-a1",
        },
    ]
    assert serving_tasks.service_related(KServeServing().service("f", "s3://x/m")) == []


@pytest.mark.parametrize(
    "name", [serving_events.APPLIED, serving_events.READY, serving_events.NOT_READY]
)
def test_a_serving_record_is_emitted_as_it_is(name: str) -> None:
    record = InferenceServiceEvent(
        name, "ml", "fraud", "uid-isvc", "42", MappingProxyType({"reason": "ModelLoadFailed"})
    )
    related = [{"prefect.resource.id": "prefect.flow-run.1", "prefect.resource.role": "flow-run"}]
    spec = inference_service_event(record, related)
    assert spec.event == name
    assert spec.id == uuid.UUID(record.id)
    assert spec.resource == {
        "prefect.resource.id": "kubedl.inference-service.ml.fraud",
        "prefect.resource.name": "fraud",
        "kubedl.namespace": "ml",
        "kubedl.name": "fraud",
        "kubedl.uid": "uid-isvc",
        "kubedl.reason": "ModelLoadFailed",
    }
    assert spec.payload == {"reason": "ModelLoadFailed"}
    assert spec.related == related
    # The same happening recorded again (a re-attached flow) is the same event.
    assert inference_service_event(record).id == spec.id


OUTCOME = ServingOutcome(
    namespace="ml",
    name="fraud",
    uid="uid-isvc",
    generation=2,
    url="http://fraud.ml.example.com",
    runtime="kserve-mlserver",
    storage_uri="s3://ml/3/models/m-ab/artifacts",
    changed=True,
    readiness=Readiness(ServingState.READY, "Ready", ""),
)


def test_the_serving_summary_tells_ready_rolled_back_or_rendered() -> None:
    ready = serving_markdown(
        name="fraud",
        namespace="ml",
        storage_uri=OUTCOME.storage_uri,
        requested_runtime=None,
        outcome=OUTCOME,
    )
    assert ready.startswith("# InferenceService `ml/fraud`: Ready")
    assert "| runtime asked for | (KServe chooses) |" in ready
    assert "| runtime chosen | kserve-mlserver |" in ready
    assert "| URL | http://fraud.ml.example.com |" in ready
    assert OUTCOME.storage_uri in ready

    error = InferenceServiceNotReadyError(
        "InferenceService ml/fraud failed: ModelLoadFailed: cannot load | the model",
        namespace="ml",
        name="fraud",
        reason="ModelLoadFailed",
        rolled_back=True,
        hint="check the version's compatibility",
    )
    rolled = serving_markdown(
        name="fraud", namespace="ml", storage_uri="s3://x/m", requested_runtime="r", error=error
    )
    assert rolled.startswith("# InferenceService `ml/fraud`: rolled back")
    assert "| reason | ModelLoadFailed |" in rolled
    assert "cannot load \\| the model" in rolled  # a table-safe message
    assert "check the version's compatibility" in rolled

    rendered = serving_markdown(
        name="fraud",
        namespace="ml",
        storage_uri="s3://x/m",
        manifest={"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService"},
        note="serve=none: nothing was applied",
    )
    assert rendered.startswith("# InferenceService `ml/fraud`: rendered, not applied")
    assert "```yaml\napiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\n```" in rendered


@pytest.mark.parametrize("module", [events, serving_tasks, chain])
def test_the_examples_in_the_docstrings_hold(module: object) -> None:
    result = doctest.testmod(module, raise_on_error=False)  # type: ignore[arg-type]
    assert result.failed == 0
    assert result.attempted > 0 or module is chain


def test_the_flow_names_the_service_and_serves_a_local_cluster_from_the_default() -> None:
    from flows.train_and_serve import registry_block, service_name, serving_block
    from kubedl_prefect.prefect.blocks import LocalCluster

    assert service_name("Team/Fraud_Detector") == "team-fraud-detector"
    assert service_name("3d-model") == "m-3d-model"
    assert len(service_name("x" * 80)) == 53
    kube = serving_block(None, KubernetesCluster(namespace="ml"), None, "kserve-mlserver")
    assert kube.resolved_namespace() == "ml"
    local = serving_block(None, LocalCluster(workspace="/tmp/kubedl-ws"), "serving", None)
    assert isinstance(local.cluster, KubernetesCluster)
    assert (local.resolved_namespace(), local.runtime) == ("serving", None)
    assert registry_block("http://mlflow:5000", None).tracking_uri == "http://mlflow:5000"
    with pytest.raises(ValueError, match="tracking_uri"):
        registry_block(None, None)


async def test_a_ready_service_gets_a_link_to_its_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[tuple[str, str, str | None]] = []

    async def write_link(ctx: object, stem: str, what: str, link: str | None, *_: str) -> None:
        written.append((stem, what, link))

    async def write_markdown(*_: object) -> None:
        return None

    class Deployer:
        async def deploy(self, service: object, **_: object) -> ServingOutcome:
            return OUTCOME

        async def close(self) -> None:
            return None

    monkeypatch.setattr(serving_tasks, "write_link", write_link)
    monkeypatch.setattr(serving_tasks, "write_markdown", write_markdown)
    monkeypatch.setattr(KServeServing, "deployer", lambda self: Deployer())
    block = KServeServing(cluster=KubernetesCluster(kubeconfig_path="/k", namespace="ml"))
    service = block.service("fraud", "s3://ml/3/models/m-ab/artifacts", link=LINK)
    outcome = await serving_tasks.adeploy_inference_service.fn(service, block)
    assert outcome is OUTCOME
    assert written == [("fraud", "endpoint", "http://fraud.ml.example.com")]
