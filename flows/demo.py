r"""The demo (``make demo``): the whole chain on this machine, in one Prefect flow run.

``python flows/demo.py`` (what ``scripts/demo`` runs) starts a local Prefect server and a local
MLflow tracking server (SQLite, 127.0.0.1, state under ``.demo/``), saves a
:class:`~kubedl_prefect.prefect.blocks.LocalCluster` block (the embedded default: replicas as local
processes) and runs the ``train-and-serve`` flow with ``serve="local"``:

1. the example's 2-replica PyTorch DDP training (``examples/train/pytorch-ddp-cpu.yaml``, gloo on
   the CPU), logging to MLflow through the handoff;
2. registration of the model as a version of ``ddp-spirals``, with its lineage;
3. the gate on ``val_accuracy`` against the ``champion`` alias;
4. the InferenceService manifest, rendered and validated (written to ``.demo/``);
5. local serving of the version by MLServer (the runtime KServe's ``kserve-mlserver`` runs) and
   one prediction;

then prints the Prefect flow-run URL, the MLflow run and model-version URLs and the prediction.
``--keep-servers`` leaves the Prefect, MLflow and model servers running (``--stop`` stops them
later); otherwise they are stopped at the end, and nothing of the demo is left running.
A second run reuses the installed environments and the state under ``.demo/``: its candidate is
gated against the first run's champion, and the champion is what is served.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
STATE = REPO / ".demo"
SERVERS_FILE = STATE / "servers.json"
EXAMPLE = REPO / "examples" / "train" / "pytorch-ddp-cpu.yaml"
MODEL_NAME = "ddp-spirals"
SERVICE_NAME = "ddp-spirals"
POINTS = [[0.0, 0.1], [0.5, -0.5], [-0.3, 0.2]]
START_TIMEOUT_S = 240.0


def say(text: str) -> None:
    """One progress line of the demo (its own lines stand out from the flow's logs)."""
    print(f"==> {text}", flush=True)


@contextlib.contextmanager
def step(text: str) -> Iterator[None]:
    """Say what starts, and how long it took when it is done."""
    say(f"{text} ...")
    started = time.monotonic()
    yield
    say(f"{text}: done in {time.monotonic() - started:.0f} s")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# -- the Prefect and MLflow servers -----------------------------------------------------------


@dataclass
class Server:
    """A server process of the demo (its own session), found again through ``servers.json``."""

    name: str
    pid: int
    create_time: float
    url: str
    health: str
    log: str

    def alive(self) -> bool:
        """Whether the process that was started is still there (not a reused pid)."""
        try:
            process = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return False
        return abs(process.create_time() - self.create_time) < 0.01

    def healthy(self) -> bool:
        """Whether it answers its health endpoint."""
        try:
            return httpx.get(f"{self.url}{self.health}", timeout=3.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Its whole process tree: SIGTERM, then SIGKILL after 15 s; returns once none is left."""
        if not self.alive():
            return
        root = psutil.Process(self.pid)
        tree = [root, *root.children(recursive=True)]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGTERM)
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
        _, alive = psutil.wait_procs(tree, timeout=15)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive, timeout=5)


def start_server(
    name: str,
    command: list[str],
    *,
    url: str,
    health: str,
    env: dict[str, str],
    state: Path = STATE,
) -> Server:
    """Start ``command`` in a session of its own, logging to ``<state>/<name>.log``."""
    log = state / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            command,
            cwd=state,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(
        name, process.pid, psutil.Process(process.pid).create_time(), url, health, str(log)
    )
    return server


def wait_healthy(servers: Sequence[Server], timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until every server answers its health endpoint; a server that exits fails loudly."""
    deadline = time.monotonic() + timeout_s
    waiting = list(servers)
    while waiting:
        for server in list(waiting):
            if server.healthy():
                waiting.remove(server)
            elif not server.alive() or time.monotonic() > deadline:
                tail = "\n".join(Path(server.log).read_text(errors="replace").splitlines()[-30:])
                for other in servers:
                    other.stop()
                raise SystemExit(
                    f"the {server.name} server did not come up; its log ends with:\n{tail}"
                )
        time.sleep(0.5)


def start_servers() -> dict[str, Server]:
    """The demo's Prefect and MLflow servers: the kept ones when they still answer, else new.

    New ones are started, not waited for (:func:`wait_healthy`): they boot while the demo
    imports what it needs.
    """
    kept = load_servers()
    if kept and all(s.alive() and s.healthy() for s in kept.values() if s.name != "model"):
        say(f"reusing the kept servers: Prefect {kept['prefect'].url}, MLflow {kept['mlflow'].url}")
        return kept
    for server in kept.values():
        server.stop()
    return {"prefect": start_prefect(), "mlflow": start_mlflow()}


def start_prefect(state: Path = STATE) -> Server:
    """A Prefect server on 127.0.0.1 (a free port), its database under ``<state>/prefect``."""
    bin_dir = Path(sys.executable).parent
    prefect_port = free_port()
    (state / "prefect").mkdir(parents=True, exist_ok=True)
    return start_server(
        "prefect",
        [
            str(bin_dir / "prefect"),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(prefect_port),
        ],
        url=f"http://127.0.0.1:{prefect_port}",
        health="/api/health",
        env={
            "PREFECT_HOME": str(state / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_API_URL": f"http://127.0.0.1:{prefect_port}/api",
        },
        state=state,
    )


def start_mlflow(state: Path = STATE, host: str = "127.0.0.1") -> Server:
    """An MLflow server on ``host`` (a free port): SQLite and artifacts under ``<state>/mlflow``.

    On another address than loopback (a test bed's pod gateway) MLflow is told to accept that
    ``Host`` header too: MLflow 3 refuses others than loopback's and the private ranges'.
    """
    bin_dir = Path(sys.executable).parent
    mlflow_port = free_port(host)
    (state / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    allowed = [] if host == "127.0.0.1" else ["--allowed-hosts", f"{host},{host}:*"]
    return start_server(
        "mlflow",
        [
            str(bin_dir / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{state / 'mlflow' / 'mlflow.db'}",
            "--artifacts-destination",
            (state / "mlflow" / "artifacts").as_uri(),
            "--host",
            host,
            "--port",
            str(mlflow_port),
            "--workers",
            "1",
            *allowed,
        ],
        url=f"http://{host}:{mlflow_port}",
        health="/health",
        env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        state=state,
    )


def load_servers(state: Path = STATE) -> dict[str, Server]:
    """The servers a ``--keep-servers`` run left (those still alive)."""
    servers_file = state / SERVERS_FILE.name
    if not servers_file.exists():
        return {}
    data = json.loads(servers_file.read_text())
    servers = {name: Server(**fields) for name, fields in data.items()}
    return {name: server for name, server in servers.items() if server.alive()}


def save_servers(servers: dict[str, Server], state: Path = STATE) -> None:
    """Record the servers, so that the next run (or ``--stop``) finds them."""
    servers_file = state / SERVERS_FILE.name
    servers_file.write_text(json.dumps({n: vars(s) for n, s in servers.items()}, indent=2))


def stop_servers(state: Path = STATE) -> None:
    """Stop every server of the demo (kept or not); forget them."""
    for server in load_servers(state).values():
        server.stop()
        say(f"stopped the {server.name} server")
    (state / SERVERS_FILE.name).unlink(missing_ok=True)


# -- the chain --------------------------------------------------------------------------------


@dataclass
class Summary:
    """What the demo prints at the end."""

    flow_run_id: str
    phase: str
    attempts: int
    model_uri: str
    run_id: str
    experiment_id: str
    decision: str
    served_uri: str
    infer_url: str
    prediction: list[list[float]]
    manifest_path: Path
    applied: str = ""


def demo_spec(epochs: int) -> dict[str, Any]:
    """The example's spec, with the demo's number of epochs."""
    from kubedl_prefect.spec import load_spec, spec_to_data

    spec = load_spec(EXAMPLE)
    return spec_to_data(spec.model_copy(update={"args": ["--epochs", str(epochs)]}))


def chain_flow() -> Callable[..., Any]:
    """The ``train-and-serve`` flow of flows/train_and_serve.py (importing it imports Prefect)."""
    sys.path.insert(0, str(REPO))
    from flows.train_and_serve import train_and_serve

    return train_and_serve


def run_chain(
    tracking: str,
    artifact_destination: str,
    epochs: int,
    *,
    state: Path = STATE,
    testbed: str | None = None,
) -> tuple[Summary, Any]:
    """Run the flow on a local cluster block; return the summary and the (running) model server.

    Args:
        tracking: The MLflow tracking server.
        artifact_destination: What its ``mlflow-artifacts:/`` stands for (its
            ``--artifacts-destination``).
        epochs: Training epochs.
        state: Where the local jobs and the manifest go.
        testbed: The test bed to apply the InferenceService to, if it runs (``None``: none).
    """
    from kubedl_prefect.prefect import MlflowRegistry
    from kubedl_prefect.prefect.blocks import LocalCluster
    from kubedl_prefect.serving.local import serve_locally

    LocalCluster(workspace=str(state / "local"), working_dir=str(REPO)).save("demo", overwrite=True)
    # The server proxies artifacts: the registry block maps mlflow-artifacts:/ to the folder.
    MlflowRegistry(
        tracking_uri=tracking, artifact_destination=artifact_destination, experiment="demo"
    ).save("demo", overwrite=True)
    train_and_serve = chain_flow()
    ended = train_and_serve(
        spec=demo_spec(epochs),
        cluster="kubedl-local-cluster/demo",
        model_name=MODEL_NAME,
        registry="demo",
        metric="val_accuracy",
        name=SERVICE_NAME,
        serve="local",
        return_state=True,
    )
    flow_run_id = str(ended.state_details.flow_run_id)
    if not ended.is_completed():
        raise SystemExit(f"the flow run {flow_run_id} ended {ended.name}: {ended.message}")
    result = ended.result()
    server = result.local
    if server is None:  # kept out by the gate: the champion stays the one served
        served = f"models:/{MODEL_NAME}@champion"
        say(f"{result.version.model_uri} was kept out by the gate; serving the champion")
        server = serve_locally(served, tracking_uri=tracking, name=SERVICE_NAME)
    try:
        answer = server.predict(POINTS)
    except BaseException:
        server.stop()
        raise
    (output,) = answer["outputs"]
    width = output["shape"][1]
    rows = [output["data"][i : i + width] for i in range(0, len(output["data"]), width)]
    manifest = state / "inferenceservice.yaml"
    import yaml

    manifest.write_text(yaml.safe_dump(result.manifest, sort_keys=False))
    verdict = "promoted" if result.decision.promoted else "kept out"
    summary = Summary(
        flow_run_id=flow_run_id,
        phase=result.training.phase,
        attempts=len(result.training.attempts),
        model_uri=result.version.model_uri,
        run_id=result.version.run_id or "",
        experiment_id=experiment_of(tracking, result.version.run_id),
        decision=f"{verdict}: {result.decision.reason}",
        served_uri=server.model_uri,
        infer_url=server.infer_url,
        prediction=rows,
        manifest_path=manifest,
        applied=apply_to_testbed(result.manifest, testbed) if testbed else "not applied",
    )
    return summary, server


def experiment_of(tracking: str, run_id: str | None) -> str:
    """The experiment of the MLflow run ``run_id`` (for its URL); empty without a run."""
    if not run_id:
        return ""
    answer = httpx.get(f"{tracking}/api/2.0/mlflow/runs/get", params={"run_id": run_id})
    answer.raise_for_status()
    return str(answer.json()["run"]["info"]["experiment_id"])


def summary_lines(
    summary: Summary,
    servers: dict[str, Server],
    elapsed_s: float,
    *,
    replicas: str = "2 replicas, DDP",
) -> list[str]:
    """The summary's lines from its title to the prediction (the Kubernetes demo's too)."""
    prefect, mlflow = servers["prefect"].url, servers["mlflow"].url
    version = summary.model_uri.rsplit("/", 1)[-1]
    classes = [max(range(len(row)), key=row.__getitem__) for row in summary.prediction]
    return [
        "",
        f"demo done in {elapsed_s:.0f} s",
        f"  training        {summary.phase} after {summary.attempts} attempt(s) ({replicas})",
        f"  Prefect run     {prefect}/runs/flow-run/{summary.flow_run_id}",
        f"  MLflow run      {mlflow}/#/experiments/{summary.experiment_id}/runs/{summary.run_id}",
        f"  model version   {mlflow}/#/models/{MODEL_NAME}/versions/{version}",
        f"  gate            {summary.decision}",
        f"  served          {summary.served_uri} at {summary.infer_url}",
        f"  prediction      {POINTS} -> classes {classes}",
        f"                  logits {[[round(v, 3) for v in row] for row in summary.prediction]}",
    ]


def print_summary(summary: Summary, servers: dict[str, Server], elapsed_s: float) -> None:
    """The short summary: where to look, and the prediction."""
    lines = summary_lines(summary, servers, elapsed_s)
    lines.append(
        f"  InferenceService {summary.manifest_path.relative_to(REPO)} (rendered and validated;"
        f" {summary.applied})"
    )
    print("\n".join(lines), flush=True)


def apply_to_testbed(manifest: dict[str, Any], name: str) -> str:
    """Apply the InferenceService to the test bed ``name``, if it runs; say what happened.

    Server-side apply, with
    the API server's own validation (strict fields, KServe's schema); nothing waits for it to be
    Ready (the test bed's nodes run no containers).
    """
    import asyncio

    from kubedl_prefect.errors import KubeDLPrefectError
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.kube.resources import INFERENCE_SERVICES
    from kubedl_prefect.testbed.testbed import Testbed

    status = Testbed(name).status()
    if status.stopped:
        return f"not applied: no test bed {name!r} is running"
    if not status.up:
        unhealthy = ", ".join(c.name for c in status.components if not c.healthy)
        return f"not applied: test bed {name!r} is not healthy ({unhealthy})"
    namespace = manifest["metadata"].get("namespace", "default")

    async def apply() -> None:
        client = await KubeClient.from_kubeconfig(str(status.kubeconfig))
        try:
            await client.apply(
                INFERENCE_SERVICES, namespace, manifest, field_manager="kubedl-prefect-demo"
            )
        finally:
            await client.close()

    try:
        asyncio.run(apply())
    except KubeDLPrefectError as exc:
        return f"not applied to test bed {name!r}: {exc.message}"
    return f"applied to test bed {name!r} (namespace {namespace})"


def drain_prefect() -> None:
    """Send the flow run's last logs and events while the Prefect server is still there.

    Left to the interpreter's exit, Prefect's workers would retry a server the demo has stopped.
    """
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    EventsWorker.drain_all(timeout=30)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 when the chain ran and the prediction came back."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep-servers", action="store_true", help="leave the servers running")
    parser.add_argument("--stop", action="store_true", help="stop servers a run kept, and exit")
    parser.add_argument("--epochs", type=int, default=6, help="training epochs (default 6)")
    args = parser.parse_args(argv)
    # A terminated demo stops what it started too (the `finally` below), as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    STATE.mkdir(exist_ok=True)
    if args.stop:
        stop_servers()
        return 0
    started = time.monotonic()
    kept = load_servers().pop("model", None)
    if kept is not None:
        kept.stop()  # the model server of a kept run serves an older version
    say("starting the Prefect and MLflow servers (SQLite, 127.0.0.1, state in .demo/) ...")
    servers = start_servers()
    os.environ["PREFECT_API_URL"] = f"{servers['prefect'].url}/api"
    os.environ["PREFECT_HOME"] = str(STATE / "prefect")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["MLFLOW_TRACKING_URI"] = servers["mlflow"].url
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    model_server = None
    try:
        with step("meanwhile: the model server's environment (MLServer), importing the flow"):
            from kubedl_prefect.serving.local import install_server_environment

            install_server_environment()
            chain_flow()  # imports Prefect and the flow
        with step("waiting for the Prefect and MLflow servers to answer"):
            wait_healthy(list(servers.values()))
            save_servers(servers)
        with step(f"running the train-and-serve flow ({args.epochs} epochs, 2 replicas)"):
            summary, model_server = run_chain(
                servers["mlflow"].url,
                (STATE / "mlflow" / "artifacts").as_uri(),
                args.epochs,
                testbed=os.environ.get("KUBEDL_PREFECT_TESTBED", "default"),
            )
        print_summary(summary, servers, time.monotonic() - started)
    finally:
        drain_prefect()
        if args.keep_servers:
            if model_server is not None:
                servers["model"] = Server(
                    "model",
                    model_server.pid,
                    psutil.Process(model_server.pid).create_time(),
                    model_server.url,
                    f"/v2/models/{SERVICE_NAME}/ready",
                    str(model_server.log_path),
                )
            save_servers(servers)
            say("servers kept running; stop them with `scripts/demo --stop`")
            if model_server is not None:
                say(
                    f"try: curl -s -H 'content-type: application/json' {model_server.infer_url} -d "
                    """'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", """
                    """"data": [0.5, -0.5]}]}'"""
                )
        else:
            if model_server is not None:
                model_server.stop()
            for server in servers.values():
                server.stop()
            SERVERS_FILE.unlink(missing_ok=True)
            say("servers stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
