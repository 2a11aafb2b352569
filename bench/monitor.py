"""Monitoring benchmark: how fast and how cheaply a wait on a training job returns.

``uv run --group bench python -m bench.monitor [--quick]``

On a test bed *without* operators this driver plays the operator. For every system (ours and two
polling baselines, see :mod:`bench.waiters`) and every scale (1, 100 and 1,000 jobs) it:

1. creates the same set of Kubeflow ``PyTorchJob`` objects (rendered by kubedl-prefect from
   ``examples/pytorch-mnist.yaml``) in a fresh namespace, and marks them Running through the
   status subresource, as the training operator would;
2. starts the system in its own process, which waits on every job, and waits until each waiter
   has seen its job once;
3. gives every job a run time drawn at random (the same draws for every system), and when it is
   up writes the terminal condition (``Succeeded``) with a status-subresource patch, reading the
   monotonic clock just before sending it (``t0``); patches are sent one at a time, so jobs end
   spread over time as they would in a real cluster;
4. collects when each wait returned (``t1``, read in the waiting process on the same clock), the
   HTTP requests the process made and its memory.

Latency is ``t1 - t0`` per job. The results go to ``bench/results/monitor.json`` (a list of rows)
and, unless ``--quick``, to the table in ``docs/benchmarks.md`` (see :mod:`bench.report`).

``--trainjob`` runs the same method on Kubeflow Trainer v2 TrainJobs (rendered in the
``trainer`` dialect from the same example): the driver plays Trainer (``status.jobsStatus`` of a
running ``node`` replicated Job, then the ``Complete`` condition Trainer copies from the JobSet),
and the SDK baseline is the Kubeflow SDK's ``TrainerClient.wait_for_job_status``. Its rows go to
``bench/results/monitor-trainjob.json`` and a section of their own in ``docs/benchmarks.md``.

The test bed runs no operators, so the driver installs the CRDs it writes or that the waits
watch (the Kubeflow training operator's, Trainer's and Volcano's) and Trainer's
``torch-distributed`` ClusterTrainingRuntime, which the SDK reads on every poll.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.waiters import WaiterProcess, now
from kubedl_prefect.errors import ConflictError, NotFoundError, TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import CONFIG_MAPS, NAMESPACES, KubeObject, ResourceKind
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend, attempt_data_key, record_object
from kubedl_prefect.lifecycle.records import AttemptRecord, record_name
from kubedl_prefect.spec import TrainingJobSpec, load_spec
from kubedl_prefect.testbed import cluster, content
from kubedl_prefect.testbed.components import Ports
from kubedl_prefect.testbed.testbed import Testbed
from kubedl_prefect.testbed.trainer import CLUSTER_TRAINING_RUNTIMES, cluster_training_runtimes
from kubedl_prefect.testbed.upstream import KUBEFLOW_TRAINING, TRAINER, VOLCANO, cache_root

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILE = ROOT / "examples" / "pytorch-mnist.yaml"
RESULTS = ROOT / "bench" / "results"
PYTORCHJOBS = ResourceKind("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
TRAINJOBS = ResourceKind("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
PYTORCHJOB = "PyTorchJob"
TRAINJOB = "TrainJob"
KINDS = {PYTORCHJOB: PYTORCHJOBS, TRAINJOB: TRAINJOBS}
DIALECTS = {PYTORCHJOB: "kubeflow", TRAINJOB: "trainer"}
TRAINJOB_RUNTIME = "torch-distributed"
"""The runtime the ``trainer`` dialect names for PyTorch; its one replicated Job is ``node``."""

logger = logging.getLogger("bench.monitor")


@dataclass(frozen=True)
class Scenario:
    """One run: a system waiting on ``jobs`` jobs that each run for a time in ``duration_s``."""

    system: str
    jobs: int
    duration_s: tuple[float, float]
    kind: str = PYTORCHJOB

    @property
    def job_seconds(self) -> str:
        low, high = self.duration_s
        return f"{low:g}-{high:g}" if low != high else f"{low:g}"


@dataclass
class Observed:
    """What the driver learned from one run."""

    t0: dict[str, float] = field(default_factory=dict)
    patched: dict[str, float] = field(default_factory=dict)
    t1: dict[str, float] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    ready: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    late_s: list[float] = field(default_factory=list)
    start: float = 0.0
    notes: list[str] = field(default_factory=list)


def plan_scenarios(quick: bool) -> list[Scenario]:
    """Every run of the benchmark, in order."""
    systems = ("kubedl-prefect", "kubeflow-sdk", "poll-5s")
    if quick:
        return [Scenario(s, n, (5.0, 10.0)) for n in (1, 10) for s in systems]
    runs = [Scenario(s, n, (20.0, 40.0)) for n in (1, 100) for s in systems]
    # 1,000 jobs end over 40 s rather than 20 s: about 25 terminal patches a second, which one
    # driver sending them one at a time can keep up with on this machine.
    runs += [Scenario(s, 1000, (20.0, 60.0)) for s in systems]
    # The same 100 jobs running three times longer: what each system's cost per job depends on.
    runs += [Scenario(s, 100, (60.0, 80.0)) for s in systems]
    return runs


def plan_trainjob_scenarios(quick: bool) -> list[Scenario]:
    """The TrainJob rows: every system waiting on 100 TrainJobs of 20-40 s (``--trainjob``)."""
    systems = ("kubedl-prefect", "kubeflow-sdk", "poll-5s")
    if quick:
        return [Scenario(s, n, (5.0, 10.0), TRAINJOB) for n in (1, 10) for s in systems]
    return [Scenario(s, 100, (20.0, 40.0), TRAINJOB) for s in systems]


def parse_scenario(text: str) -> Scenario:
    """``SYSTEM:JOBS:LOW-HIGH[:KIND]`` (or ``SYSTEM:JOBS:SECONDS``) as a :class:`Scenario`.

    ``KIND`` is ``PyTorchJob`` (the default) or ``TrainJob``.
    """
    system, jobs, seconds, *kind = text.split(":")
    low, _, high = seconds.partition("-")
    chosen = kind[0] if kind else PYTORCHJOB
    if chosen not in KINDS:
        raise ValueError(f"unknown job kind {chosen!r} in {text!r}; one of {', '.join(KINDS)}")
    return Scenario(system, int(jobs), (float(low), float(high or low)), chosen)


def durations(scenario: Scenario, seed: int) -> list[float]:
    """Run time of each job: the same draws for every system at one scale and duration range."""
    rng = random.Random(f"{seed}-{scenario.jobs}-{scenario.duration_s}")
    low, high = scenario.duration_s
    return [rng.uniform(low, high) for _ in range(scenario.jobs)]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated linearly between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: str, reason: str, message: str, at: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastUpdateTime": at,
        "lastTransitionTime": at,
    }


def running_status(
    name: str, created_at: str, roles: Sequence[str], kind: str = PYTORCHJOB
) -> KubeObject:
    """The status the training operator writes once every replica runs.

    For a TrainJob, Trainer writes no condition while it runs: only ``jobsStatus``, one entry per
    replicated Job counting its child Jobs (here each has one Job, ready).
    """
    if kind == TRAINJOB:
        return {"status": {"jobsStatus": [_jobs_status(role, ready=1) for role in roles]}}
    return {
        "status": {
            "conditions": [
                _condition("Created", "True", "PyTorchJobCreated", f"{name} created", created_at),
                _condition("Running", "True", "PyTorchJobRunning", f"{name} running", created_at),
            ],
            "replicaStatuses": {role: {"active": 1} for role in roles},
            "startTime": created_at,
        }
    }


def _jobs_status(role: str, *, ready: int = 0, succeeded: int = 0) -> dict[str, Any]:
    return {
        "name": role,
        "active": ready,
        "ready": ready,
        "succeeded": succeeded,
        "failed": 0,
        "suspended": 0,
    }


def succeeded_status(
    name: str, created_at: str, roles: Sequence[str], kind: str = PYTORCHJOB
) -> KubeObject:
    """The status the training operator writes when the job succeeded (whole condition list).

    For a TrainJob: the ``Complete`` condition Trainer v2.3.0 copies from its JobSet (reason
    ``AllJobsCompleted``), with every replicated Job's Job succeeded.
    """
    at = _rfc3339()
    if kind == TRAINJOB:
        complete = {
            "type": "Complete",
            "status": "True",
            "reason": "AllJobsCompleted",
            "message": "jobset completed successfully",
            "lastTransitionTime": at,
        }
        return {
            "status": {
                "conditions": [complete],
                "jobsStatus": [_jobs_status(role, succeeded=1) for role in roles],
            }
        }
    return {
        "status": {
            "conditions": [
                _condition("Created", "True", "PyTorchJobCreated", f"{name} created", created_at),
                _condition("Running", "False", "PyTorchJobRunning", f"{name} running", at),
                _condition("Succeeded", "True", "PyTorchJobSucceeded", f"{name} succeeded", at),
            ],
            "replicaStatuses": {role: {"active": None, "succeeded": 1} for role in roles},
            "completionTime": at,
        }
    }


class Driver:
    """Creates jobs, runs one system per process and plays the operator."""

    def __init__(
        self,
        testbed: Testbed,
        client: KubeClient,
        spec: TrainingJobSpec,
        seed: int,
        python: str,
        runtimes: dict[str, list[dict[str, Any]]],
    ):
        self.python = python
        self.runtimes = runtimes
        self.testbed = testbed
        self.client = client
        # A TrainJob has no backoffLimit and takes gang scheduling from its runtime: the same
        # job without them (the trainer dialect refuses both, with the reason).
        self.specs = {
            PYTORCHJOB: spec,
            TRAINJOB: spec.model_copy(update={"backoff_limit": None, "gang": None}),
        }
        self.seed = seed
        self.logs = cache_root() / "bench" / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.tag = datetime.now(UTC).strftime("%H%M%S")

    async def run(self, scenario: Scenario, index: int) -> dict[str, Any]:
        """One scenario, start to clean-up; returns its result row."""
        namespace = f"mon-{index:02d}-{scenario.jobs}-{self.tag}"
        await asyncio.to_thread(self.testbed.create_namespace, namespace)
        try:
            refs, created_at, roles = await self._create_jobs(
                namespace, scenario.jobs, scenario.kind
            )
            observed = await self._measure(scenario, namespace, refs, created_at, roles)
        finally:
            await self._delete_namespace(namespace)
        return self._row(scenario, observed)

    async def _create_jobs(
        self, namespace: str, count: int, kind: str
    ) -> tuple[list[JobRef], str, list[str]]:
        dialect = DIALECTS[kind]
        resource = KINDS[kind]
        spec = self.specs[kind]
        backend = KubernetesBackend(namespace=namespace, dialect=dialect)
        manifests = [backend.manifest(spec, key=f"bench-{i}") for i in range(count)]
        if kind == TRAINJOB:
            # The replicated Jobs of the runtime the manifests name (torch-distributed: node).
            runtime = manifests[0]["spec"]["runtimeRef"]["name"]
            roles = [job["name"] for job in self.runtimes[runtime]]
        else:
            roles = sorted(manifests[0]["spec"]["pytorchReplicaSpecs"])
        created_at = _rfc3339()
        limit = asyncio.Semaphore(8)

        async def create(manifest: KubeObject) -> JobRef:
            async with limit:
                obj = await self.client.create(resource, namespace, manifest)
                name = obj["metadata"]["name"]
                await self.client.patch(
                    resource,
                    namespace,
                    name,
                    running_status(name, created_at, roles, kind),
                    subresource="status",
                )
            metadata = obj["metadata"]
            ref = JobRef(
                backend="kubernetes",
                cluster="",
                dialect=dialect,
                namespace=namespace,
                name=name,
                uid=metadata["uid"],
                api_version=obj["apiVersion"],
                kind=obj["kind"],
                key=metadata["annotations"]["kubedl-prefect.io/key"],
                attempt=1,
                spec_hash=metadata["annotations"]["kubedl-prefect.io/spec-hash"],
            )
            # The run record submit() would have made, so the waiter writes the end in one patch.
            submitted = AttemptRecord(attempt=1, name=name, uid=ref.uid, ref=ref.to_dict())
            record = record_object(
                record_name(spec.name, ref.key),
                ref,
                spec.name,
                {attempt_data_key(1): json.dumps(submitted.to_dict())},
            )
            async with limit:
                await self.client.create(CONFIG_MAPS, namespace, record)
            return ref

        refs = await asyncio.gather(*(create(m) for m in manifests))
        return list(refs), created_at, roles

    async def _measure(
        self,
        scenario: Scenario,
        namespace: str,
        refs: list[JobRef],
        created_at: str,
        roles: list[str],
    ) -> Observed:
        observed = Observed()
        plan = {
            "system": scenario.system,
            "kind": scenario.kind,
            "namespace": namespace,
            "kubeconfig": str(self.testbed.kubeconfig),
            "jobs": [ref.to_dict() for ref in refs],
        }
        plan_file = self._write(f"{namespace}-plan.json", json.dumps(plan))
        log_file = self.logs / f"{namespace}-{scenario.system}.log"
        total = len(refs)

        def done(message: dict[str, Any]) -> None:
            observed.phases[message["name"]] = message["phase"]

        waiters = WaiterProcess(observed, total, on_done=done)
        async with waiters.running(self.python, plan_file, log_file, ROOT) as process:
            await asyncio.wait_for(waiters.ready.wait(), timeout=180 + total * 0.2)
            if not observed.ready:
                raise RuntimeError(f"{scenario.system} ended before it was ready; see {log_file}")
            start = observed.start = now()
            runs = durations(scenario, self.seed)
            schedule = sorted((start + d, ref.name) for d, ref in zip(runs, refs, strict=True))
            await self._finish_jobs(namespace, scenario.kind, schedule, created_at, roles, observed)
            grace = 90.0 + total * 0.05
            try:
                await asyncio.wait_for(waiters.finished.wait(), timeout=grace)
            except TimeoutError:
                observed.notes.append(
                    f"{total - len(observed.t1)} of {total} waits had not returned "
                    f"{grace:.0f} s after the last job ended"
                )
                process.terminate()
            if not waiters.summarised.is_set():
                try:
                    await asyncio.wait_for(waiters.summarised.wait(), timeout=30)
                except TimeoutError:
                    observed.notes.append("no summary from the waiting process")
            await asyncio.wait_for(process.wait(), timeout=30)
        raw = {
            name: {
                "t0": observed.t0.get(name),
                "patched": observed.patched.get(name),
                "t1": observed.t1.get(name),
            }
            for name in (ref.name for ref in refs)
        }
        self._write(f"{namespace}-raw.json", json.dumps({"ready": observed.ready, "jobs": raw}))
        if process.returncode not in (0, -15):
            observed.notes.append(f"waiting process exited {process.returncode}; see {log_file}")
        return observed

    def _write(self, name: str, text: str) -> Path:
        path = self.logs / name
        path.write_text(text)
        return path

    async def _finish_jobs(
        self,
        namespace: str,
        kind: str,
        schedule: list[tuple[float, str]],
        created_at: str,
        roles: list[str],
        observed: Observed,
    ) -> None:
        """Write each job's terminal condition at its time, one patch after the other.

        One at a time, because patches in flight together queue behind each other in the API
        server, which would add the driver's own load to every system's latency. When the API
        server answers slowly, later jobs end late (run longer): ``run_s_mean`` shows it.
        """
        for due, name in schedule:
            delay = due - now()
            if delay > 0:
                await asyncio.sleep(delay)
            body = succeeded_status(name, created_at, roles, kind)
            t0 = now()
            await self.client.patch(KINDS[kind], namespace, name, body, subresource="status")
            observed.patched[name] = now()
            observed.t0[name] = t0
            observed.late_s.append(t0 - due)

    async def _delete_namespace(self, namespace: str) -> None:
        """Delete the namespace and wait until it is gone, so runs do not overlap."""
        await self.client.delete(NAMESPACES, None, namespace, propagation="Background")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                await self.client.get(NAMESPACES, None, namespace)
            except NotFoundError:
                return
            await asyncio.sleep(1.0)
        logger.warning("namespace %s still there after 600 s", namespace)

    def _row(self, scenario: Scenario, observed: Observed) -> dict[str, Any]:
        latencies = [
            (observed.t1[name] - t0) * 1000
            for name, t0 in observed.t0.items()
            if name in observed.t1 and name not in observed.errors
        ]
        early = sum(1 for value in latencies if value < 0)
        if early:
            observed.notes.append(f"{early} waits returned before the terminal condition")
        wrong = sum(1 for phase in observed.phases.values() if phase != "Succeeded")
        if wrong:
            observed.notes.append(f"{wrong} waits returned another phase than Succeeded")
        if observed.errors:
            first = next(iter(observed.errors.values()))
            observed.notes.append(f"{len(observed.errors)} waits raised, e.g. {first}")
        if observed.late_s and max(observed.late_s) > 1.0:
            observed.notes.append(
                f"terminal conditions written up to {max(observed.late_s):.1f} s late "
                "(the API server answered the driver slowly)"
            )
        summary = observed.summary
        requests = summary.get("requests")
        runs = [t0 - observed.start for t0 in observed.t0.values()]
        patch_ms = [(observed.patched[n] - t0) * 1000 for n, t0 in observed.t0.items()]
        return {
            "system": scenario.system,
            "kind": scenario.kind,
            "jobs": scenario.jobs,
            "job_seconds": scenario.job_seconds,
            "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "max_ms": round(max(latencies), 1) if latencies else None,
            "over_100ms": sum(1 for value in latencies if value > 100),
            "returned": len(latencies),
            "requests": requests,
            "requests_per_job": round(requests / scenario.jobs, 4) if requests else None,
            "rss_mb": round(summary["vm_hwm_kb"] / 1024, 1) if summary else None,
            "rss_start_mb": round(summary["rss_start"]["vm_rss_kb"] / 1024, 1) if summary else None,
            "run_s_mean": round(statistics.fmean(runs), 1) if runs else None,
            "patch_p50_ms": round(percentile(patch_ms, 50), 1) if patch_ms else None,
            "patch_late_p99_ms": round(percentile(observed.late_s, 99) * 1000, 1)
            if observed.late_s
            else None,
            "load_1m": round(os.getloadavg()[0], 1),
            "notes": "; ".join(observed.notes),
        }


def bench_python() -> str:
    """The interpreter of the waiting processes: a virtual environment of the benchmark's own.

    It holds the locked main and ``bench`` dependencies (``uv export`` of ``uv.lock``) and this
    checkout as an editable install, so that a ``uv sync`` run meanwhile in the project's
    environment (which removes the ``bench`` group) cannot pull the SDK away in mid-run.
    """
    uv = shutil.which("uv")
    if uv is None:
        logger.warning("uv not found: the waiting processes use %s", sys.executable)
        return sys.executable
    venv = cache_root() / "bench-venv"
    python = venv / "bin" / "python"
    exported = subprocess.run(
        [uv, "export", "--frozen", "--no-default-groups", "--group", "bench", "--no-hashes"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    requirements = venv.with_name("bench-venv-requirements.txt")
    requirements.parent.mkdir(parents=True, exist_ok=True)
    requirements.write_text(exported)
    if not python.exists():
        subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    subprocess.run(
        [uv, "pip", "sync", "--quiet", "--python", str(python), str(requirements)],
        cwd=ROOT,
        check=True,
    )
    return str(python)


def package_versions(python: str) -> dict[str, str]:
    """Versions of the measured packages in the waiting processes' environment."""
    script = (
        "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
        "('kubedl-prefect', 'kubeflow-training', 'kubeflow', 'kubernetes', 'kubernetes-asyncio')}))"
    )
    found: dict[str, str] = json.loads(
        subprocess.run([python, "-c", script], check=True, capture_output=True, text=True).stdout
    )
    return found


async def install_job_apis(testbed: Testbed, client: KubeClient) -> dict[str, list[dict[str, Any]]]:
    """Install what the driver writes on a test bed without operators; return the runtimes.

    The CRDs of the Kubeflow training operator (``PyTorchJob``), of Trainer (``TrainJob`` and
    its runtimes) and of Volcano (kubedl-prefect's waits watch PodGroups), and Trainer's
    :data:`TRAINJOB_RUNTIME` ClusterTrainingRuntime, which the Kubeflow SDK reads each time it
    reads a TrainJob. Returns ``{runtime name: its replicatedJobs}`` of the runtimes installed.
    """
    wanted = (KUBEFLOW_TRAINING, TRAINER, VOLCANO)
    sources = tuple(s for s in content.CRD_SOURCES if s.module in wanted)
    manifests = await asyncio.to_thread(content.crd_manifests, sources)
    await asyncio.to_thread(cluster.call, testbed.layout, cluster.apply_crds, manifests)
    installed: dict[str, list[dict[str, Any]]] = {}
    for runtime in await asyncio.to_thread(cluster_training_runtimes):
        name = runtime["metadata"]["name"]
        if name != TRAINJOB_RUNTIME:
            continue
        with contextlib.suppress(ConflictError):
            await client.create(CLUSTER_TRAINING_RUNTIMES, None, runtime)
        installed[name] = list(runtime["spec"]["template"]["spec"]["replicatedJobs"])
    return installed


def _bring_up(name: str, port_base: int) -> tuple[Testbed, bool]:
    testbed = Testbed(name, ports=Ports(port_base), operators=False)
    state = testbed.status()
    was_up = state.up
    if was_up and state.operators:
        raise TestbedError(
            f"test bed {name} runs the training operators: they would overwrite the statuses "
            "this benchmark writes",
            hint=f"stop it (kubedl-prefect testbed down --name {name} --port-base {port_base}) "
            "or pass another --testbed name",
        )
    testbed.up()
    return testbed, not was_up


async def _run_all(
    testbed: Testbed, scenarios: list[Scenario], seed: int, python: str
) -> tuple[list[dict[str, Any]], float]:
    spec = load_spec(SPEC_FILE)
    client = await KubeClient.from_kubeconfig(str(testbed.kubeconfig))
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        runtimes = await install_job_apis(testbed, client)
        driver = Driver(testbed, client, spec, seed, python, runtimes)
        for index, scenario in enumerate(scenarios):
            began = time.monotonic()
            row = await driver.run(scenario, index)
            rows.append(row)
            logger.info(
                "%-15s jobs=%-5d %-6s p50=%8s ms  p99=%8s ms  req/job=%6s  rss=%6s MB  (%.0f s)%s",
                row["system"],
                row["jobs"],
                row["job_seconds"],
                row["p50_ms"],
                row["p99_ms"],
                row["requests_per_job"],
                row["rss_mb"],
                time.monotonic() - began,
                f"  {row['notes']}" if row["notes"] else "",
            )
    finally:
        await client.close()
    return rows, time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.monitor", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 and 10 jobs of 5-10 s (smoke)")
    parser.add_argument("--testbed", default="bench", help="test bed name (default: bench)")
    parser.add_argument("--port-base", type=int, default=29400, help="its ports (default 29400)")
    parser.add_argument("--seed", type=int, default=20261130, help="seed of the job run times")
    parser.add_argument(
        "--keep-testbed", action="store_true", help="leave a test bed this run started running"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="SYSTEM:JOBS:LOW-HIGH",
        help="run only these (repeatable), e.g. kubedl-prefect:1000:20-40; results as --quick",
    )
    parser.add_argument(
        "--trainjob",
        action="store_true",
        help="the TrainJob rows (100 Kubeflow Trainer v2 TrainJobs; with --quick, 1 and 10)",
    )
    parser.add_argument("--output", type=Path, help="results file (default bench/results/...)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    partial = args.quick or bool(args.scenario)
    stem = "monitor-trainjob" if args.trainjob else "monitor"
    output = args.output or RESULTS / (f"{stem}-quick.json" if partial else f"{stem}.json")
    if args.scenario:
        scenarios = [parse_scenario(text) for text in args.scenario]
    elif args.trainjob:
        scenarios = plan_trainjob_scenarios(args.quick)
    else:
        scenarios = plan_scenarios(args.quick)
    python = bench_python()
    versions = package_versions(python)
    testbed, started_here = _bring_up(args.testbed, args.port_base)
    try:
        rows, elapsed = asyncio.run(_run_all(testbed, scenarios, args.seed, python))
    finally:
        if started_here and not args.keep_testbed:
            testbed.down()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(rows, indent=2) + "\n")
    meta = report.machine_info(versions)
    meta.update(
        {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "elapsed_s": round(elapsed),
            "seed": args.seed,
            "quick": partial,
            "command": "uv run --group bench python -m bench.monitor"
            + (" --trainjob" if args.trainjob else "")
            + (" --quick" if args.quick else ""),
        }
    )
    meta_file = output.with_name(output.stem + "-meta.json")
    meta_file.write_text(json.dumps(meta, indent=2) + "\n")
    logger.info("results in %s (%d rows, %.0f s)", output, len(rows), elapsed)
    if not partial:
        if args.trainjob:
            report.write_trainjob_docs(rows, meta)
        else:
            report.write_docs(rows, meta)
        logger.info("table in %s", report.DOCS)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
