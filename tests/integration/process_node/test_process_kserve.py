"""KServe serves for real: an InferenceService's own predictor pod runs on the process node.

A model version registered in a real MLflow server (SQLite, proxied artifacts on this machine)
is resolved to a ``file://`` location and deployed with our deployer to the test bed's real KServe
controller (v0.20, Standard mode, its webhooks registered), placed on the process node by
``node_selector`` and ``tolerations``. KServe makes the Deployment; its pod mutator injects the
``storage-initializer`` init container into the pod (the Deployment's template has none); the
process node runs the local storage initializer and MLServer as processes; our readiness wait
reports Ready from the pod's real readiness probe (``/v2/models/<name>/ready``) and a V2
prediction through the predictor's Service (the node's forwarder) answers with the model's own
numbers. Then the gate promotes a version MLServer cannot load: the deployer fails with
MLServer's own error read from the pod's log, restores the previous spec and the champion alias,
and the previous version still answers.

Measured on the shared 2-core machine at load 11-14: 450 s (MLServer starts once for version 1,
four times for version 2 before CrashLoopBackOff counts as failed), plus 96 s of set-up; at load
5-6: 154 s, plus 59 s of set-up.

The canary runs on real pods too (:func:`~kubedl_prefect.serving.arun_canary`): a candidate
next to the champion in KServe's ``<name>-canary-predictor`` Deployment, the same requests
through both Services' forwarders, a candidate that answers as the champion does promoted and
one whose answers differ rolled back (the champion alone again, the alias restored, still
answering), and one MLServer cannot load rolled back by the deployment itself (its canary pod
crash-loops). 334 s at load 6, plus 61 s of set-up.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kubedl_prefect.errors import InferenceServiceNotReadyError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import KubeconfigFile
from kubedl_prefect.kube.resources import INFERENCE_SERVICES, PODS, ResourceKind
from kubedl_prefect.registry import GatePolicy, ModelRegistry
from kubedl_prefect.serving import (
    Canary,
    CanaryCheck,
    InferenceServiceDeployer,
    InferenceServiceEvent,
    InferenceServiceSpec,
    ModelLink,
    ServingResources,
    arun_canary,
)
from kubedl_prefect.serving.local import install_server_environment, v2_request
from kubedl_prefect.spec import Toleration
from kubedl_prefect.testbed.nodeagent.forwarder import service_address
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.process_node.test_process_services import forwarded
from tests.integration.test_local_ddp import torch_installed
from tests.integration.test_serving_rollout import short_namespace
from tests.support.mlflow_server import MlflowServer

__all__ = ["torch_installed"]

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(1500)]

POINTS = [[0.0, 0.1], [0.5, -0.5], [-0.3, 0.2]]
POLICY = GatePolicy("accuracy", min_improvement=0.01)
DEPLOYMENTS = ResourceKind("apps", "v1", "Deployment", "deployments")
ON_THE_PROCESS_NODE: dict[str, Any] = {
    "node_selector": {PROCESS_NODE_LABEL: "true"},
    "tolerations": (Toleration(key=PROCESS_NODE_LABEL, operator="Exists", effect="NoSchedule"),),
    # The process node advertises this machine's CPUs (2 here): the old and the new predictor
    # run side by side during a rollout.
    "resources": ServingResources(cpu="500m", memory="1Gi"),
}


@dataclass(frozen=True)
class Versions:
    """A registered model: version 1 serves (its logits of POINTS), version 2 cannot load,
    version 3 serves other numbers (its logits), version 4 is version 1's network again."""

    model: str
    logits: list[list[float]]
    other_logits: list[list[float]]


@pytest.fixture
def versions(torch_installed: None, mlflow_server: MlflowServer) -> Versions:
    """Four versions of a model of its own in the tracking server, each run with an
    ``accuracy`` (each test moves its alias)."""
    import mlflow
    import torch
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    install_server_environment()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    example = torch.tensor(POINTS, dtype=torch.float32)
    with torch.no_grad():
        logits = net(example)
    client = MlflowClient(mlflow_server.url)
    model = f"clf-{uuid.uuid4().hex[:8]}"
    experiment = client.create_experiment(f"process-kserve-{uuid.uuid4().hex[:8]}")

    def log_version(network: Any, answers: Any, accuracy: float) -> None:
        """A run with ``accuracy`` that logs ``network`` as the model's next version."""
        with mlflow.start_run(experiment_id=experiment):
            mlflow.log_metric("accuracy", accuracy)
            mlflow.pytorch.log_model(
                network,
                name="model",
                signature=infer_signature(example.numpy(), answers.numpy()),
                serialization_format="pickle",
                registered_model_name=model,
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "mlflow"],
            )

    mlflow.set_tracking_uri(mlflow_server.url)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MLflow's advice about pickle and pip versions
            log_version(net, logits, 0.80)
            # Version 2: files whose only flavor no MLflow runtime loads (no python_function).
            with mlflow.start_run(experiment_id=experiment) as run:
                mlflow.log_metric("accuracy", 0.90)
                mlflow.log_text("flavors:\n  no_such_flavor: {}\n", "model/MLmodel")
                client.create_model_version(
                    model, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id
                )
            # Version 3: the same architecture, other weights (a candidate that answers).
            torch.manual_seed(1)
            other = torch.nn.Sequential(
                torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
            )
            with torch.no_grad():
                other_logits = other(example)
            log_version(other, other_logits, 0.95)
            # Version 4: version 1's network again, retrained to a better score (a candidate
            # that answers as the champion does).
            log_version(net, logits, 0.85)
    finally:
        mlflow.set_tracking_uri(None)
    return Versions(model, logits.tolist(), other_logits.tolist())


@pytest.fixture
def namespace(process_node: Testbed) -> Iterator[str]:
    # KServe's predictor host name <name>-predictor-<namespace> must fit 63 characters.
    yield from short_namespace(process_node)


@pytest.fixture
async def deployer(process_node: Testbed, namespace: str) -> AsyncIterator[Any]:
    made = InferenceServiceDeployer(
        namespace=namespace, credentials=KubeconfigFile(str(process_node.kubeconfig))
    )
    yield made
    await made.close()


def predict(url: str, payload: dict[str, Any]) -> list[list[float]]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        (output,) = json.loads(answer.read())["outputs"]
    width = int(output["shape"][1])
    data = [float(x) for x in output["data"]]
    return [data[i : i + width] for i in range(0, len(data), width)]


def service(
    registry: ModelRegistry, model: str, version: str, canary: str | None = None
) -> InferenceServiceSpec:
    resolved = registry.resolve(f"models:/{model}/{version}")
    assert resolved.storage_uri.startswith("file://")
    candidate = None
    if canary is not None:
        location = registry.resolve(f"models:/{model}/{canary}").storage_uri
        candidate = Canary(location, traffic_percent=50, link=ModelLink(model, canary))
    return InferenceServiceSpec(
        name="clf",
        storage_uri=resolved.storage_uri,
        runtime="kserve-mlserver",
        link=ModelLink(model, version),
        canary=candidate,
        **ON_THE_PROCESS_NODE,
    )


async def test_kserves_own_predictor_pod_serves_then_a_version_mlserver_cannot_load_rolls_back(
    process_node: Testbed,
    kube: KubeClient,
    namespace: str,
    deployer: InferenceServiceDeployer,
    mlflow_server: MlflowServer,
    versions: Versions,
) -> None:
    registry = ModelRegistry(
        mlflow_server.url, artifact_destination=mlflow_server.artifact_destination
    )
    first = await asyncio.to_thread(registry.evaluate, versions.model, "1", POLICY)
    assert first.promoted

    outcome = await deployer.deploy(service(registry, versions.model, "1"), timeout_s=480)
    assert outcome.runtime == "kserve-mlserver"

    # KServe's own objects: its Deployment's template has no init container; the pod has the
    # one KServe's pod mutator injected, and ran it (and MLServer) on the process node.
    deployment = await kube.get(DEPLOYMENTS, namespace, "clf-predictor")
    assert not deployment["spec"]["template"]["spec"].get("initContainers")
    listed = await kube.list(
        PODS, namespace, label_selector="serving.kserve.io/inferenceservice=clf"
    )
    (pod,) = [p for p in listed.items if not p["metadata"].get("deletionTimestamp")]
    assert pod["spec"]["nodeName"].startswith("process-node")
    (init,) = pod["spec"]["initContainers"]
    assert (init["name"], init["image"]) == (
        "storage-initializer",
        "kserve/storage-initializer:v0.20.0",
    )
    assert init["args"][0] == outcome.storage_uri
    done = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert (done["exitCode"], done["reason"]) == (0, "Completed")
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "docker.io/seldonio/mlserver:1.7.1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["MLSERVER_MODEL_NAME"], env["MLSERVER_MODEL_URI"]) == ("clf", "/mnt/models")
    assert env["MLSERVER_MODEL_IMPLEMENTATION"] == "mlserver_mlflow.MLflowRuntime"
    # Ready came from the model's own readiness endpoint, probed for real by the node.
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/models/clf/ready"
    assert pod["status"]["containerStatuses"][0]["ready"] is True

    forward = await forwarded(process_node, namespace, "clf-predictor", ready=True)
    assert forward is not None
    url = f"{forward.url}/v2/models/clf/infer"
    served = await asyncio.to_thread(predict, url, v2_request(POINTS))
    for row, expected in zip(served, versions.logits, strict=True):
        assert row == pytest.approx(expected, abs=1e-5)  # the model's own numbers

    # Version 2 passes the gate (better accuracy) but MLServer cannot load it.
    second = await asyncio.to_thread(registry.evaluate, versions.model, "2", POLICY)
    assert second.promoted
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(
            service(registry, versions.model, "2"),
            timeout_s=600,
            on_rollback=lambda: registry.restore_alias(second),
        )
    error = caught.value
    assert error.rolled_back
    assert not error.timed_out, error.message
    assert error.reason == "CrashLoopBackOff", error.message
    assert 'MlflowException: Model does not have the "python_function" flavor' in error.message
    assert "the previous spec was restored and is Ready again" in error.message
    champion = await asyncio.to_thread(registry.resolve, f"models:/{versions.model}@champion")
    assert champion.version == "1"
    live = await kube.get(INFERENCE_SERVICES, namespace, "clf")
    assert live["spec"]["predictor"]["model"]["storageUri"] == outcome.storage_uri

    forward = await forwarded(process_node, namespace, "clf-predictor", ready=True)
    assert forward is not None
    again = await asyncio.to_thread(
        predict, f"{forward.url}/v2/models/clf/infer", v2_request(POINTS)
    )
    for row, expected in zip(again, versions.logits, strict=True):
        assert row == pytest.approx(expected, abs=1e-5)


async def stable_pods(kube: KubeClient, namespace: str) -> set[str]:
    """The uids of the stable predictor's pods (KServe's ``app`` label), not being deleted."""
    listed = await kube.list(PODS, namespace, label_selector="app=isvc.clf-predictor")
    return {
        p["metadata"]["uid"] for p in listed.items if not p["metadata"].get("deletionTimestamp")
    }


async def test_a_canary_on_real_pods_is_promoted_when_it_passes_and_rolled_back_when_not(
    process_node: Testbed,
    kube: KubeClient,
    namespace: str,
    deployer: InferenceServiceDeployer,
    mlflow_server: MlflowServer,
    versions: Versions,
) -> None:
    registry = ModelRegistry(
        mlflow_server.url, artifact_destination=mlflow_server.artifact_destination
    )
    model = versions.model
    requests = [[point] for point in POINTS * 4]  # 12 requests of one row each
    check = CanaryCheck(min_requests=len(requests), max_difference=1e-4)

    def address(name: str) -> str:  # each Service through the process node's forwarder
        return f"http://{service_address(process_node.layout, namespace, name)}"

    def on_event(event: InferenceServiceEvent) -> None:
        seen.append(event.event)

    seen: list[str] = []
    first = await asyncio.to_thread(registry.evaluate, model, "1", POLICY)
    assert first.promoted
    await deployer.deploy(service(registry, model, "1"), timeout_s=480)

    # A good candidate: version 4 (version 1's network, a better score) next to version 1.
    good = await asyncio.to_thread(registry.evaluate, model, "4", POLICY)
    assert good.promoted
    outcome = await arun_canary(
        deployer,
        service(registry, model, "1", canary="4"),
        requests,
        check=check,
        address=address,
        timeout_s=480,
        on_event=on_event,
        on_rollback=lambda: registry.restore_alias(good),
    )
    assert outcome.promoted, outcome.verdict.reason
    # The same requests went to both predictors' pods, which answered with their own numbers.
    for answers in (outcome.stable, outcome.candidate):
        for row, expected in zip(answers, versions.logits * 4, strict=True):
            assert row == pytest.approx(expected, abs=1e-5)
    # Deployed with the canary, then the candidate alone (no rollback).
    assert seen == ["kubedl.inference-service.applied", "kubedl.inference-service.ready"] * 2
    live = await kube.get(INFERENCE_SERVICES, namespace, "clf")
    assert not live["spec"].get("canary")
    assert live["spec"]["predictor"]["model"]["storageUri"] == outcome.serving.storage_uri
    assert outcome.serving.storage_uri == registry.resolve(f"models:/{model}/4").storage_uri
    champion = await asyncio.to_thread(registry.resolve, f"models:/{model}@champion")
    assert champion.version == "4"

    # A bad candidate: version 3 (other weights) passes the gate, but its answers differ from
    # the champion's by more than max_difference: rolled back, alias restored.
    bad = await asyncio.to_thread(registry.evaluate, model, "3", POLICY)
    assert bad.promoted
    champion_pods = await stable_pods(kube, namespace)
    assert champion_pods
    seen.clear()
    outcome = await arun_canary(
        deployer,
        service(registry, model, "4", canary="3"),
        requests,
        check=check,
        address=address,
        timeout_s=480,
        on_event=on_event,
        on_rollback=lambda: registry.restore_alias(bad),
    )
    assert not outcome.promoted
    assert "differ from the stable model's" in outcome.verdict.reason, outcome.verdict.reason
    for row, expected in zip(outcome.candidate, versions.other_logits * 4, strict=True):
        assert row == pytest.approx(expected, abs=1e-5)  # the candidate answered, differently
    live = await kube.get(INFERENCE_SERVICES, namespace, "clf")
    assert not live["spec"].get("canary")
    assert live["spec"]["predictor"]["model"]["storageUri"] == champion.storage_uri
    assert outcome.serving.storage_uri == champion.storage_uri
    restored = await asyncio.to_thread(registry.resolve, f"models:/{model}@champion")
    assert restored.version == "4"
    # The champion still answers, and the candidate's Service is gone.
    forward = await forwarded(process_node, namespace, "clf-predictor", ready=True)
    assert forward is not None
    served = await asyncio.to_thread(
        predict, f"{forward.url}/v2/models/clf/infer", v2_request(POINTS)
    )
    for row, expected in zip(served, versions.logits, strict=True):
        assert row == pytest.approx(expected, abs=1e-5)
    await forwarded(process_node, namespace, "clf-canary-predictor", ready=False, within_s=120)
    # The champion's pods served throughout: the canary came and went without replacing them.
    assert await stable_pods(kube, namespace) == champion_pods

    # A candidate that errors: version 2 (MLServer cannot load it) crash-loops in the canary's
    # pod, so the deployment with the canary fails and is rolled back before any traffic.
    broken = await asyncio.to_thread(registry.evaluate, model, "2", POLICY)
    assert broken.promoted
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await arun_canary(
            deployer,
            service(registry, model, "4", canary="2"),
            requests,
            check=check,
            address=address,
            timeout_s=600,
            on_rollback=lambda: registry.restore_alias(broken),
        )
    assert caught.value.rolled_back
    assert caught.value.reason == "CrashLoopBackOff", caught.value.message
    assert "the previous spec was restored and is Ready again" in caught.value.message
    live = await kube.get(INFERENCE_SERVICES, namespace, "clf")
    assert not live["spec"].get("canary")
    assert live["spec"]["predictor"]["model"]["storageUri"] == champion.storage_uri
    restored = await asyncio.to_thread(registry.resolve, f"models:/{model}@champion")
    assert restored.version == "4"
