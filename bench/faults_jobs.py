"""Fault campaign through Prefect: jobs under API-server crashes, killed and cancelled flows.

``uv run python -m bench.faults_jobs [--scenario a|b|c|all] [--count N] [--seed S]
[--budget-min M]``

Prefect flows (``flows/training.py`` ``train``, against a real ``prefect server``) train real
jobs on the ``faults-a`` test bed (real kube-apiserver, KubeDL operator and Volcano; kwok pods,
one master and one worker, gang-scheduled), while faults are injected at points drawn from
``--seed``:

- **a**: the API server is SIGKILLed and restarted (``Testbed.restart``) ``N`` times (100) while
  several flow runs, each with its own key, train in this process; new ones start as old ones
  end, so kills land at submission, admission, running and completion. Each flow run must end
  ``Completed`` with the phase its job has in the cluster, with one terminal event.
- **b**: a flow process is SIGKILLed at a random moment ``N`` times (50) and run again with the
  same key. The re-run must adopt the job (or replay its recorded end), never train twice.
  *Time to adopt*: from just before the re-run's process is spawned to the moment its
  ``TrainingJobRun.start`` returned the reference of the job the killed run had created (the
  re-run prints its wall clock there; same machine clock); also from the re-run's flow run
  ``start_time`` in Prefect, without the interpreter's start-up.
- **c**: a flow run of a served ``train`` deployment is cancelled through the Prefect API (state
  ``Cancelling``, as the UI does) at a random moment ``N`` times (50); within 30 s no job, pod or
  PodGroup of its key may remain and the flow run must be in a final state; all keys are checked
  again at the end.

Counted per scenario: duplicate jobs (more than one job uid ever seen for a key: the namespace's
jobs are listed every second, plus the run records and a final listing), orphans (c), lost
terminal states (a job that ended but whose flow run did not report that end, or a flow run that
never ended), flow runs left in a non-final state. ``all`` runs b, c, then a, which alone stops
early once ``--budget-min`` minutes have passed (the faults actually injected are reported).
Results, written after each scenario: ``bench/results/faults-jobs.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "faults-jobs.json"
RBAC = ROOT / "deploy" / "rbac.yaml"
STAGE = "testbed.kubedl-prefect.io"
TESTBED_NAME = "faults-a"
PORT_BASE = 29400
SPEC_NAME = "mnist"
FULL_COUNTS = {"a": 100, "b": 50, "c": 50}
IN_FLIGHT = {"a": 4, "b": 4, "c": 5}
CANCEL_CHECK_S = 30.0
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}


# -- small helpers ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated linearly between closest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, p90 and max of ``values`` (seconds, rounded), and how many."""
    if not values:
        return {"n": 0, "median": None, "p90": None, "max": None}
    return {
        "n": len(values),
        "median": round(statistics.median(values), 2),
        "p90": round(percentile(values, 90), 2),
        "max": round(max(values), 2),
    }


def spec_fields(run_s: float) -> dict[str, Any]:
    """The spec of every job: a master and a worker, one GPU each, gang-scheduled by Volcano."""
    from kubedl_prefect.spec import loads_spec, spec_to_data

    text = f"""
name: {SPEC_NAME}
framework: pytorch
image: registry.example/mnist:1.0
command: [python, train.py]
resources: {{gpus: 1}}
annotations: {{"{STAGE}/run-duration": "{round(run_s * 1000)}ms"}}
checkpoint: {{location: "s3://checkpoints/faults"}}
gang: {{scheduler: volcano}}
replicas:
  master: 1
  worker: {{count: 1}}
"""
    return spec_to_data(loads_spec(text))


def stem_of(key: str) -> str:
    """The jobs' names of ``key`` less the attempt suffix (also the run record's name)."""
    from kubedl_prefect.lifecycle.records import record_name

    return record_name(SPEC_NAME, key)


def _background(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``fn`` on a daemon thread (a stuck flow never blocks the exit); await its result."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def done(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(done, None, exc)
        else:
            loop.call_soon_threadsafe(done, result, None)

    threading.Thread(target=target, daemon=True).start()
    return future


# -- the cluster as the bench sees it (administrator credentials, its own client) --------------


class Cluster:
    """Reads the test bed with the administrator's client (never the flows' shared sessions)."""

    def __init__(self, client: Any, namespace: str):
        from kubedl_prefect.kube.resources import ResourceKind
        from kubedl_prefect.spec import job_resource

        resource = job_resource("kubedl", "pytorch")
        self.jobs_kind = ResourceKind.of(
            {"apiVersion": resource.api_version, "kind": resource.kind}
        )
        self.client = client
        self.namespace = namespace
        self.uids: dict[str, set[str]] = {}
        self._stop = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    async def objects(self, kind: Any, *, patience_s: float = 90.0) -> list[dict[str, Any]]:
        """The objects of ``kind``; retried while the API server is down."""
        from kubedl_prefect.errors import KubeDLPrefectError

        deadline = time.monotonic() + patience_s
        while True:
            try:
                return list((await self.client.list(kind, self.namespace)).items)
            except KubeDLPrefectError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def jobs(self, *, patience_s: float = 90.0) -> list[dict[str, Any]]:
        """The training jobs, each one's uid noted against its key."""
        found = await self.objects(self.jobs_kind, patience_s=patience_s)
        self._note(found)
        return found

    def _note(self, jobs: list[dict[str, Any]]) -> None:
        from kubedl_prefect.lifecycle.kubernetes import ANNOTATION_KEY

        for job in jobs:
            key = (job["metadata"].get("annotations") or {}).get(ANNOTATION_KEY, "")
            self.uids.setdefault(key, set()).add(job["metadata"]["uid"])

    def start_polling(self) -> None:
        """List the jobs every second (errors ignored) to see every job a key ever had."""

        async def poll() -> None:
            while not self._stop.is_set():
                with contextlib.suppress(Exception):
                    await self.jobs(patience_s=0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0)

        self._poller = asyncio.ensure_future(poll())

    async def stop_polling(self) -> None:
        self._stop.set()
        if self._poller is not None:
            await self._poller

    async def record_uids(self) -> None:
        """Add the uids of every attempt in the run records (a job deleted since included)."""
        from kubedl_prefect.kube.resources import CONFIG_MAPS
        from kubedl_prefect.lifecycle.kubernetes.backend import LABEL_RECORD, _parse_record

        for obj in await self.objects(CONFIG_MAPS):
            if (obj["metadata"].get("labels") or {}).get(LABEL_RECORD) != "true":
                continue
            record = _parse_record(obj)
            if record is None:
                continue
            for attempt in record.attempts:
                if attempt.uid:
                    self.uids.setdefault(record.key, set()).add(attempt.uid)

    def duplicates(self, keys: Sequence[str]) -> dict[str, int]:
        """Per key with more than one job ever: how many more."""
        return {k: len(self.uids[k]) - 1 for k in keys if len(self.uids.get(k, ())) > 1}

    async def phases(self, keys: Sequence[str]) -> dict[str, str]:
        """Where each key's logical job stands: submission, admission, running or completion."""
        from kubedl_prefect.kube.resources import PODS
        from kubedl_prefect.lifecycle.status import job_status

        jobs = await self.jobs(patience_s=5)
        pods = await self.objects(PODS, patience_s=5)
        found: dict[str, str] = {}
        for key in keys:
            stem = stem_of(key)
            mine = [j for j in jobs if j["metadata"]["name"].startswith(f"{stem}-a")]
            if not mine:
                found[key] = "submission"
                continue
            job = max(mine, key=lambda j: j["metadata"]["name"])
            if job_status(job).phase.terminal:
                found[key] = "completion"
                continue
            running = [
                p
                for p in pods
                if p["metadata"]["name"].startswith(job["metadata"]["name"])
                and (p.get("status") or {}).get("phase") == "Running"
            ]
            found[key] = "running" if len(running) >= 2 else "admission"
        return found

    async def leftovers(self, key: str) -> list[str]:
        """Jobs, pods and PodGroups of ``key`` still in the namespace."""
        from kubedl_prefect.kube.resources import PODS, VOLCANO_PODGROUPS

        stem = stem_of(key)
        left = []
        for kind in (self.jobs_kind, PODS, VOLCANO_PODGROUPS):
            for obj in await self.objects(kind):
                labels = obj["metadata"].get("labels") or {}
                if obj["metadata"]["name"].startswith(f"{stem}-a") or labels.get(
                    "kubedl.io/gang-job-name", ""
                ).startswith(f"{stem}-a"):
                    left.append(f"{kind.kind}/{obj['metadata']['name']}")
        return left

    async def terminal_phase(self, key: str, jobs: list[dict[str, Any]]) -> str | None:
        """The phase of the key's latest job if it ended (in the cluster), else ``None``."""
        from kubedl_prefect.lifecycle.status import job_status

        mine = [j for j in jobs if j["metadata"]["name"].startswith(f"{stem_of(key)}-a")]
        if not mine:
            return None
        phase = job_status(max(mine, key=lambda j: j["metadata"]["name"])).phase
        return str(phase) if phase.terminal else None


# -- Prefect, as the bench reads it ------------------------------------------------------------


async def flow_runs_by_key(prefix: str) -> dict[str, list[Any]]:
    """Every flow run whose ``key`` parameter starts with ``prefix``, oldest first, by key."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    found: dict[str, list[Any]] = {}
    async with get_client() as client:
        offset = 0
        while True:
            page = await client.read_flow_runs(
                sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=200, offset=offset
            )
            for run in page:
                key = str((run.parameters or {}).get("key") or "")
                if key.startswith(prefix):
                    found.setdefault(key, []).append(run)
            if len(page) < 200:
                break
            offset += 200
    for runs in found.values():
        runs.sort(key=lambda r: r.created)
    return found


async def terminal_events(flow_run_ids: Sequence[Any]) -> dict[str, int]:
    """How many ``kubedl.training-job.succeeded``/``failed`` events each flow run has."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    counts: dict[str, int] = {}
    async with get_client() as client:
        for run_id in flow_run_ids:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(
                        name=["kubedl.training-job.succeeded", "kubedl.training-job.failed"]
                    ),
                    related=EventRelatedFilter(id=[f"prefect.flow-run.{run_id}"]),
                ),
                limit=50,
            )
            counts[str(run_id)] = len(page.events)
    return counts


def state_of(run: Any) -> str:
    return str(run.state.type.value) if run.state is not None else "NONE"


# -- the campaign ----------------------------------------------------------------------------


@dataclass
class Campaign:
    """What every scenario shares: the test bed, the Prefect server and a work folder."""

    testbed: Any
    server_env: dict[str, str]
    work: Path
    seed: int
    tag: str
    admin: Any = None
    deadline: float | None = None
    notes: list[str] = field(default_factory=list)

    async def namespace(self, scenario: str) -> tuple[str, str, Cluster]:
        """A fresh namespace, a saved cluster block for it (least privilege), and its reader."""
        from kubedl_prefect.prefect import KubernetesCluster

        namespace = f"faults-{scenario}-{self.tag}"
        await asyncio.to_thread(
            self.testbed.create_namespace, namespace, labels={"kubedl-prefect.io/test": "true"}
        )
        documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
        role = next(d for d in documents if d["kind"] == "Role")
        kubeconfig = await asyncio.to_thread(
            self.testbed.service_account_kubeconfig,
            namespace,
            "least-privilege",
            role["rules"],
            path=self.work / f"{namespace}.kubeconfig",
            expiration_seconds=6 * 3600,
        )
        block = f"faults-jobs-{scenario}"
        await KubernetesCluster(kubeconfig_path=str(kubeconfig), namespace=namespace).asave(
            block, overwrite=True
        )
        return namespace, block, Cluster(self.admin, namespace)

    def rng(self, scenario: str, index: int) -> random.Random:
        """The draws of one flow run: the same for a seed, whatever ran before."""
        return random.Random(f"{self.seed}-{scenario}-{index}")


# -- (a) API server crashes -----------------------------------------------------------------


def _train_in_process(fields: dict[str, Any], block: str, key: str) -> dict[str, Any]:
    from flows.training import train

    state = train(spec=fields, cluster=block, key=key, return_state=True)
    row: dict[str, Any] = {
        "flow_run": str(state.state_details.flow_run_id),
        "state": str(state.type.value),
        "message": (state.message or "")[:300],
    }
    if state.is_completed():
        result = state.result()
        row["phase"] = result.phase
        row["uid"] = result.ref.get("uid")
    return row


async def scenario_a(c: Campaign, count: int) -> dict[str, Any]:
    """Crash and restart the API server ``count`` times while flow runs train."""
    namespace, block, cluster = await c.namespace("a")
    cluster.start_polling()
    prefix = f"a-{c.tag}-"
    running: dict[str, tuple[asyncio.Future[Any], float]] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    started = 0

    def launch() -> None:
        nonlocal started
        draws = c.rng("a", started)
        key = f"{prefix}{started}"
        fields = spec_fields(draws.uniform(2.0, 5.0))
        running[key] = (
            _background(lambda: _train_in_process(fields, block, key)),
            time.monotonic(),
        )
        started += 1

    def collect() -> None:
        for key, (future, began) in list(running.items()):
            if future.done():
                del running[key]
                error = future.exception()
                outcomes[key] = (
                    {"state": "ERROR", "message": repr(error)[:300]}
                    if error is not None
                    else future.result()
                )
                outcomes[key]["wall_s"] = time.monotonic() - began

    def refill() -> None:
        collect()
        while len(running) < IN_FLIGHT["a"]:
            launch()

    kills: list[dict[str, Any]] = []
    gaps = random.Random(f"{c.seed}-a-gaps")
    began = time.monotonic()
    for index in range(count):
        if c.deadline is not None and time.monotonic() > c.deadline:
            c.notes.append(f"a: stopped after {index} of {count} kills: --budget-min reached")
            break
        refill()
        await asyncio.sleep(gaps.uniform(0.5, 4.0))
        refill()
        try:
            at = await cluster.phases(list(running))
        except Exception as exc:  # the bench's own read failing must not stop the campaign
            at = {}
            c.notes.append(f"a: phases before kill {index}: {exc!r}")
        t0 = time.monotonic()
        downtime = await asyncio.to_thread(c.testbed.restart, "kube-apiserver")
        kills.append(
            {"downtime_s": downtime, "call_s": time.monotonic() - t0, "phases": sorted(at.values())}
        )
        print(
            f"a: kill {index + 1}/{count}: down {downtime:.1f}s, in flight at "
            f"{dict(Counter(at.values()))}, {len(outcomes)} flow runs ended",
            flush=True,
        )
    deadline = time.monotonic() + 300
    while running and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        collect()
    never_ended = sorted(running)
    for key in never_ended:
        outcomes[key] = {"state": "NEVER_ENDED", "wall_s": None}
    wall = time.monotonic() - began

    await cluster.stop_polling()
    jobs = await cluster.jobs()
    await cluster.record_uids()
    keys = sorted(outcomes)
    lost: list[dict[str, Any]] = []
    for key in keys:
        outcome = outcomes[key]
        ended_in_cluster = await cluster.terminal_phase(key, jobs)
        reported = outcome.get("phase") if outcome["state"] == "COMPLETED" else None
        if outcome["state"] in ("NEVER_ENDED", "ERROR") or (
            ended_in_cluster is not None and reported != ended_in_cluster
        ):
            lost.append(
                {
                    "key": key,
                    "cluster": ended_in_cluster,
                    "flow_run": outcome.get("flow_run"),
                    "state": outcome["state"],
                    "message": outcome.get("message"),
                }
            )
    # Every flow run that completed, or whose job ended, reported that end once.
    reporting = [
        o["flow_run"]
        for k, o in outcomes.items()
        if "flow_run" in o
        and (o["state"] == "COMPLETED" or await cluster.terminal_phase(k, jobs) is not None)
    ]
    events = await terminal_events(reporting)
    if any(n != 1 for n in events.values()):
        await asyncio.sleep(5)  # events are sent in the background: give late ones a chance
        events = await terminal_events(list(events))
    by_key = await flow_runs_by_key(prefix)
    non_final = {k: state_of(r) for k, rs in by_key.items() for r in rs if state_of(r) not in FINAL}
    phases_at_kill = Counter(p for k in kills for p in k["phases"])
    return {
        "namespace": namespace,
        "faults_injected": len(kills),
        "flow_runs": len(outcomes),
        "flow_run_states": dict(Counter(o["state"] for o in outcomes.values())),
        # No job is made to fail: a flow run that did not complete is a fault not ridden out.
        "flow_runs_not_completed": {
            k: o.get("message") for k, o in outcomes.items() if o["state"] != "COMPLETED"
        },
        "flow_runs_in_flight_at_kills_by_phase": dict(phases_at_kill),
        "kills_with_a_flow_run_in_phase": {
            phase: sum(phase in k["phases"] for k in kills)
            for phase in ("submission", "admission", "running", "completion")
        },
        "duplicates": sum(cluster.duplicates(keys).values()),
        "duplicate_keys": cluster.duplicates(keys),
        "lost_terminal_states": len(lost),
        "lost": lost[:20],
        "terminal_events_not_one": {k: n for k, n in events.items() if n != 1},
        "non_final_flow_runs": len(non_final),
        "non_final": non_final,
        "timings": {
            "apiserver_downtime_s": spread([k["downtime_s"] for k in kills]),
            "restart_call_s": spread([k["call_s"] for k in kills]),
            "flow_run_wall_s": spread(
                [o["wall_s"] for o in outcomes.values() if o.get("wall_s") is not None]
            ),
        },
        "wall_s": round(wall, 1),
    }


# -- (b) flow processes killed and run again -------------------------------------------------


def child_main(payload: str) -> None:
    """A flow process of scenario b: ``flows/training.py`` ``train``, saying when it attached."""
    from kubedl_prefect.prefect import runs

    start = runs.TrainingJobRun.start.__func__  # type: ignore[attr-defined]

    async def timed_start(cls: Any, job: Any, *, key: Any = None, ctx: Any = None) -> Any:
        run = await start(cls, job, key=key, ctx=ctx)
        ref = run._ref
        line = {
            "t": time.time(),
            "uid": ref.uid if ref is not None else None,
            "action": run.step.action,
            "flow_run": str(run.ctx.flow_run_id),
        }
        # Not print(): the flow's log_prints would send it to the run's log instead.
        os.write(1, f"ATTACHED {json.dumps(line)}\n".encode())
        return run

    runs.TrainingJobRun.start = classmethod(timed_start)  # type: ignore[assignment,method-assign]
    from flows.training import train

    args = json.loads(payload)
    state = train(**args, return_state=True)
    row: dict[str, Any] = {
        "flow_run": str(state.state_details.flow_run_id),
        "state": str(state.type.value),
        "message": (state.message or "")[:300],
    }
    if state.is_completed():
        result = state.result()
        row.update(phase=result.phase, uid=result.ref.get("uid"))
    print("RESULT", json.dumps(row), flush=True)


def _parse_child(log: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    attached = result = None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("ATTACHED "):
            attached = json.loads(line.removeprefix("ATTACHED "))
        elif line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
    return attached, result


async def _attached(process: subprocess.Popen[bytes], log: Path) -> None:
    """Return once the flow process said it attached to its job (or ended)."""
    while True:
        if process.poll() is not None or _parse_child(log)[0] is not None:
            return
        await asyncio.sleep(0.1)


@contextlib.contextmanager
def _process(
    command: list[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def scenario_b(c: Campaign, count: int) -> dict[str, Any]:
    """Kill flow processes at random moments ``count`` times; run each again with its key."""
    namespace, block, cluster = await c.namespace("b")
    cluster.start_polling()
    prefix = f"b-{c.tag}-"
    cycles: list[dict[str, Any]] = []
    kills = 0
    pending = 0
    began = time.monotonic()

    async def cycle(index: int) -> None:
        nonlocal kills, pending
        draws = c.rng("b", index)
        key = f"{prefix}{index}"
        run_s = draws.uniform(4.0, 12.0)
        # A fifth of the kills at a moment after the spawn (start-up, flow run creation,
        # submission), the rest at a moment after the job was submitted or adopted
        # (admission, running, completion; some runs end first).
        early = draws.random() < 0.2
        delay = draws.uniform(1.0, 10.0) if early else draws.uniform(0.0, run_s + 2.0)
        payload = json.dumps({"spec": spec_fields(run_s), "cluster": block, "key": key})
        command = [sys.executable, "-m", "bench.faults_jobs", "--child", payload]
        row: dict[str, Any] = {
            "key": key,
            "kill_after_s": round(delay, 2),
            "after": "spawn" if early else "submission",
        }
        first_log = c.work / f"{key}.first.log"
        with _process(command, c.server_env, first_log) as first:
            if not early:
                await _attached(first, first_log)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(first.wait), delay)
            if first.poll() is not None:
                row["ended_before_kill"] = True
            else:
                row["phase"] = (await cluster.phases([key]))[key]
                os.killpg(first.pid, signal.SIGKILL)
                kills += 1
        pending -= 1
        if row.get("ended_before_kill"):
            cycles.append(row)
            return
        attached_first, _ = _parse_child(c.work / f"{key}.first.log")
        row["first_attached"] = attached_first is not None
        existing = {j["metadata"]["uid"] for j in await cluster.jobs() if key_of(j) == key}
        row["job_at_kill"] = bool(existing)
        spawned = time.time()
        log = c.work / f"{key}.rerun.log"
        with _process(command, c.server_env, log) as rerun:
            try:
                await asyncio.wait_for(asyncio.to_thread(rerun.wait), 300)
            except TimeoutError:
                row["rerun_timed_out"] = True
        attached, result = _parse_child(log)
        row["rerun"] = result or {"state": "NO_RESULT", "tail": log.read_text()[-800:]}
        if attached is not None:
            row["attach_s"] = attached["t"] - spawned
            row["attached_at"] = attached["t"]
            row["attach_action"] = attached["action"]
            row["adopted"] = attached["uid"] in existing
            row["rerun_flow_run"] = attached["flow_run"]
        cycles.append(row)
        print(
            f"b: {key}: killed in {row['phase']}, re-run {row['rerun'].get('state')} "
            f"({row.get('attach_action')}, attached after "
            f"{row.get('attach_s', float('nan')):.1f}s)",
            flush=True,
        )

    tasks: set[asyncio.Task[None]] = set()
    index = 0
    while kills + pending < count or tasks:
        while kills + pending < count and len(tasks) < IN_FLIGHT["b"]:
            pending += 1
            tasks.add(asyncio.ensure_future(cycle(index)))
            index += 1
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            tasks.discard(task)
            if task.exception() is not None:
                c.notes.append(f"b: a cycle failed: {task.exception()!r}")
    wall = time.monotonic() - began

    await cluster.stop_polling()
    jobs = await cluster.jobs()
    await cluster.record_uids()
    killed = [r for r in cycles if not r.get("ended_before_kill")]
    keys = [r["key"] for r in cycles]
    lost = []
    for row in killed:
        ended = await cluster.terminal_phase(row["key"], jobs)
        rerun = row["rerun"]
        reported = rerun.get("phase") if rerun.get("state") == "COMPLETED" else None
        if reported is None or (ended is not None and reported != ended):
            lost.append({"key": row["key"], "cluster": ended, **rerun})
    # A SIGKILLed flow run is left Running: nobody is left to report it (Prefect marks such
    # runs Crashed only for deployments with heartbeats and a zombie automation); they are
    # counted apart. The re-runs, and the runs that ended before their kill, must all be final.
    by_key = await flow_runs_by_key(prefix)
    watched = {r["rerun"].get("flow_run") or r.get("rerun_flow_run") for r in killed}
    killed_keys = {r["key"] for r in killed}
    non_final: dict[str, str] = {}
    killed_left: Counter[str] = Counter()
    for key, found in by_key.items():
        for run in found:
            state = state_of(run)
            if key in killed_keys and str(run.id) not in watched:
                killed_left[state] += 1
            elif state not in FINAL:
                non_final[str(run.id)] = state
    adoptions = [r["attach_s"] for r in killed if r.get("adopted")]
    # The same, from the re-run's flow run start (Prefect's start_time): without the
    # process's start-up (interpreter, imports) and the flow run's creation.
    starts = {str(r.id): r.start_time for rs in by_key.values() for r in rs if r.start_time}
    in_flow = [
        r["attached_at"] - starts[r["rerun_flow_run"]].timestamp()
        for r in killed
        if r.get("adopted") and r.get("rerun_flow_run") in starts
    ]
    return {
        "namespace": namespace,
        "faults_injected": len(killed),
        "ended_before_the_kill": len(cycles) - len(killed),
        "kills_by_phase": dict(Counter(r["phase"] for r in killed)),
        "reruns": {
            "adopted_the_killed_runs_job": sum(bool(r.get("adopted")) for r in killed),
            "by_action": dict(Counter(str(r.get("attach_action")) for r in killed)),
            "states": dict(Counter(str(r["rerun"].get("state")) for r in killed)),
        },
        "not_adopted_although_a_job_existed": [
            r["key"] for r in killed if r["job_at_kill"] and not r.get("adopted")
        ],
        "duplicates": sum(cluster.duplicates(keys).values()),
        "duplicate_keys": cluster.duplicates(keys),
        "lost_terminal_states": len(lost),
        "lost": lost[:20],
        "non_final_flow_runs": len(non_final),
        "non_final": non_final,
        "killed_flow_runs_by_state": dict(killed_left),
        "timings": {
            "time_to_adopt_s": spread(adoptions),
            "time_to_adopt_from_flow_run_start_s": spread(in_flow),
            "time_to_attach_any_s": spread([r["attach_s"] for r in killed if "attach_s" in r]),
        },
        "wall_s": round(wall, 1),
        "cycles": cycles,
    }


def key_of(job: dict[str, Any]) -> str:
    from kubedl_prefect.lifecycle.kubernetes import ANNOTATION_KEY

    return str((job["metadata"].get("annotations") or {}).get(ANNOTATION_KEY, ""))


# -- (c) cancelling deployment flow runs -----------------------------------------------------


async def _deployment_id(name: str, timeout_s: float = 120) -> Any:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    async with get_client() as client:
        while True:
            try:
                return (await client.read_deployment_by_name(name)).id
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def _running(client: Any, flow_run_id: Any, timeout_s: float = 120.0) -> None:
    """Return once the flow run is Running (or final, or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if state_of(await client.read_flow_run(flow_run_id)) in {"RUNNING", *FINAL}:
            return
        await asyncio.sleep(0.2)


async def scenario_c(c: Campaign, count: int) -> dict[str, Any]:
    """Cancel ``count`` deployment flow runs at random moments; check what they leave."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Cancelling

    namespace, block, cluster = await c.namespace("c")
    cluster.start_polling()
    prefix = f"c-{c.tag}-"
    env = {**c.server_env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    serve = "from flows.training import train; train.serve(name='faults-c')"
    cycles: list[dict[str, Any]] = []
    cancels = 0
    pending = 0
    began = time.monotonic()
    with _process([sys.executable, "-c", serve], env, c.work / "runner.log"):
        deployment = await _deployment_id("train/faults-c")

        async def cycle(index: int) -> None:
            nonlocal cancels, pending
            draws = c.rng("c", index)
            key = f"{prefix}{index}"
            run_s = draws.uniform(8.0, 20.0)
            # A fifth of the cancels at a moment after the flow run's creation (scheduled,
            # pending, starting), the rest at a moment after it was Running (submission,
            # admission, running, completion).
            early = draws.random() < 0.2
            delay = draws.uniform(0.0, 10.0) if early else draws.uniform(0.0, run_s + 4.0)
            row: dict[str, Any] = {
                "key": key,
                "cancel_after_s": round(delay, 2),
                "after": "creation" if early else "running",
            }
            async with get_client() as client:
                run = await client.create_flow_run_from_deployment(
                    deployment,
                    parameters={"spec": spec_fields(run_s), "cluster": block, "key": key},
                )
                row["flow_run"] = str(run.id)
                if not early:
                    await _running(client, run.id)
                await asyncio.sleep(delay)
                now = await client.read_flow_run(run.id)
                if state_of(now) in FINAL:
                    pending -= 1
                    row["ended_before_cancel"] = state_of(now)
                    cycles.append(row)
                    return
                phase = (await cluster.phases([key]))[key]
                # As the UI and `prefect flow-run cancel` do: not forced, so the server refuses to
                # turn a run that ended meanwhile into Cancelling (a forced Cancelling over a
                # finished run leaves it Cancelling for ever: no process is left to cancel).
                answer = await client.set_flow_run_state(run.id, Cancelling())
                if answer.status == SetStateStatus.ABORT:
                    pending -= 1
                    row["ended_before_cancel"] = state_of(await client.read_flow_run(run.id))
                    row["cancel_refused"] = True
                    cycles.append(row)
                    return
                row["phase"] = f"{state_of(now).lower()}/{phase}"
                cancelled = time.monotonic()
                cancels += 1
                pending -= 1
                left: list[str] = []
                state = "NONE"
                while True:
                    left = await cluster.leftovers(key)
                    state = state_of(await client.read_flow_run(run.id))
                    elapsed = time.monotonic() - cancelled
                    if not left and "clean_s" not in row:
                        row["clean_s"] = elapsed
                    if state in FINAL and "final_s" not in row:
                        row["final_s"] = elapsed
                    if state == "COMPLETED":
                        # The flow finished before the cancel reached it: its job is a result,
                        # not an orphan, if it succeeded in the cluster.
                        row["completed_despite_cancel"] = await cluster.terminal_phase(
                            key, await cluster.objects(cluster.jobs_kind)
                        )
                        left = [] if row["completed_despite_cancel"] == "Succeeded" else left
                        break
                    if (not left and state in FINAL) or elapsed >= CANCEL_CHECK_S:
                        break
                    await asyncio.sleep(1.0)
            row["left_after_30s"] = left
            row["state_after_30s"] = state
            cycles.append(row)
            print(
                f"c: {key}: cancelled in {row['phase']}: {state}, {len(left)} object(s) left",
                flush=True,
            )

        tasks: set[asyncio.Task[None]] = set()
        index = 0
        while cancels + pending < count or tasks:
            while cancels + pending < count and len(tasks) < IN_FLIGHT["c"]:
                pending += 1
                tasks.add(asyncio.ensure_future(cycle(index)))
                index += 1
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                tasks.discard(task)
                if task.exception() is not None:
                    c.notes.append(f"c: a cycle failed: {task.exception()!r}")
        wall = time.monotonic() - began
        await asyncio.sleep(5)  # then look once more at every key: nothing may come back
        late = {
            r["key"]: await cluster.leftovers(r["key"])
            for r in cycles
            if "phase" in r and "completed_despite_cancel" not in r
        }
    await cluster.stop_polling()
    await cluster.record_uids()
    cancelled_rows = [r for r in cycles if "phase" in r]
    keys = [r["key"] for r in cycles]
    by_key = await flow_runs_by_key(prefix)
    non_final = {k: state_of(r) for k, rs in by_key.items() for r in rs if state_of(r) not in FINAL}
    orphans = {r["key"]: r["left_after_30s"] for r in cancelled_rows if r["left_after_30s"]}
    late_orphans = {k: v for k, v in late.items() if v}
    never_final = [r["key"] for r in cancelled_rows if r["state_after_30s"] not in FINAL]
    return {
        "namespace": namespace,
        "faults_injected": len(cancelled_rows),
        "ended_before_the_cancel": len(cycles) - len(cancelled_rows),
        "cancels_refused_as_final": sum(1 for r in cycles if r.get("cancel_refused")),
        "completed_before_the_cancel_took_effect": sum(
            1 for r in cancelled_rows if "completed_despite_cancel" in r
        ),
        "cancels_by_phase": dict(Counter(r["phase"] for r in cancelled_rows)),
        "final_states": dict(Counter(r["state_after_30s"] for r in cancelled_rows)),
        "duplicates": sum(cluster.duplicates(keys).values()),
        "duplicate_keys": cluster.duplicates(keys),
        "orphans_after_30s": sum(len(v) for v in orphans.values()),
        "orphans": orphans,
        "orphans_at_the_end": sum(len(v) for v in late_orphans.values()),
        "late_orphans": late_orphans,
        "lost_terminal_states": len(never_final),
        "not_final_30s_after_the_cancel": never_final,
        "non_final_flow_runs": len(non_final),
        "non_final": non_final,
        "timings": {
            "cancel_to_clean_s": spread([r["clean_s"] for r in cancelled_rows if "clean_s" in r]),
            "cancel_to_final_state_s": spread(
                [r["final_s"] for r in cancelled_rows if "final_s" in r]
            ),
        },
        "wall_s": round(wall, 1),
        "cycles": cycles,
    }


# -- main ------------------------------------------------------------------------------------


SCENARIOS: dict[str, Callable[[Campaign, int], Awaitable[dict[str, Any]]]] = {
    "a": scenario_a,
    "b": scenario_b,
    "c": scenario_c,
}


def machine() -> dict[str, Any]:
    memory = 0
    with contextlib.suppress(OSError):
        text = Path("/proc/meminfo").read_text()
        found = re.search(r"MemTotal:\s+(\d+) kB", text)
        memory = int(found.group(1)) // 1024 if found else 0
    return {
        "cpus": os.cpu_count(),
        "memory_mib": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def write_results(args: argparse.Namespace, results: dict[str, Any], started: float) -> None:
    """Write what ran so far (after each scenario: a cut-short campaign keeps its results)."""
    command = "uv run python -m bench.faults_jobs " + shlex.join(args.argv)
    document = {
        "machine": machine(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command.strip(),
        "seed": args.seed,
        "testbed": f"{TESTBED_NAME} (port base {PORT_BASE}), 2 nodes x 8 GPUs, kwok pods",
        "wall_s": round(time.time() - started),
        "scenarios": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")


async def campaign(
    args: argparse.Namespace, server_env: dict[str, str], work: Path
) -> dict[str, Any]:
    """Run the scenarios asked for, one after the other, on the ``faults-a`` test bed."""
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.testbed.components import Ports
    from kubedl_prefect.testbed.testbed import Testbed

    started = time.time()
    testbed = Testbed(TESTBED_NAME, ports=Ports(base=PORT_BASE))
    was_up = testbed.status().up
    await asyncio.to_thread(testbed.up)
    c = Campaign(testbed, server_env, work, args.seed, dt.datetime.now(dt.UTC).strftime("%H%M%S"))
    c.admin = await KubeClient.from_kubeconfig(str(testbed.kubeconfig))
    if args.budget_min is not None:
        c.deadline = time.monotonic() + args.budget_min * 60
    results: dict[str, Any] = {}
    try:
        # a last: it alone can stop early (--budget-min), so b and c always run in full.
        for name in ("b", "c", "a") if args.scenario == "all" else (args.scenario,):
            count = args.count if args.count is not None else FULL_COUNTS[name]
            print(f"== scenario {name}: {count} faults", flush=True)
            results[name] = await SCENARIOS[name](c, count)
            if c.notes:
                results["notes"] = c.notes
            write_results(args, results, started)
            print(summary({name: results[name]}), flush=True)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(testbed.delete_namespace, results[name]["namespace"])
    finally:
        await c.admin.close()
        if not was_up:  # started here: leave nothing running
            await asyncio.to_thread(testbed.down)
    return results


def summary(results: dict[str, Any]) -> str:
    lines = []
    for name in ("a", "b", "c"):
        row = results.get(name)
        if row is None:
            continue
        lines.append(
            f"{name}: {row['faults_injected']} faults, {row['duplicates']} duplicates, "
            f"{row.get('orphans_after_30s', '-')} orphans, {row['lost_terminal_states']} lost "
            f"terminal states, {row['non_final_flow_runs']} non-final flow runs, "
            f"{row['wall_s']:.0f}s"
        )
        for what, timing in row["timings"].items():
            lines.append(
                f"   {what}: median {timing['median']} p90 {timing['p90']} max {timing['max']} "
                f"(n={timing['n']})"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["a", "b", "c", "all"], default="all")
    parser.add_argument("--count", type=int, help="faults per scenario (default: 100, 50, 50)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--budget-min",
        type=float,
        help="stop injecting API-server crashes (a) this many minutes after the start",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    sys.path.insert(0, str(ROOT))
    if args.child:
        child_main(args.child)
        return 0
    from flows.ui_check import prefect_server
    from kubedl_prefect.testbed.upstream import cache_root

    work = cache_root() / "bench" / "faults-jobs" / dt.datetime.now(dt.UTC).strftime("%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    print(f"logs and kubeconfigs in {work}", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="kubedl-prefect-faults-") as tmp,
        prefect_server(Path(tmp)) as server,
    ):
        quiet = {
            f"PREFECT_LOGGING_HANDLERS_{h}_LEVEL": "WARNING"
            for h in ("CONSOLE", "CONSOLE_FLOW_RUNS", "CONSOLE_TASK_RUNS")
        }
        env = {**server.env, **quiet, "PYTHONPATH": str(ROOT)}
        os.environ.update({k: v for k, v in env.items() if k.startswith("PREFECT_")})
        results = asyncio.run(campaign(args, env, work))
    print(summary(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
