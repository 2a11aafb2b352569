"""KServe's predictor containers on the process node: storage initializer, then MLServer.

A pod shaped as KServe v0.20 shapes a Standard-mode predictor of an ``mlflow`` model (its pod
mutator's ``storage-initializer`` init container filling the ``kserve-provision-location``
emptyDir at ``/mnt/models``, the ``kserve-mlserver`` runtime's container with the environment its
defaulter sets) runs on the process node from KServe's own image names: the local storage
initializer copies the saved model in, MLServer loads it, its readiness probe makes the pod
Ready, and a V2 prediction through the Service's forwarder answers with the model's numbers.
A model no runtime can load keeps the pod unready, with MLServer's own error in its log.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PODS, SERVICES
from kubedl_prefect.serving.local import install_server_environment, v2_request
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.process_node.test_process_pods import log_of, pod, status_of, wait_pod
from tests.integration.process_node.test_process_probes import ready_is
from tests.integration.process_node.test_process_services import forwarded

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(420)]

POINTS = [[0.0, 0.1], [0.5, -0.5], [-0.3, 0.2]]
#: The images KServe v0.20 names (its ConfigMap's storage initializer, the runtime's MLServer).
STORAGE_INITIALIZER = "kserve/storage-initializer:v0.20.0"
MLSERVER = "docker.io/seldonio/mlserver:1.7.1"


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """An MLflow PyTorch model saved in a folder (a ``file://`` storageUri); its logits."""
    import mlflow
    import torch
    from mlflow.models import infer_signature

    install_server_environment()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    example = torch.tensor(POINTS, dtype=torch.float32)
    with torch.no_grad():
        logits = model(example)
    folder = tmp_path_factory.mktemp("store") / "model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlflow.pytorch.save_model(
            model,
            str(folder),
            signature=infer_signature(example.numpy(), logits.numpy()),
            serialization_format="pickle",
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "mlflow"],
        )
    return folder, logits.tolist()


def predictor_pod(name: str, storage_uri: str) -> dict[str, Any]:
    """The predictor pod KServe's controller and webhooks make for an mlflow model."""
    body = pod(
        f"{name}-predictor",
        [
            {
                "name": "kserve-container",
                "image": MLSERVER,
                "env": [
                    {
                        "name": "MLSERVER_MODEL_IMPLEMENTATION",
                        "value": "mlserver_mlflow.MLflowRuntime",
                    },
                    {"name": "MLSERVER_HTTP_PORT", "value": "8080"},
                    {"name": "MLSERVER_GRPC_PORT", "value": "9000"},
                    {"name": "MLSERVER_MODEL_NAME", "value": name},
                    {"name": "MLSERVER_MODEL_URI", "value": "/mnt/models"},
                ],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {
                    "httpGet": {"path": f"/v2/models/{name}/ready", "port": "http"},
                    "periodSeconds": 2,
                },
                "volumeMounts": [
                    {
                        "name": "kserve-provision-location",
                        "mountPath": "/mnt/models",
                        "readOnly": True,
                    }
                ],
            }
        ],
        restart_policy="Always",
        init=[
            {
                "name": "storage-initializer",
                "image": STORAGE_INITIALIZER,
                "args": [storage_uri, "/mnt/models"],
                "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt/models"}],
            }
        ],
        volumes=[{"name": "kserve-provision-location", "emptyDir": {}}],
        labels={"serving.kserve.io/inferenceservice": name},
    )
    return body


def predict(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


async def test_mlserver_serves_the_saved_model_through_the_service(
    kube: KubeClient, namespace: str, process_node: Testbed, saved_model: tuple[Path, Any]
) -> None:
    folder, logits = saved_model
    await kube.create(PODS, namespace, predictor_pod("tiny", f"file://{folder}"))
    await kube.create(
        SERVICES,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "tiny-predictor"},
            "spec": {
                "selector": {"serving.kserve.io/inferenceservice": "tiny"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            },
        },
    )

    ready = await wait_pod(kube, namespace, "tiny-predictor", ready_is(True), within_s=300)
    init = ready["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert (init["exitCode"], init["reason"]) == (0, "Completed")
    fetched = await log_of(kube, namespace, "tiny-predictor", "storage-initializer")
    assert any(f"Successfully copied file://{folder} to /mnt/models" in line for line in fetched)
    assert status_of(ready, "kserve-container")["ready"] is True

    forward = await forwarded(process_node, namespace, "tiny-predictor", ready=True)
    assert forward is not None
    answer = await asyncio.to_thread(
        predict, f"{forward.url}/v2/models/tiny/infer", v2_request(POINTS)
    )
    (output,) = answer["outputs"]
    rows = [output["data"][i * 3 : i * 3 + 3] for i in range(3)]
    for row, expected in zip(rows, logits, strict=True):
        assert row == pytest.approx(expected, abs=1e-5)


async def test_a_model_mlserver_cannot_load_keeps_the_pod_unready_with_its_error(
    kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "MLmodel").write_text("flavors:\n  no_such_flavor: {}\n")
    await kube.create(PODS, namespace, predictor_pod("broken", f"file://{broken}"))

    running = await wait_pod(kube, namespace, "broken-predictor", ready_is(False), within_s=120)
    assert running["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0

    async def mlserver_error() -> list[str]:
        while True:
            lines = await log_of(kube, namespace, "broken-predictor", "kserve-container")
            found = [line for line in lines if "MlflowException:" in line]
            if found:
                return found
            await asyncio.sleep(2)

    errors = await asyncio.wait_for(mlserver_error(), 240)
    assert 'MlflowException: Model does not have the "python_function" flavor' in errors[0]
    current = await kube.get(PODS, namespace, "broken-predictor")
    assert status_of(current, "kserve-container")["ready"] is False
