"""Fault campaign through Prefect (issue 16, item 3, scenarios d-f): the services restart.

``uv run python -m bench.faults_services [--scenario d|e|f|all] [--count N] [--seed S]``

Prefect flows run in this process, as in a worker's flow-run process, against the real test bed
``faults-b`` (kube-apiserver, operators, the KServe controller; kwok pods) and a real Prefect
server and MLflow server, each started here as a process of its own (SQLite, 127.0.0.1, state in
a temporary directory) so that it can be killed. Per scenario, ``--count`` faults:

- **d**: the Prefect server gets SIGKILL (its whole process group) while three flow runs train
  test-bed jobs, and is started again on the same port and database. The kill comes at one of
  four points in turn: *submission* (the flows have started, nothing is submitted yet),
  *waiting* (the jobs exist, their pods are held Pending), *running* (every pod runs),
  *completion* (the pods end about a second after the kill, while the server is down).
  Counted, once every flow run's thread returned and the server had time to record it: flow
  runs left non-final on the server, lost terminal states (the flow's process saw a final state
  the server does not show, or a task run of a finished flow run is left non-final; also the
  job's ``kubedl.training-job.succeeded`` event and summary artifact), and duplicate jobs per
  key (training jobs with one key-hash label beyond the first). One more outage, longer than
  the Prefect client's retries (``--long-outage-s``), is recorded apart from the counts.
- **e**: the MLflow server gets SIGKILL while the ``train-and-serve`` chain (``serve="none"``)
  registers its model, and comes back on the same port after a few seconds (plus its start-up).
  The flow reaches MLflow through a TCP relay of ours, which is how the kill is timed: in turn
  *before* (on the first request of ``register-model``, which never reaches the server), at
  *create* (``model-versions/create`` reaches the server, its answer never reaches the client)
  and at *ready* (the wait for ``READY``). Counted: model versions registered twice (versions
  beyond the first of one run), registrations lost (a trained run with no version), flow runs
  left non-final; what the flow run showed (task states and warnings).
- **f**: the KServe controller gets SIGKILL (``Testbed.restart("kserve-controller")``) while
  ``deploy_inference_service`` waits for a new spec to be Ready, in turn right after the apply
  (before KServe reconciled it), during the rollout (the new predictor pod is held Pending 4 s)
  and when the new pod turned Ready (before KServe reported the Deployment available).
  Counted: rollouts that end Ready, rollouts misreported (the flow said Ready but the live
  service does not serve the new version with its pods Ready, or said Ready before they were),
  flow runs left non-final, and the time from the controller being back to the task's Ready.

Results: ``bench/results/faults-services.json`` (machine, date, command, seed, per scenario the
counts and timings as median/p90/max, and each fault's record); a short summary is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.support.mlflow_server import free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "faults-services.json"
TESTBED = "faults-b"
PORT_BASE = 30400
STAGE = "testbed.kubedl-prefect.io"
FLOWS_PER_RESTART = 3
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
START_TIMEOUT_S = 180.0

logger = logging.getLogger("bench.faults_services")

MARKS: dict[str, dict[str, Any]] = {}
"""What each flow run's body noted (when it started, its id, when it was done), by mark name."""


# -- numbers ----------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, p90 and max of ``values`` (rounded), and how many there were."""
    if not values:
        return {"n": 0, "median": None, "p90": None, "max": None}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "median": round(statistics.median(ordered), 2),
        "p90": round(p90, 2),
        "max": round(ordered[-1], 2),
    }


# -- server processes -------------------------------------------------------------------------


@dataclass
class Service:
    """A server process in its own session: started, killed (SIGKILL) and started again."""

    name: str
    command: list[str]
    env: dict[str, str]
    url: str
    health: str
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}{self.health}", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"the {self.name} server did not come up:\n{tail}")
            time.sleep(0.25)

    def kill(self) -> None:
        """SIGKILL to the whole process group, as a crash (or an OOM kill of the pod) would."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def restart(self, pause_s: float = 0.0) -> float:
        """Kill, wait ``pause_s``, start again, wait until healthy; the seconds it was down."""
        killed = time.monotonic()
        self.kill()
        time.sleep(pause_s)
        self.start()
        self.wait_healthy()
        return time.monotonic() - killed

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()


def prefect_service(home: Path) -> Service:
    port = free_port()
    return Service(
        "prefect",
        [
            str(Path(sys.executable).with_name("prefect")),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        {
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
        },
        f"http://127.0.0.1:{port}",
        "/api/health",
        home / "prefect-server.log",
    )


def mlflow_service(root: Path) -> Service:
    port = free_port()
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    return Service(
        "mlflow",
        [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            (root / "artifacts").as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        f"http://127.0.0.1:{port}",
        "/health",
        root / "mlflow-server.log",
    )


# -- the relay that times MLflow's crash ------------------------------------------------------


class FaultRelay:
    """A TCP relay from a port of its own to ``target_port`` that fires on a request it sees.

    ``arm(pattern, forward)``: the first client chunk containing ``pattern`` sets ``hit``;
    with ``forward`` it still reaches the server but nothing the server answers on that
    connection reaches the client (the server crashed before its answer left), without it the
    connection is closed at once (the server crashed before it read the request). From the hit
    until :meth:`unblock`, new connections are closed at once (the server is dying).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.hit = threading.Event()
        self._pattern: bytes | None = None
        self._forward = False
        self._blocked = False
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", self.port), self._loop
        ).result()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, pattern: bytes, *, forward: bool) -> None:
        self.hit.clear()
        self._forward = forward
        self._pattern = pattern

    def disarm(self) -> None:
        self._pattern = None

    def unblock(self) -> None:
        self._blocked = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._blocked:
            writer.close()
            return
        try:
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        held = False

        async def to_server() -> None:
            nonlocal held
            while data := await reader.read(65536):
                pattern = self._pattern
                if pattern is not None and pattern in data:
                    self._pattern = None
                    self._blocked = True
                    if not self._forward:
                        self.hit.set()
                        return
                    held = True
                    upstream.write(data)
                    await upstream.drain()
                    self.hit.set()
                    continue
                upstream.write(data)
                await upstream.drain()

        async def to_client() -> None:
            while data := await upstream_reader.read(65536):
                if not held:
                    writer.write(data)
                    await writer.drain()

        tasks = [asyncio.create_task(to_server()), asyncio.create_task(to_client())]
        with contextlib.suppress(OSError):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for running in tasks:
            running.cancel()
        for stream in (writer, upstream):
            with contextlib.suppress(Exception):
                stream.close()


# -- Prefect: flows and what the server says ------------------------------------------------


@dataclass
class FlowThread:
    """One flow run, called in a thread of this process (as a worker's flow process would)."""

    key: str
    thread: threading.Thread
    started: float
    state: Any = None
    error: str | None = None
    ended: float | None = None
    marks: dict[str, float] = field(default_factory=dict)

    @property
    def flow_run_id(self) -> str | None:
        if self.state is not None and self.state.state_details.flow_run_id is not None:
            return str(self.state.state_details.flow_run_id)
        return None


def start_flow(key: str, call: Callable[[], Any]) -> FlowThread:
    holder = FlowThread(key, threading.Thread(daemon=True), time.time())

    def run() -> None:
        try:
            holder.state = call()
        except BaseException as exc:
            holder.error = f"{type(exc).__name__}: {exc}"[:500]
        holder.ended = time.time()

    holder.thread = threading.Thread(target=run, name=f"flow-{key}", daemon=True)
    holder.thread.start()
    return holder


def join_all(flows: Sequence[FlowThread], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for held in flows:
        held.thread.join(max(0.0, deadline - time.monotonic()))


async def _server_view(flow_run_id: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
        LogFilterLevel,
    )
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    run_id = uuid.UUID(flow_run_id)
    async with get_client() as client:
        flow_run = await client.read_flow_run(run_id)
        tasks = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
        )
        logs = await client.read_logs(
            log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run_id]), level=LogFilterLevel(ge_=30)
            ),
            limit=20,
        )
        events = await client.read_events(
            filter=EventFilter(
                event=EventNameFilter(prefix=["kubedl."]),
                related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
            ),
            limit=50,
        )
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    state = flow_run.state
    return {
        "state": state.type.value if state else None,
        "state_name": state.name if state else None,
        "message": (state.message or "")[:300] if state else "",
        "tasks": [
            {
                "name": t.name,
                "state": t.state.type.value if t.state else None,
                "state_name": t.state.name if t.state else None,
                "run_count": t.run_count,
                "seconds": round(t.total_run_time.total_seconds(), 2),
            }
            for t in tasks
        ],
        "warnings": [log.message.splitlines()[0][:200] for log in logs],
        "events": sorted({e.event for e in events.events}),
        "artifacts": sorted({a.key for a in artifacts if a.key}),
        "replica_phases": _replica_phases(artifacts),
    }


def _replica_phases(artifacts: Sequence[Any]) -> list[str]:
    """The phases the flow run's replica table shows last (empty without one)."""
    for artifact in artifacts:
        if artifact.key and artifact.key.endswith("-replicas") and artifact.data:
            rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
            return sorted({str(row.get("phase")) for row in rows})
    return []


async def _tagged_view(tag: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
        )
    return await _server_view(str(runs[0].id)) if runs else {"state": None, "tasks": []}


def view_while(tag: str) -> dict[str, Any]:
    """What the Prefect server shows now of the flow run tagged ``tag`` (states, warnings)."""
    try:
        view = asyncio.run(_tagged_view(tag))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {
        "state": view.get("state_name"),
        "tasks": {t["name"].rsplit("-", 1)[0]: t["state_name"] for t in view.get("tasks", [])},
        "warnings": view.get("warnings", []),
    }


def server_view(
    flow_run_id: str, *, settle_s: float = 60.0, events: Sequence[str] = ()
) -> dict[str, Any]:
    """What the Prefect server shows of a flow run, once it (its tasks, ``events``) settled."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            view = asyncio.run(_server_view(flow_run_id))
        except Exception as exc:
            view = {"state": None, "error": f"{type(exc).__name__}: {exc}"[:300], "tasks": []}
        settled = (
            view["state"] in FINAL
            and all(t["state"] in FINAL for t in view["tasks"])
            and set(events) <= set(view.get("events", []))
        )
        if settled or time.monotonic() > deadline:
            return view
        time.sleep(2.0)


def local_state(held: FlowThread) -> str | None:
    """The final state the flow's own process saw (``None``: the call raised or never ended)."""
    if held.state is None:
        return None
    return str(held.state.type.value)


# -- the test bed -----------------------------------------------------------------------------


class Cluster:
    """The test bed's API seen by the driver (administrator), for triggers and checks."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = str(kubeconfig)

    def objects(
        self, kind: Any, namespace: str, selector: str | None = None
    ) -> list[dict[str, Any]]:
        return asyncio.run(self._list(kind, namespace, selector))

    async def _list(self, kind: Any, namespace: str, selector: str | None) -> list[dict[str, Any]]:
        from kubedl_prefect.kube.client import KubeClient

        client = await KubeClient.from_kubeconfig(self.kubeconfig)
        try:
            return list((await client.list(kind, namespace, label_selector=selector)).items)
        finally:
            await client.close()

    def wait_for(self, check: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(poll_s)
        return False


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_since(pod: dict[str, Any]) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            if stamp:
                return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


# -- the campaign -----------------------------------------------------------------------------


@dataclass
class Campaign:
    """Everything the scenarios share: servers, test bed, namespace, blocks."""

    work: Path
    prefect: Service
    mlflow: Service
    relay: FaultRelay
    testbed: Any
    cluster: Cluster
    namespace: str
    rng: random.Random
    seed: int

    def training_spec(self, name: str, *, start_delay_s: float, run_s: float) -> dict[str, Any]:
        annotations = {f"{STAGE}/run-duration": f"{run_s:g}s"}
        if start_delay_s:
            annotations[f"{STAGE}/start-delay"] = f"{start_delay_s:g}s"
        return {
            "name": name,
            "framework": "pytorch",
            "image": "registry.example/faults:1.0",
            "command": ["python", "train.py"],
            "annotations": annotations,
            "replicas": {"master": 1, "worker": 1},
        }


def make_flows() -> dict[str, Any]:
    """The flows of the campaign (made after the environment points Prefect at our server)."""
    from prefect import flow
    from prefect.runtime import flow_run

    from kubedl_prefect.prefect import (
        CLEANUP_HOOKS,
        TrainingJob,
        deploy_inference_service,
        run_training_job,
    )
    from kubedl_prefect.prefect.blocks import load_cluster
    from kubedl_prefect.serving import InferenceServiceSpec

    # As flows/training.py's ``train``, with a note of when its body started.
    @flow(name="faults-train", **CLEANUP_HOOKS)
    def train(spec: dict[str, Any], key: str) -> str:
        marks = MARKS.setdefault(key, {})
        marks["started"] = time.time()
        marks["flow_run_id"] = str(flow_run.id)
        job = TrainingJob(spec=spec, cluster=load_cluster("faults-cluster"))
        result = run_training_job(job, key=key)
        marks["trained"] = time.time()
        return str(result.phase)

    @flow(name="faults-serve")
    def serve(version: int, namespace: str) -> str:
        marks = MARKS.setdefault(f"serve-{version}", {})
        marks["started"] = time.time()
        marks["flow_run_id"] = str(flow_run.id)
        service = InferenceServiceSpec(**service_fields(namespace, version))
        outcome = deploy_inference_service(service, "faults-serving")
        marks["ready"] = time.time()
        return str(outcome.readiness.reason)

    return {"train": train, "serve": serve}


def save_blocks(campaign: Campaign) -> None:
    from kubedl_prefect.prefect import KServeServing, KubernetesCluster, MlflowRegistry

    cluster = KubernetesCluster(
        kubeconfig_path=str(campaign.cluster.kubeconfig), namespace=campaign.namespace
    )
    cluster.save("faults-cluster", overwrite=True)
    MlflowRegistry(
        tracking_uri=campaign.relay.url,
        artifact_destination=(campaign.work / "mlflow" / "artifacts").as_uri(),
    ).save("faults-mlflow", overwrite=True)
    KServeServing(
        cluster=cluster, namespace=campaign.namespace, runtime=None, ready_timeout_s=240
    ).save("faults-serving", overwrite=True)


# -- d: the Prefect server restarts -----------------------------------------------------------

D_POINTS = ("submission", "waiting", "running", "completion")
D_TERMINAL_EVENT = "kubedl.training-job.succeeded"


def d_round(
    campaign: Campaign, flows: dict[str, Any], index: int, point: str, pause_s: float = 0.0
) -> dict[str, Any]:
    """Three flow runs train; the Prefect server is killed at ``point`` and started again.

    ``pause_s``: how long it stays down before it is started again (its start-up comes on top).
    """
    from kubedl_prefect.kube.resources import PODS
    from kubedl_prefect.lifecycle.kubernetes import LABEL_KEY_HASH
    from kubedl_prefect.lifecycle.kubernetes.dialects import job_kind
    from kubedl_prefect.spec import key_hash

    jobs_kind = job_kind("training.kubedl.io/v1alpha1", "PyTorchJob")
    delay, run = {"submission": (0, 6), "waiting": (20, 3), "running": (0, 25)}.get(point, (0, 10))
    spec = campaign.training_spec("faults-d", start_delay_s=delay, run_s=run)
    keys = [f"d{index}-{n}-{uuid.uuid4().hex[:6]}" for n in range(FLOWS_PER_RESTART)]
    hashes = {key_hash(k): k for k in keys}
    marks = {k: MARKS.setdefault(k, {}) for k in keys}

    def train(key: str) -> Callable[[], Any]:
        return lambda: flows["train"](spec, key, return_state=True)

    running = [start_flow(k, train(k)) for k in keys]

    def jobs() -> list[dict[str, Any]]:
        found = campaign.cluster.objects(jobs_kind, campaign.namespace, LABEL_KEY_HASH)
        return [j for j in found if j["metadata"]["labels"].get(LABEL_KEY_HASH) in hashes]

    def pods_running(least: int) -> bool:
        """Whether at least ``least`` jobs have both their pods running."""
        names = {j["metadata"]["name"] for j in jobs()}
        running_pods: dict[str, int] = {}
        for pod in campaign.cluster.objects(PODS, campaign.namespace, "job-name"):
            owner = pod["metadata"]["labels"].get("job-name")
            if owner in names and (pod.get("status") or {}).get("phase") == "Running":
                running_pods[owner] = running_pods.get(owner, 0) + 1
        return sum(n == 2 for n in running_pods.values()) >= least

    if point == "submission":
        reached = campaign.cluster.wait_for(lambda: all("started" in marks[k] for k in keys), 90)
    elif point == "waiting":
        reached = campaign.cluster.wait_for(lambda: len(jobs()) == len(keys), 90, 0.2)
    elif point == "running":
        reached = campaign.cluster.wait_for(lambda: pods_running(len(keys)), 90, 0.2)
    else:  # the first job to run ends a second after the kill, the others soon after
        reached = campaign.cluster.wait_for(lambda: pods_running(1), 90, 0.2)
        time.sleep(max(0.0, run - 1.0))
    killed_at = time.time()
    downtime = campaign.prefect.restart(pause_s)
    back_at = time.time()
    join_all(running, 300)
    records = []
    for held in running:
        flow_run_id = held.flow_run_id or marks[held.key].get("flow_run_id")
        view = (
            server_view(str(flow_run_id), events=[D_TERMINAL_EVENT])
            if flow_run_id
            else {"state": None, "tasks": []}
        )
        trained = marks[held.key].get("trained")
        records.append(
            {
                "key": held.key,
                "task_returned_while_down": trained is not None and killed_at <= trained <= back_at,
                "events": view.get("events", []),
                "replica_phases": view.get("replica_phases", []),
                "summary_artifact": any(a.endswith("-summary") for a in view.get("artifacts", [])),
                "flow_run_id": flow_run_id,
                "local_state": local_state(held),
                "local_error": held.error,
                "server_state": view.get("state"),
                "server_message": view.get("message", ""),
                "tasks": view.get("tasks", []),
                "warnings": view.get("warnings", []),
                "flow_s": round((held.ended or time.time()) - held.started, 2),
                "final_after_back_s": round((held.ended or time.time()) - back_at, 2),
            }
        )
    per_key: dict[str, int] = {}
    for job in jobs():
        key = hashes[job["metadata"]["labels"][LABEL_KEY_HASH]]
        per_key[key] = per_key.get(key, 0) + 1
    logger.info("d%d %s: down %.1f s, %s", index, point, downtime, _states(records))
    return {
        "point": point,
        "trigger_reached": reached,
        "killed_at": killed_at,
        "downtime_s": round(downtime, 2),
        "jobs_per_key": per_key,
        "flow_runs": records,
    }


def scenario_d(campaign: Campaign, count: int, long_outage_s: float = 0.0) -> dict[str, Any]:
    flows = make_flows()
    faults = [
        d_round(campaign, flows, index, D_POINTS[index % len(D_POINTS)]) for index in range(count)
    ]
    # Beyond the count: one outage longer than the Prefect client's retries (about a minute).
    long_outage = (
        d_round(campaign, flows, count, "completion", long_outage_s) if long_outage_s else None
    )
    runs = [r for f in faults for r in f["flow_runs"]]
    lost = [
        r
        for r in runs
        if r["local_state"] in FINAL
        and (
            r["server_state"] != r["local_state"]
            or any(t["state"] not in FINAL for t in r["tasks"])
        )
    ]
    return {
        "faults": len(faults),
        "flow_runs": len(runs),
        "flow_runs_completed": sum(r["server_state"] == "COMPLETED" for r in runs),
        "flow_runs_non_final": sum(r["server_state"] not in FINAL for r in runs),
        "lost_terminal_states": len(lost),
        "task_runs_non_final": sum(t["state"] not in FINAL for r in runs for t in r["tasks"]),
        "flow_process_errors": sum(r["local_error"] is not None for r in runs),
        "terminal_events_lost": sum(D_TERMINAL_EVENT not in r["events"] for r in runs),
        "summary_artifacts_lost": sum(not r["summary_artifact"] for r in runs),
        "replica_tables_not_final": sum(r["replica_phases"] != ["Succeeded"] for r in runs),
        "tasks_returned_while_server_down": sum(r["task_returned_while_down"] for r in runs),
        "duplicate_jobs": sum(max(0, n - 1) for f in faults for n in f["jobs_per_key"].values()),
        "keys_without_job": sum(len(f["flow_runs"]) - len(f["jobs_per_key"]) for f in faults),
        "timings": {
            "server_downtime_s": spread([f["downtime_s"] for f in faults]),
            "flow_run_s": spread([r["flow_s"] for r in runs]),
            "flow_end_after_server_back_s": spread([r["final_after_back_s"] for r in runs]),
        },
        "by_point": _by_point(faults),
        "records": faults,
        "long_outage": long_outage,
    }


def _states(records: Sequence[dict[str, Any]]) -> str:
    return ", ".join(f"{r['local_state']}/{r['server_state']}" for r in records)


def _by_point(faults: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for fault in faults:
        row = table.setdefault(fault["point"], {"faults": 0, "flow_runs": 0, "completed": 0})
        row["faults"] += 1
        for run in fault.get("flow_runs", []):
            row["flow_runs"] += 1
            row["completed"] += run["server_state"] == "COMPLETED"
    return table


# -- e: the MLflow server is down during registration -----------------------------------------

E_POINTS = {
    # point: (the request that triggers the kill, whether it reaches the server)
    "before": (b"/api/2.0/mlflow/runs/set-tag", False),
    "create": (b"/api/2.0/mlflow/model-versions/create", True),
    "ready": (b"/api/2.0/mlflow/model-versions/get", False),
}


def scenario_e(campaign: Campaign, count: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from mlflow import MlflowClient
    from prefect import tags

    from flows.train_and_serve import train_and_serve
    from kubedl_prefect.registry import ModelRegistry
    from kubedl_prefect.spec import parse_spec
    from kubedl_prefect.spec.handoff import with_handoff
    from tests.support.training import job_environment, train_and_log

    retries = RetryCounter()
    logging.getLogger("urllib3.connectionpool").addHandler(retries)
    model = f"faults-e-{uuid.uuid4().hex[:6]}"
    experiment = model
    spec_data = campaign.training_spec("faults-e", start_delay_s=0, run_s=2)
    spec = parse_spec(spec_data)
    direct = ModelRegistry(campaign.mlflow.url)
    client = MlflowClient(campaign.mlflow.url)
    faults: list[dict[str, Any]] = []
    names = list(E_POINTS)
    for index in range(count):
        point = names[index % len(names)]
        pattern, forward = E_POINTS[point]
        key = f"e{index}-{uuid.uuid4().hex[:6]}"
        # Rank 0's part: the model logged into the logical job's run (the pods run no code).
        handoff = direct.start_run(spec, key=key, experiment=experiment)
        train_and_log(job_environment(with_handoff(spec, handoff)), accuracy=0.5 + 0.01 * index)
        campaign.relay.arm(pattern, forward=forward)
        retries.reset()

        def chain(key: str = key) -> Any:
            with tags(key):
                return train_and_serve(
                    spec=spec_data,
                    cluster="faults-cluster",
                    key=key,
                    model_name=model,
                    registry="faults-mlflow",
                    experiment=experiment,
                    serve="none",
                    return_state=True,
                )

        held = start_flow(key, chain)
        hit = campaign.relay.hit.wait(120)
        downtime = None
        during: dict[str, Any] = {}
        pause = campaign.rng.uniform(1.0, 5.0)
        if hit:
            if forward:
                time.sleep(0.5)  # the server commits what it read; its answer is held back
            killed = time.monotonic()
            campaign.mlflow.kill()
            campaign.relay.unblock()
            time.sleep(pause)
            during = view_while(key)
            campaign.mlflow.start()
            campaign.mlflow.wait_healthy()
            downtime = time.monotonic() - killed
            back_at = time.time()
        else:
            campaign.relay.disarm()
            campaign.relay.unblock()
            back_at = time.time()
        join_all([held], 420)
        view = server_view(held.flow_run_id) if held.flow_run_id else {"state": None, "tasks": []}
        versions = client.search_model_versions(f"name = '{model}' and run_id = '{handoff.run_id}'")
        register = [t for t in view.get("tasks", []) if t["name"].startswith("register-model")]
        faults.append(
            {
                "point": point,
                "hit": hit,
                "pause_s": round(pause, 2),
                "downtime_s": round(downtime, 2) if downtime is not None else None,
                "key": key,
                "flow_run_id": held.flow_run_id,
                "local_state": local_state(held),
                "local_error": held.error,
                "server_state": view.get("state"),
                "server_message": view.get("message", ""),
                "versions_of_run": sorted(int(v.version) for v in versions),
                "events": view.get("events", []),
                "while_mlflow_down": during,
                "register_task": register,
                "tasks": view.get("tasks", []),
                "warnings": view.get("warnings", []),
                "mlflow_client_retries": retries.count,
                "flow_s": round((held.ended or time.time()) - held.started, 2),
                "final_after_back_s": round((held.ended or time.time()) - back_at, 2),
            }
        )
        logger.info(
            "e%d %s: down %s s, %s/%s, versions %s",
            index,
            point,
            faults[-1]["downtime_s"],
            faults[-1]["local_state"],
            faults[-1]["server_state"],
            faults[-1]["versions_of_run"],
        )
    live = client.search_model_versions(f"name = '{model}'")
    numbers = [int(v.version) for v in live]
    return {
        "faults": len(faults),
        "faults_hit": sum(f["hit"] for f in faults),
        # Version numbers used beyond the live versions: copies made and deleted again.
        "copies_made_and_deleted": (max(numbers) - len(numbers)) if numbers else 0,
        "flow_runs": len(faults),
        "flow_runs_completed": sum(f["server_state"] == "COMPLETED" for f in faults),
        "flow_runs_non_final": sum(f["server_state"] not in FINAL for f in faults),
        "registered_twice": sum(max(0, len(f["versions_of_run"]) - 1) for f in faults),
        "registrations_lost": sum(not f["versions_of_run"] for f in faults),
        "register_task_retried": sum(
            any(t["run_count"] > 1 for t in f["register_task"]) for f in faults
        ),
        "timings": {
            "mlflow_downtime_s": spread([f["downtime_s"] for f in faults if f["downtime_s"]]),
            "register_task_s": spread([t["seconds"] for f in faults for t in f["register_task"]]),
            "flow_run_s": spread([f["flow_s"] for f in faults]),
            "flow_end_after_mlflow_back_s": spread([f["final_after_back_s"] for f in faults]),
        },
        "by_point": _by_point_e(faults),
        "records": faults,
    }


def _by_point_e(faults: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for fault in faults:
        row = table.setdefault(fault["point"], {"faults": 0, "completed": 0, "extra_versions": 0})
        row["faults"] += 1
        row["completed"] += fault["server_state"] == "COMPLETED"
        row["extra_versions"] += max(0, len(fault["versions_of_run"]) - 1)
    return table


class RetryCounter(logging.Handler):
    """Counts urllib3's "Retrying (...)" warnings: the MLflow client waiting out the server."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Retrying" in record.getMessage():
            self.count += 1

    def reset(self) -> None:
        self.count = 0


# -- f: the KServe controller restarts during a rollout ---------------------------------------

F_POINTS = ("applied", "rolling-out", "pod-ready")
SERVICE = "faults-svc"


def service_fields(namespace: str, version: int) -> dict[str, Any]:
    from kubedl_prefect.serving import ModelLink

    return {
        "name": SERVICE,
        "namespace": namespace,
        "storage_uri": f"s3://faults/models/m-{version}/artifacts",
        "min_replicas": 1,
        "max_replicas": 1,
        # The new predictor pod waits 4 s before it runs: a rollout long enough to crash into.
        "annotations": {f"{STAGE}/start-delay": "4s"},
        "link": ModelLink("faults", str(version), namespace, f"faults-job-{version}"),
    }


def f_round(campaign: Campaign, flows: dict[str, Any], index: int, point: str) -> dict[str, Any]:
    """One rollout of a new version; the KServe controller is killed at ``point``."""
    from kubedl_prefect.kube.resources import INFERENCE_SERVICES, PODS

    version = index + 1
    marks = MARKS.setdefault(f"serve-{version}", {})

    def live() -> dict[str, Any]:
        found = campaign.cluster.objects(INFERENCE_SERVICES, campaign.namespace)
        return next((s for s in found if s["metadata"]["name"] == SERVICE), {})

    def pods() -> list[dict[str, Any]]:
        selector = f"serving.kserve.io/inferenceservice={SERVICE}"
        return [
            p
            for p in campaign.cluster.objects(PODS, campaign.namespace, selector)
            if p["metadata"]["labels"].get("kubedl-prefect.io/model-version") == str(version)
            and not p["metadata"].get("deletionTimestamp")
        ]

    def applied() -> bool:
        labels = live().get("metadata", {}).get("labels", {})
        return bool(labels.get("kubedl-prefect.io/model-version") == str(version))

    held = start_flow(
        str(version), lambda: flows["serve"](version, campaign.namespace, return_state=True)
    )
    if point == "applied":
        reached = campaign.cluster.wait_for(applied, 120, 0.05)
    elif point == "rolling-out":
        reached = campaign.cluster.wait_for(lambda: bool(pods()), 120, 0.1)
    else:  # the new pod is Ready: KServe has yet to see its Deployment available
        reached = campaign.cluster.wait_for(lambda: any(map(pod_ready, pods())), 120, 0.05)
    restart_started = time.time()
    downtime = campaign.testbed.restart("kserve-controller")
    back_at = time.time()
    join_all([held], 300)
    view = server_view(held.flow_run_id) if held.flow_run_id else {"state": None, "tasks": []}
    conditions = (live().get("status") or {}).get("conditions") or []
    isvc_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    new_pods = pods()
    serving_new = applied() and isvc_ready and bool(new_pods) and all(map(pod_ready, new_pods))
    pods_ready_at = [t for t in (ready_since(p) for p in new_pods) if t is not None]
    said_ready = local_state(held) == "COMPLETED"
    premature = (
        said_ready and bool(pods_ready_at) and marks.get("ready", 0) < max(pods_ready_at) - 1.0
    )
    ready_after = round(marks["ready"] - back_at, 2) if "ready" in marks else None
    logger.info(
        "f%d %s: controller down %.1f s, %s/%s, serving new %s, ready %s s after",
        index,
        point,
        downtime,
        local_state(held),
        view.get("state"),
        serving_new,
        ready_after,
    )
    return {
        "point": point,
        "trigger_reached": reached,
        "version": version,
        "controller_downtime_s": round(downtime, 2),
        "restart_call_s": round(back_at - restart_started, 2),
        "flow_run_id": held.flow_run_id,
        "local_state": local_state(held),
        "local_error": held.error,
        "server_state": view.get("state"),
        "server_message": view.get("message", ""),
        "tasks": view.get("tasks", []),
        "warnings": view.get("warnings", []),
        "events": view.get("events", []),
        "serving_new_version": serving_new,
        "premature_ready": premature,
        "misreported": (said_ready and not serving_new)
        or premature
        or (not said_ready and serving_new),
        "ready_after_restart_s": ready_after,
        "flow_s": round((held.ended or time.time()) - held.started, 2),
    }


def scenario_f(campaign: Campaign, count: int) -> dict[str, Any]:
    flows = make_flows()
    warm = flows["serve"](0, campaign.namespace, return_state=True)
    if not warm.is_completed():
        raise RuntimeError(f"the first rollout (no fault) did not end Ready: {warm.message}")
    faults = [
        f_round(campaign, flows, index, F_POINTS[index % len(F_POINTS)]) for index in range(count)
    ]
    return {
        "faults": len(faults),
        "rollouts_ready": sum(
            f["local_state"] == "COMPLETED" and f["serving_new_version"] for f in faults
        ),
        "rollouts_misreported": sum(f["misreported"] for f in faults),
        "flow_runs_non_final": sum(f["server_state"] not in FINAL for f in faults),
        "timings": {
            "controller_downtime_s": spread([f["controller_downtime_s"] for f in faults]),
            "ready_after_restart_s": spread(
                [
                    f["ready_after_restart_s"]
                    for f in faults
                    if f["ready_after_restart_s"] is not None
                ]
            ),
            "flow_run_s": spread([f["flow_s"] for f in faults]),
        },
        "records": faults,
    }


# -- driver -----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    memory = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 1024 / 1024, 1)
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("prefect", "mlflow", "kubedl-prefect")}


def configure_prefect(home: Path, url: str) -> None:
    """Point this process's Prefect at the campaign's server (before Prefect is imported)."""
    os.environ.update(
        {
            "PREFECT_API_URL": f"{url}/api",
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOCAL_STORAGE_PATH": str(home / "storage"),
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
    )


def summary_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for name, data in results.items():
        counts = {k: v for k, v in data.items() if isinstance(v, int)}
        lines.append(f"{name}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
        for timing, values in data.get("timings", {}).items():
            lines.append(
                f"    {timing}: median {values['median']}, p90 {values['p90']}, max {values['max']}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", choices=["d", "e", "f", "all"], default="all")
    parser.add_argument("--count", type=int, default=10, help="faults per scenario (default 10)")
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--long-outage-s",
        type=float,
        default=90.0,
        help="d: one more Prefect outage this long (plus start-up), beyond --count; 0: none",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="faults-services-"))
    prefect = prefect_service(work / "prefect")
    (work / "prefect").mkdir(parents=True)
    mlflow = mlflow_service(work / "mlflow")
    configure_prefect(work / "prefect", prefect.url)
    prefect.start()
    mlflow.start()

    from kubedl_prefect.testbed.components import Ports
    from kubedl_prefect.testbed.testbed import Testbed

    testbed = Testbed(TESTBED, ports=Ports(base=PORT_BASE))
    kubeconfig = testbed.up()
    namespace = f"faults-{uuid.uuid4().hex[:8]}"
    testbed.create_namespace(namespace, labels={"kubedl-prefect.io/bench": "faults-services"})
    relay = FaultRelay(int(mlflow.url.rsplit(":", 1)[1]))
    prefect.wait_healthy()
    mlflow.wait_healthy()
    campaign = Campaign(
        work,
        prefect,
        mlflow,
        relay,
        testbed,
        Cluster(kubeconfig),
        namespace,
        random.Random(args.seed),
        args.seed,
    )
    results: dict[str, Any] = {}
    try:
        save_blocks(campaign)
        chosen = ["d", "e", "f"] if args.scenario == "all" else [args.scenario]
        runners: dict[str, Callable[[Campaign, int], dict[str, Any]]] = {
            "d": lambda c, n: scenario_d(c, n, args.long_outage_s),
            "e": scenario_e,
            "f": scenario_f,
        }
        for name in chosen:
            started = time.monotonic()
            results[name] = runners[name](campaign, args.count)
            results[name]["wall_s"] = round(time.monotonic() - started, 1)
    finally:
        with contextlib.suppress(Exception):
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=30)
            EventsWorker.drain_all(timeout=30)
        prefect.stop()
        mlflow.stop()
        with contextlib.suppress(Exception):
            testbed.delete_namespace(namespace)
    command = "uv run python -m bench.faults_services " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    report = {
        "meta": {
            **machine(),
            **versions(),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command.strip(),
            "seed": args.seed,
            "count": args.count,
            "testbed": TESTBED,
            "elapsed_s": round(time.monotonic() - began),
        },
        "scenarios": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(summary_lines(results)))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
