"""The example training program on the local backend: real PyTorch DDP (gloo), real MLflow.

Needs the ``torch`` extra: when torch is missing, the session installs it into this
environment (``uv sync --inexact --extra torch``) or fails saying how to; it never skips.
The MLflow side is a real tracking store (SQLite) and registry, through
:class:`~kubedl_prefect.registry.mlflow_registry.ModelRegistry` and the handoff contract.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kubedl_prefect.errors import FailureCategory
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.local import LocalBackend, LocalCapacity
from kubedl_prefect.lifecycle.retry import RetryPolicy, arun_to_completion
from kubedl_prefect.spec import TrainingJobSpec, load_spec
from kubedl_prefect.spec.handoff import with_handoff
from tests.support.mlflow_server import MlflowServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train" / "pytorch-ddp-cpu.yaml"
FAST_RETRY = RetryPolicy(max_attempts=3, backoff_s=0.0)


@pytest.fixture(scope="session")
def torch_installed() -> None:
    """Torch in this environment: installed here if missing (the replicas import it)."""
    if importlib.util.find_spec("torch") is not None:
        return
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("torch is not installed and uv is not on PATH: run `uv sync --extra torch`")
    done = subprocess.run(
        [uv, "sync", "--inexact", "--extra", "torch"], cwd=REPO, capture_output=True, text=True
    )
    importlib.invalidate_caches()
    if done.returncode != 0 or importlib.util.find_spec("torch") is None:
        pytest.fail(f"could not install torch (`uv sync --extra torch`):\n{done.stderr[-3000:]}")


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ws"
    yield path
    leftovers = []
    for state_file in path.glob("jobs/*/state.json"):
        state = json.loads(state_file.read_text())
        for who in [state.get("supervisor")] + [r.get("process") for r in state["replicas"]]:
            if who and psutil.pid_exists(who["pid"]):
                process = psutil.Process(who["pid"])
                if abs(process.create_time() - who["createTime"]) < 0.01:
                    leftovers.append(process)
    _, alive = psutil.wait_procs(leftovers, timeout=10)
    for process in alive:
        process.kill()
    assert not alive, f"processes left running: {alive}"


def example(epochs: int, pause_s: float = 0.0) -> TrainingJobSpec:
    spec = load_spec(EXAMPLE)
    return spec.model_copy(
        update={"args": ["--epochs", str(epochs), "--epoch-pause-s", str(pause_s)]}
    )


def backend_for(workspace: Path, tmp_path: Path) -> LocalBackend:
    return LocalBackend(
        workspace,
        capacity=LocalCapacity(processes=2, cpus=2, memory_bytes=4 * 2**30),
        working_dir=tmp_path,
        env={"MLFLOW_DISABLE_TELEMETRY": "true"},
    )


# MLflow's advice about its own pyfunc wrapper's type hints, raised while loading the model.
@pytest.mark.filterwarnings("ignore:.*type hint is inferred as AnyType")
def test_two_replicas_train_hand_the_model_to_mlflow_and_it_is_registered_and_predicts(
    torch_installed: None,
    workspace: Path,
    tmp_path: Path,
    mlflow_server: MlflowServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mlflow
    import numpy as np
    from mlflow import MlflowClient

    from kubedl_prefect.registry.compat import KSERVE_MLSERVER
    from kubedl_prefect.registry.mlflow_registry import ModelRegistry

    tracking = mlflow_server.url
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    registry = ModelRegistry(tracking, artifact_destination=mlflow_server.artifact_destination)
    spec = example(epochs=4)
    handoff = registry.start_run(spec, key="first", experiment="ddp-local")
    backend = backend_for(workspace, tmp_path)
    lines: list[str] = []

    async def run() -> None:
        job = with_handoff(spec, handoff)
        outcome = await arun_to_completion(backend, job, key="first", retry=FAST_RETRY)
        await backend.follow_logs(
            outcome.ref, lambda line: lines.append(f"{line.replica} {line.text}")
        )
        assert outcome.succeeded
        version = registry.register(handoff, outcome, job, model_name="ddp-spirals")
        assert version.status == "READY"
        model = mlflow.pyfunc.load_model(version.model_uri)
        points = np.array([[0.0, 0.1], [0.5, -0.5], [-0.3, 0.2]], dtype=np.float32)
        logits = np.asarray(model.predict(points))
        assert logits.shape == (3, 3)
        assert np.isfinite(logits).all()
        resolved = registry.resolve(version.model_uri)
        assert registry.model_facts(resolved).flavors["pytorch"].serialization_format == "pickle"
        issues = registry.check_compatible(resolved, KSERVE_MLSERVER)  # raises on errors
        assert all(not issue.error for issue in issues)

    asyncio.run(run())
    assert any(line.startswith("worker-0 rank 1: starting from scratch") for line in lines)
    assert any("epoch 3 done" in line and line.startswith("master-0") for line in lines)
    run_data = MlflowClient(tracking).get_run(handoff.run_id).data
    assert run_data.params["epochs"] == "4"
    history = MlflowClient(tracking).get_metric_history(handoff.run_id, "val_accuracy")
    assert [m.step for m in history] == [0, 1, 2, 3]
    assert history[-1].value > 0.9  # the spirals are learnt, not guessed (1/3)


@pytest.mark.long  # a fault scenario of 34 s, with the restart scenarios in the second phase
def test_a_replica_killed_with_sigkill_mid_run_is_retried_and_the_epochs_continue(
    torch_installed: None, workspace: Path, tmp_path: Path
) -> None:
    spec = example(epochs=6, pause_s=2.0)
    backend = backend_for(workspace, tmp_path)
    attempts: list[JobRef] = []
    # Other tests of this worker may have imported the example; this one must not.
    examples_before = sys.modules.get("kubedl_prefect_examples")

    async def run() -> None:
        submitted = asyncio.Event()

        def on_attempt(ref: JobRef) -> None:
            attempts.append(ref)
            submitted.set()

        task = asyncio.create_task(
            arun_to_completion(backend, spec, key="resume", retry=FAST_RETRY, on_attempt=on_attempt)
        )
        await submitted.wait()
        first = attempts[0]
        job = workspace / "jobs" / first.name
        deadline = time.monotonic() + 240
        while "epoch 1 done" not in (job / "logs" / "master-0.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, "the first attempt did not reach epoch 1"
            assert not task.done(), task
            await asyncio.sleep(0.2)
        state = json.loads((job / "state.json").read_text())
        worker = next(r for r in state["replicas"] if r["name"] == "worker-0")
        os.kill(worker["process"]["pid"], signal.SIGKILL)
        outcome = await task
        assert outcome.succeeded
        assert outcome.ref.attempt == 2

        record = await backend.history(spec, key="resume")
        assert record is not None
        killed = record.get(1)
        assert killed is not None
        assert killed.diagnosis is not None
        assert killed.diagnosis.category == FailureCategory.KILLED
        assert killed.diagnosis.replica == "worker-0"
        lines: list[str] = []
        await backend.follow_logs(outcome.ref, lambda line: lines.append(line.text))
        resumed = [line for line in lines if "resuming from" in line]
        assert len(resumed) == 2  # both ranks of attempt 2
        assert all(int(line.rsplit(" ", 1)[1]) >= 2 for line in resumed)

    asyncio.run(run())
    import torch

    (checkpoints,) = (workspace / "checkpoints").iterdir()
    saved = torch.load(checkpoints / "checkpoint.pt", weights_only=True)  # tensors and plain data
    assert [point["epoch"] for point in saved["history"]] == list(range(6))
    # Only the replicas ran the example: this process imported nothing of it meanwhile.
    assert sys.modules.get("kubedl_prefect_examples") is examples_before


def test_the_rendezvous_of_a_local_job_listens_on_the_loopback_interface_only(
    torch_installed: None, workspace: Path, tmp_path: Path
) -> None:
    # TCPStore's server binds every interface (::) unless handed a bound socket; gloo's pairs
    # bind what the host name resolves to unless GLOO_SOCKET_IFNAME says otherwise.
    spec = example(epochs=3, pause_s=2.0)
    backend = backend_for(workspace, tmp_path)

    async def run() -> dict[int, set[tuple[str, int]]]:
        ref = await backend.submit(spec, key="loopback")
        state_file = workspace / "jobs" / ref.name / "state.json"
        log = workspace / "jobs" / ref.name / "logs" / "master-0.log"
        listening: dict[int, set[tuple[str, int]]] = {}
        deadline = time.monotonic() + 240
        while "epoch 0 done" not in (log.read_text(errors="replace") if log.exists() else ""):
            assert time.monotonic() < deadline, "the job did not reach epoch 0"
            await asyncio.sleep(0.2)
        state = json.loads(state_file.read_text())
        for replica in state["replicas"]:
            process = psutil.Process(replica["process"]["pid"])
            for connection in process.net_connections("inet"):
                if connection.status == psutil.CONN_LISTEN:
                    address = (connection.laddr.ip, connection.laddr.port)
                    listening.setdefault(replica["process"]["pid"], set()).add(address)
        outcome = await backend.wait_completed(ref)
        assert outcome.succeeded, outcome.diagnosis
        return listening

    listening = asyncio.run(run())
    addresses = {address for found in listening.values() for address in found}
    ports = {port for _, port in addresses}
    assert len(listening) == 2  # both replicas listen (gloo), the master for the store too
    assert addresses, "no listening socket was seen"
    assert {ip for ip, _ in addresses} <= {"127.0.0.1", "::1"}, addresses
    assert len(ports) >= 3  # the store's port and a gloo port per replica


def test_a_crafted_checkpoint_is_refused_instead_of_run(
    tmp_path: Path, torch_installed: None
) -> None:
    # A checkpoint is data: loading one must not run code of whoever could write the folder.
    ran = tmp_path / "ran"
    crafted = textwrap.dedent(
        f"""
        import os, torch

        class Payload:
            def __reduce__(self):
                return (os.system, ("touch {ran}",))

        torch.save({{"epoch": 0, "model": Payload()}}, {str(tmp_path / "checkpoint.pt")!r})
        """
    )
    subprocess.run([sys.executable, "-c", crafted], check=True)
    load = (
        "from pathlib import Path; from kubedl_prefect_examples.ddp_train import load_checkpoint; "
        f"load_checkpoint(Path({str(tmp_path)!r}))"
    )
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True)
    assert not ran.exists(), "loading the checkpoint ran its code"
    assert done.returncode != 0
    assert "refusing to load" in done.stderr
