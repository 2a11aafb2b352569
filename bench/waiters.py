"""One waiting system in its own process: ``python -m bench.waiters PLAN.json``.

The driver (:mod:`bench.monitor`, :mod:`bench.kueue_admission`) creates the jobs, starts this
process (:class:`WaiterProcess`, which reads its lines) and then plays the operator, or frees
the queue's quota. This process waits on every job of the plan with one system and reports on
stdout, one JSON object a line:

* ``{"event": "ready", ...}`` once every waiter has seen its job (Running) once;
* ``{"event": "done", "name": ..., "t1": ..., "phase": ...}`` when a wait returned, with ``t1``
  read from the system-wide monotonic clock right after the call returned;
* ``{"event": "error", "name": ..., "error": ...}`` when a wait raised;
* ``{"event": "summary", "requests": ..., "vm_hwm_kb": ..., ...}`` at the end.

Only the standard library is imported at module level: each system imports what it needs, so
the process's memory is that system's.

Systems:

* ``kubedl-prefect``: ``KubernetesBackend.wait_completed`` per job (shared informers); requests
  read from ``KubeClient.request_count``.
* ``kubeflow-sdk``: ``kubeflow.training.TrainingClient.wait_for_job_conditions`` with its
  defaults (a GET every 15 s), one thread per job, as its API blocks; requests counted by
  wrapping ``kubernetes.client.rest.RESTClientObject.request``.
* ``poll-5s``: a GET of the job every 5 s with kubedl-prefect's ``KubeClient``, one coroutine per
  job; requests from ``request_count``.

The plan's ``kind`` says what the jobs are: ``PyTorchJob`` (the default) or ``TrainJob``
(Kubeflow Trainer v2). For TrainJobs ``kubedl-prefect`` waits in the ``trainer`` dialect,
``poll-5s`` reads the TrainJob's ``Complete``/``Failed`` conditions, and ``kubeflow-sdk`` is the
Kubeflow SDK's ``kubeflow.trainer.TrainerClient.wait_for_job_status`` with its defaults (every
2 s it GETs the TrainJob, its runtime — the namespaced TrainingRuntime first, then the
ClusterTrainingRuntime — and lists the TrainJob's pods; 600 s limit), one thread per job.

With ``"until": "admitted"`` in the plan (:mod:`bench.kueue_admission`), the jobs wait in a
Kueue LocalQueue and each wait ends when it reports the job **admitted** by Kueue: ``ready``
once every waiter has seen its job queued, ``done`` (with the process's request count so far)
when it reports the admission. ``kubedl-prefect`` is ``KubernetesBackend.wait_admitted`` with a
phase callback (its Workload watched through the namespace's shared informer); ``poll-5s`` GETs
the job every 5 s until Kueue has unsuspended it. ``kubeflow-sdk`` has no such wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kubedl_prefect.kube.resources import ResourceKind

SYSTEMS = ("kubedl-prefect", "kubeflow-sdk", "poll-5s")
TRAINJOB = "TrainJob"
_DIALECTS = {"PyTorchJob": "kubeflow", TRAINJOB: "trainer"}
_TERMINAL = {"Succeeded": "Succeeded", "Failed": "Failed", "Complete": "Succeeded"}
POLL_INTERVAL_S = 5.0
_OUT_LOCK = threading.Lock()


def now() -> float:
    """The system-wide monotonic clock (CLOCK_MONOTONIC is shared by all processes on Linux)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class Told(Protocol):
    """Where a driver keeps what the waiting process tells it (its ``Observed``)."""

    ready: dict[str, Any]
    t1: dict[str, float]
    errors: dict[str, str]
    summary: dict[str, Any]


class WaiterProcess:
    """The driver's side: this module run as a process on a plan, and what it says on stdout.

    Each line is noted in ``told`` as it comes (``ready``, each ``done`` job's ``t1``, each
    ``error``, the ``summary``); ``on_done`` gets the rest of a ``done`` line (its ``phase``,
    its ``requests``). ``ready``, ``finished`` (every job of ``total`` returned, or stdout
    closed) and ``summarised`` are set as they happen.

    Args:
        told: The driver's record of the run.
        total: How many jobs the plan waits on.
        on_done: Called with each ``done`` line (``name``, ``t1`` and the system's fields).
    """

    def __init__(
        self, told: Told, total: int, on_done: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.told, self.total, self.on_done = told, total, on_done
        self.ready, self.finished, self.summarised = (
            asyncio.Event(),
            asyncio.Event(),
            asyncio.Event(),
        )

    @contextlib.asynccontextmanager
    async def running(
        self, python: str, plan_file: Path, log_file: Path, cwd: Path
    ) -> AsyncIterator[asyncio.subprocess.Process]:
        """Start ``python -m bench.waiters PLAN`` (stderr to ``log_file``) and read its lines.

        On exit a process still running is killed, and the reading stops.
        """
        with log_file.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                python,
                "-m",
                "bench.waiters",
                str(plan_file),
                cwd=cwd,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                limit=2**20,
            )
            assert process.stdout is not None
            reader = asyncio.create_task(self._read(process.stdout))
            try:
                yield process
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                reader.cancel()

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        told = self.told
        async for raw in stdout:
            message = json.loads(raw)
            event = message.pop("event")
            if event == "ready":
                told.ready = message
                self.ready.set()
            elif event == "done":
                told.t1[message["name"]] = message["t1"]
                if self.on_done is not None:
                    self.on_done(message)
            elif event == "error":
                told.errors[message["name"]] = message["error"]
                told.t1.setdefault(message["name"], message["t1"])
            elif event == "summary":
                told.summary = message
                self.summarised.set()
            if len(told.t1) >= self.total:
                self.finished.set()
        self.finished.set()
        self.ready.set()


def memory_kb() -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak resident set) of this process, in KiB."""
    found: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key.lower()] = int(value.split()[0])
    return {"vm_rss_kb": found["vmrss"], "vm_hwm_kb": found["vmhwm"]}


def emit(event: str, **fields: Any) -> None:
    """Write one JSON line on stdout (thread-safe)."""
    line = json.dumps({"event": event, **fields})
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _terminal(job: dict[str, Any]) -> str | None:
    """``Succeeded``/``Failed`` when such a condition is True, else ``None`` (baseline poller).

    A TrainJob's ``Complete`` condition reads ``Succeeded``.
    """
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in _TERMINAL and condition.get("status") == "True":
            return _TERMINAL[str(condition["type"])]
    return None


class _Seen:
    """Names of jobs each waiter has observed once; thread-safe, with an event when all have."""

    def __init__(self, total: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.total = total
        self.all_seen = asyncio.Event() if loop is not None else None
        self._loop = loop
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def add(self, name: str) -> None:
        with self._lock:
            self._names.add(name)
            complete = len(self._names) == self.total
        if complete and self._loop is not None and self.all_seen is not None:
            self._loop.call_soon_threadsafe(self.all_seen.set)

    def __len__(self) -> int:
        with self._lock:
            return len(self._names)


async def _ready_when(
    seen: _Seen, tasks: list[asyncio.Future[Any]], requests: Callable[[], int] | None = None
) -> None:
    """Emit ``ready`` once every waiter has observed its job (or every waiter has ended).

    With ``requests``, the event carries the process's request count at that moment.
    """
    assert seen.all_seen is not None
    all_seen: asyncio.Future[Any] = asyncio.ensure_future(seen.all_seen.wait())
    all_ended: asyncio.Future[Any] = asyncio.gather(*tasks)
    await asyncio.wait({all_seen, all_ended}, return_when=asyncio.FIRST_COMPLETED)
    all_seen.cancel()
    counted = {"requests": requests()} if requests is not None else {}
    emit("ready", t=now(), seen=len(seen), **counted, **memory_kb())


async def run_kubedl_prefect(plan: dict[str, Any]) -> None:
    from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend

    backend = KubernetesBackend(
        namespace=plan["namespace"],
        dialect=_DIALECTS[plan.get("kind", "PyTorchJob")],
        kubeconfig=plan["kubeconfig"],
    )
    seen = _Seen(len(plan["jobs"]), asyncio.get_running_loop())

    def observer(name: str) -> Callable[[PhaseUpdate], None]:
        return lambda _update: seen.add(name)

    async def wait_one(ref: JobRef) -> None:
        try:
            outcome = await backend.wait_completed(ref, on_phase=observer(ref.name))
        except Exception as exc:
            emit("error", name=ref.name, t1=now(), error=repr(exc))
            return
        t1 = now()
        emit("done", name=ref.name, t1=t1, phase=str(outcome.status.phase))

    refs = [JobRef.from_dict(job) for job in plan["jobs"]]
    client = await backend.client()  # loads the kubeconfig; sends nothing
    rss_start = memory_kb()
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(wait_one(ref)) for ref in refs]
    await _ready_when(seen, tasks)
    await asyncio.gather(*tasks)
    emit("summary", requests=client.request_count, rss_start=rss_start, **memory_kb())
    await backend.close()


def _job_kind(plan: dict[str, Any]) -> ResourceKind:
    """The resource of the plan's jobs: Kubeflow v1 PyTorchJobs, or Trainer v2 TrainJobs."""
    from kubedl_prefect.kube.resources import ResourceKind

    if plan.get("kind") == TRAINJOB:
        return ResourceKind("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
    return ResourceKind("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")


async def run_poll(plan: dict[str, Any]) -> None:
    from kubedl_prefect.kube.client import KubeClient

    kind = _job_kind(plan)
    namespace = plan["namespace"]
    client = await KubeClient.from_kubeconfig(plan["kubeconfig"])
    seen = _Seen(len(plan["jobs"]), asyncio.get_running_loop())

    async def wait_one(name: str) -> None:
        try:
            while True:
                job = await client.get(kind, namespace, name)
                seen.add(name)
                phase = _terminal(job)
                if phase is not None:
                    emit("done", name=name, t1=now(), phase=phase)
                    return
                await asyncio.sleep(POLL_INTERVAL_S)
        except Exception as exc:
            emit("error", name=name, t1=now(), error=repr(exc))

    names = [job["name"] for job in plan["jobs"]]
    rss_start = memory_kb()
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(wait_one(n)) for n in names]
    await _ready_when(seen, tasks)
    await asyncio.gather(*tasks)
    emit("summary", requests=client.request_count, rss_start=rss_start, **memory_kb())
    await client.close()


ADMITTED = "admitted"


async def admit_kubedl_prefect(plan: dict[str, Any]) -> None:
    """``wait_admitted`` per queued job; ``done`` when its phase callback first says admitted."""
    from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
    from kubedl_prefect.lifecycle.status import Phase

    backend = KubernetesBackend(
        namespace=plan["namespace"],
        dialect=_DIALECTS[plan.get("kind", "PyTorchJob")],
        kubeconfig=plan["kubeconfig"],
    )
    client = await backend.client()  # loads the kubeconfig; sends nothing
    seen = _Seen(len(plan["jobs"]), asyncio.get_running_loop())
    past_queue = (Phase.ADMITTED, Phase.RUNNING, Phase.SUCCEEDED)

    def admitted(update: PhaseUpdate) -> bool:
        hold = update.status.queue
        return (hold is not None and hold.admitted) or update.phase in past_queue

    async def wait_one(ref: JobRef) -> None:
        reported: list[float] = []

        def on_phase(update: PhaseUpdate) -> None:
            if update.phase is Phase.QUEUING:
                seen.add(ref.name)
            if not reported and admitted(update):
                reported.append(now())
                emit(
                    "done",
                    name=ref.name,
                    t1=reported[0],
                    phase=str(update.phase),
                    requests=client.request_count,
                )

        try:
            await backend.wait_admitted(ref, timeout_s=None, on_phase=on_phase)
        except Exception as exc:
            emit("error", name=ref.name, t1=now(), error=repr(exc))
            return
        if not reported:  # no update said it before the wait returned
            emit("done", name=ref.name, t1=now(), phase="Admitted", requests=client.request_count)

    refs = [JobRef.from_dict(job) for job in plan["jobs"]]
    rss_start = memory_kb()
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(wait_one(ref)) for ref in refs]
    await _ready_when(seen, tasks, requests=lambda: client.request_count)
    await asyncio.gather(*tasks)
    emit("summary", requests=client.request_count, rss_start=rss_start, **memory_kb())
    await backend.close()


async def admit_poll(plan: dict[str, Any]) -> None:
    """A GET of each job every 5 s until Kueue has unsuspended it (its suspend field false)."""
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.lifecycle.kubernetes.kueue import suspended

    kind = _job_kind(plan)
    namespace = plan["namespace"]
    client = await KubeClient.from_kubeconfig(plan["kubeconfig"])
    seen = _Seen(len(plan["jobs"]), asyncio.get_running_loop())

    async def wait_one(name: str) -> None:
        try:
            while True:
                job = await client.get(kind, namespace, name)
                if not suspended(job):
                    emit(
                        "done", name=name, t1=now(), phase="Admitted", requests=client.request_count
                    )
                    return
                seen.add(name)
                await asyncio.sleep(POLL_INTERVAL_S)
        except Exception as exc:
            emit("error", name=name, t1=now(), error=repr(exc))

    names = [job["name"] for job in plan["jobs"]]
    rss_start = memory_kb()
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(wait_one(n)) for n in names]
    await _ready_when(seen, tasks, requests=lambda: client.request_count)
    await asyncio.gather(*tasks)
    emit("summary", requests=client.request_count, rss_start=rss_start, **memory_kb())
    await client.close()


def _count_requests() -> Callable[[], int]:
    """Count every request of the sync Kubernetes client; return a reader of the count."""
    from kubernetes.client import rest  # type: ignore[import-untyped]

    count = [0]
    count_lock = threading.Lock()
    original = rest.RESTClientObject.request

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        with count_lock:
            count[0] += 1
        return original(self, *args, **kwargs)

    rest.RESTClientObject.request = counted

    def read() -> int:
        with count_lock:
            return count[0]

    return read


def _wait_in_threads(names: list[str], seen: _Seen, wait_one: Callable[[str], None]) -> None:
    """Run ``wait_one`` per job in a thread each; ``ready`` once every job was seen once."""
    threads = [
        threading.Thread(target=wait_one, args=(n,), name=f"wait-{n}", daemon=True) for n in names
    ]
    for thread in threads:
        thread.start()
    while len(seen) < len(names) and any(t.is_alive() for t in threads):
        time.sleep(0.02)
    emit("ready", t=now(), seen=len(seen), **memory_kb())
    for thread in threads:
        thread.join()


def run_trainer_client(plan: dict[str, Any]) -> None:
    """The Kubeflow SDK's ``TrainerClient.wait_for_job_status`` per TrainJob, its defaults."""
    from kubeflow.common.types import KubernetesBackendConfig  # type: ignore[import-untyped]
    from kubeflow.trainer import TrainerClient  # type: ignore[import-untyped]

    requests = _count_requests()
    namespace = plan["namespace"]
    trainer = TrainerClient(
        KubernetesBackendConfig(namespace=namespace, config_file=plan["kubeconfig"])
    )
    seen = _Seen(len(plan["jobs"]))

    def wait_one(name: str) -> None:
        try:
            job = trainer.wait_for_job_status(name, callbacks=[lambda _job: seen.add(name)])
        except Exception as exc:
            emit("error", name=name, t1=now(), error=repr(exc))
            return
        t1 = now()
        emit("done", name=name, t1=t1, phase=_TERMINAL.get(job.status, job.status))

    names = [job["name"] for job in plan["jobs"]]
    rss_start = memory_kb()
    _wait_in_threads(names, seen, wait_one)
    emit("summary", requests=requests(), rss_start=rss_start, **memory_kb())


def run_kubeflow_sdk(plan: dict[str, Any]) -> None:
    from kubeflow.training import TrainingClient  # type: ignore[import-untyped]

    requests = _count_requests()
    namespace = plan["namespace"]
    training = TrainingClient(
        config_file=plan["kubeconfig"], namespace=namespace, job_kind="PyTorchJob"
    )
    seen = _Seen(len(plan["jobs"]))

    def wait_one(name: str) -> None:
        try:
            job = training.wait_for_job_conditions(
                name, namespace=namespace, callback=lambda _job: seen.add(name)
            )
        except Exception as exc:
            emit("error", name=name, t1=now(), error=repr(exc))
            return
        t1 = now()
        conditions = [c.type for c in job.status.conditions if c.status == "True"]
        emit("done", name=name, t1=t1, phase=conditions[-1] if conditions else "?")

    names = [job["name"] for job in plan["jobs"]]
    rss_start = memory_kb()
    _wait_in_threads(names, seen, wait_one)
    emit("summary", requests=requests(), rss_start=rss_start, **memory_kb())


def _log_collections() -> None:
    """With ``BENCH_GC_LOG=1``: log each garbage collection of 10 ms or more on stderr."""
    import gc

    started: list[float] = [0.0, 0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [now(), time.thread_time()]
            return
        wall = (now() - started[0]) * 1000
        cpu = (time.thread_time() - started[1]) * 1000
        if wall >= 10:
            print(
                f"gc gen{info['generation']} wall {wall:.0f} ms cpu {cpu:.0f} ms at {now():.3f} "
                f"({info['collected']} collected)",
                file=sys.stderr,
            )

    gc.callbacks.append(callback)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.waiters PLAN.json", file=sys.stderr)
        return 2
    plan = json.loads(Path(argv[0]).read_text())
    system = plan["system"]
    if os.environ.get("BENCH_GC_LOG") == "1":
        _log_collections()
    if plan.get("until") == ADMITTED and system == "kubedl-prefect":
        asyncio.run(admit_kubedl_prefect(plan))
    elif plan.get("until") == ADMITTED and system == "poll-5s":
        asyncio.run(admit_poll(plan))
    elif plan.get("until") == ADMITTED:
        print(
            f"{system!r} has no admission wait; one of {', '.join(SYSTEMS[::2])}", file=sys.stderr
        )
        return 2
    elif system == "kubedl-prefect":
        asyncio.run(run_kubedl_prefect(plan))
    elif system == "poll-5s":
        asyncio.run(run_poll(plan))
    elif system == "kubeflow-sdk" and plan.get("kind") == TRAINJOB:
        run_trainer_client(plan)
    elif system == "kubeflow-sdk":
        run_kubeflow_sdk(plan)
    else:
        print(f"unknown system {system!r}; one of {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
