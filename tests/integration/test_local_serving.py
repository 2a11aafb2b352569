"""Local serving for real: MLServer's MLflow runtime serves a registered torch model on loopback.

The last test runs the demo's chain (flows/demo.py, what ``make demo`` runs) with one epoch: the
flow on a LocalCluster block, a real Prefect server (``prefect_test_harness``) and the session's
tracking server.

The model is an ``nn.Sequential`` logged as the example training program logs its model (pickle
format, signature from an example), registered in a real tracking server (SQLite, proxied
artifacts); the server resolves ``models:/`` itself. Needs the ``torch`` extra (installed here
when missing) and the server's own environment (built here when missing: seconds from uv's
cache). Nothing is skipped.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from kubedl_prefect.errors import LocalServerError
from kubedl_prefect.serving.local import (
    LocalModelServer,
    install_server_environment,
    serve_locally,
)
from tests.integration.test_local_ddp import torch_installed
from tests.support.mlflow_server import MlflowServer
from tests.support.prefect_reads import link_artifacts

__all__ = ["torch_installed"]

pytestmark = pytest.mark.integration

POINTS = [[0.0, 0.1], [0.5, -0.5], [-0.3, 0.2]]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def server_environment() -> Path:
    return install_server_environment()


@pytest.fixture(scope="session")
def registered(torch_installed: None, mlflow_server: MlflowServer) -> Iterator[list[list[float]]]:
    """``models:/tiny/1`` on the session's tracking server; yields the model's logits of POINTS."""
    import mlflow
    import torch
    from mlflow.models import infer_signature

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    example = torch.tensor(POINTS, dtype=torch.float32)
    with torch.no_grad():
        logits = model(example)
    mlflow.set_tracking_uri(mlflow_server.url)
    # Not mlflow.set_experiment: its active experiment is process-global and would make every
    # later test that resumes another experiment's run (MLFLOW_RUN_ID) fail.
    experiment = mlflow.MlflowClient().create_experiment(f"local-serving-{uuid.uuid4().hex[:8]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow's advice about pickle and pip versions
        with mlflow.start_run(experiment_id=experiment):
            mlflow.pytorch.log_model(
                model,
                name="model",
                signature=infer_signature(example.numpy(), logits.numpy()),
                input_example=example.numpy(),
                serialization_format="pickle",
                registered_model_name="tiny",
                # Given, not inferred: inference loads the model in a subprocess (a minute here).
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "mlflow"],
            )
    yield logits.tolist()
    mlflow.set_tracking_uri(None)


def process_tree(server: LocalModelServer) -> list[psutil.Process]:
    root = psutil.Process(server.pid)
    return [root, *root.children(recursive=True)]


def test_a_registered_version_is_served_answers_a_v2_prediction_and_stops_without_a_trace(
    server_environment: Path,
    registered: list[list[float]],
    mlflow_server: MlflowServer,
) -> None:
    server = serve_locally(
        "models:/tiny/1",
        tracking_uri=mlflow_server.url,
        name="tiny",
        environment=server_environment,
    )
    try:
        assert server.url.startswith("http://127.0.0.1:")
        tree = process_tree(server)
        metadata = server.metadata()
        assert metadata["name"] == "tiny"
        answer = server.predict(POINTS)
        (output,) = answer["outputs"]
        assert output["shape"] == [3, 3]
        served = [output["data"][i * 3 : i * 3 + 3] for i in range(3)]
        for row, expected in zip(served, registered, strict=True):
            assert row == pytest.approx(expected, abs=1e-5)  # the model's own numbers
        # The V2 request as KServe clients send it gives the same answer.
        request = {
            "inputs": [
                {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": POINTS[1]},
            ]
        }
        (one,) = server.predict(request)["outputs"]
        assert one["data"] == pytest.approx(registered[1], abs=1e-5)
        workdir = server.workdir
    finally:
        server.stop()
    assert not server.running()
    _, alive = psutil.wait_procs(tree, timeout=0)
    assert not alive, f"processes left running: {alive}"
    assert not workdir.exists()  # a temporary workdir goes with the server
    server.stop()  # idempotent


def test_a_version_that_does_not_exist_fails_with_the_servers_log_and_leaves_nothing(
    server_environment: Path,
    registered: list[list[float]],
    mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LocalServerError) as caught:
        serve_locally(
            "models:/tiny/99",
            tracking_uri=mlflow_server.url,
            name="tiny",
            environment=server_environment,
            workdir=tmp_path / "serve",
            ready_timeout_s=120,
        )
    assert "models:/tiny/99" in caught.value.message
    assert "exited" in caught.value.message
    assert caught.value.log_tail  # MLServer's own words about the missing version
    assert (tmp_path / "serve" / "mlserver.log").exists()
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before


def processes_of_workspace(workspace: Path) -> list[psutil.Process]:
    """The supervisors and replicas the workspace's jobs recorded that still run."""
    found = []
    for state_file in workspace.glob("jobs/*/state.json"):
        state = json.loads(state_file.read_text())
        for who in [state.get("supervisor")] + [r.get("process") for r in state["replicas"]]:
            if who and psutil.pid_exists(who["pid"]):
                process = psutil.Process(who["pid"])
                if abs(process.create_time() - who["createTime"]) < 0.01:
                    found.append(process)
    return found


# MLflow's advice about its own pyfunc wrapper's type hints, raised while registering.
@pytest.mark.filterwarnings("ignore:.*type hint is inferred as AnyType")
@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)
def test_the_demo_chain_trains_registers_gates_serves_and_predicts_in_one_flow_run(
    torch_installed: None,
    server_environment: Path,
    mlflow_server: MlflowServer,
    prefect_server: dict[str, str],
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(REPO))
    from flows import demo

    summary, server = demo.run_chain(
        mlflow_server.url, mlflow_server.artifact_destination, epochs=1, state=tmp_path
    )
    try:
        tree = process_tree(server)
        assert summary.phase == "Succeeded"
        assert summary.model_uri.startswith("models:/ddp-spirals/")
        assert summary.decision.startswith("promoted")
        assert summary.served_uri == summary.model_uri
        assert len(summary.prediction) == 3
        assert all(len(row) == 3 for row in summary.prediction)  # three spirals' logits
        assert server.predict(POINTS)["outputs"][0]["shape"] == [3, 3]
        manifest = yaml.safe_load(summary.manifest_path.read_text())
        assert manifest["kind"] == "InferenceService"
        model = manifest["spec"]["predictor"]["model"]
        assert model["modelFormat"] == {"name": "mlflow"}
        assert model["storageUri"].startswith(mlflow_server.artifact_destination)
        assert (
            manifest["metadata"]["labels"]["kubedl-prefect.io/model-version"]
            == (summary.model_uri.rsplit("/", 1)[1])
        )
        # The flow-run page links to the MLflow run, the model version and the endpoint.
        links = asyncio.run(link_artifacts(uuid.UUID(summary.flow_run_id)))
        version = summary.model_uri.rsplit("/", 1)[1]
        assert links["ddp-spirals-mlflow-run"] == f"{mlflow_server.url}/#/runs/{summary.run_id}"
        assert links["ddp-spirals-model-version"] == (
            f"{mlflow_server.url}/#/models/ddp-spirals/versions/{version}"
        )
        assert links["ddp-spirals-endpoint"] == f"{server.url}/v2/models/ddp-spirals"
    finally:
        server.stop()
    _, alive = psutil.wait_procs(tree, timeout=0)
    assert not alive, f"model server processes left running: {alive}"
    left = processes_of_workspace(tmp_path / "local")
    assert not left, f"training processes left running: {left}"
