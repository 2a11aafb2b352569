"""The local backend with real processes: tests/unit/local/replica.py as every replica.

Each job takes well under a second; the supervisor, the replicas and whatever they start are
real processes of this machine, checked through the process table, never through a flag.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from kubedl_prefect.errors import (
    AdmissionRefusedError,
    AdoptionRefusedError,
    CompletionTimeoutError,
    FailureCategory,
    JobCancelledError,
    JobFailedError,
    KubeDLPrefectError,
    SpecError,
)
from kubedl_prefect.lifecycle.backend import (
    JobRef,
    LogLine,
    PhaseUpdate,
    SyncTrainingBackend,
    TrainingBackend,
    WaitTimeouts,
)
from kubedl_prefect.lifecycle.local import LocalBackend, LocalCapacity
from kubedl_prefect.lifecycle.records import record_name
from kubedl_prefect.lifecycle.retry import RetryPolicy, arun_to_completion
from kubedl_prefect.lifecycle.run import areattach
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import job_name, parse_spec
from tests.unit.local.helpers import SpecFactory, job_processes

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_s=0.0)


def checkpoint_of(workspace: Path) -> Path:
    (found,) = (workspace / "checkpoints").iterdir()
    return found


def test_the_local_backend_is_a_training_backend_with_every_protocol_argument() -> None:
    assert isinstance(LocalBackend("/tmp/x"), TrainingBackend)
    for name, member in inspect.getmembers(TrainingBackend):
        if name.startswith("_") or not inspect.iscoroutinefunction(member):
            continue
        ours = inspect.signature(getattr(LocalBackend, name)).parameters
        for parameter in inspect.signature(member).parameters.values():
            assert parameter.name in ours, (name, parameter.name)
            assert ours[parameter.name].kind == parameter.kind
            assert ours[parameter.name].default == parameter.default


async def test_two_replicas_get_the_operators_environment_and_succeed_with_labelled_logs(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = replica_spec("sleep", workers=1, REPLICA_SLEEP=1)
    ref = await backend.submit(spec, key="run-1")
    assert (ref.backend, ref.dialect, ref.namespace, ref.kind) == (
        "local",
        "local",
        backend.workspace,
        "PyTorchJob",
    )
    assert backend.workspace == str(workspace)
    assert ref.name == job_name("tiny", "run-1", 1)
    assert ref.uid
    phases: list[PhaseUpdate] = []
    lines: list[LogLine] = []
    logs = asyncio.create_task(backend.follow_logs(ref, lines.append))
    outcome = await backend.wait_completed(ref, on_phase=phases.append)
    await logs

    assert outcome.succeeded
    assert outcome.diagnosis is None
    seen = list(dict.fromkeys(u.phase for u in phases))  # each change once, replica counts too
    assert seen[-2:] == [Phase.RUNNING, Phase.SUCCEEDED]
    assert set(seen) <= {Phase.ADMITTED, Phase.RUNNING, Phase.SUCCEEDED}
    assert outcome.status.replicas["worker"].succeeded == 1

    ckpt = checkpoint_of(workspace)
    master = json.loads((ckpt / "env-master-0.json").read_text())
    worker = json.loads((ckpt / "env-worker-0.json").read_text())
    assert master["MASTER_ADDR"] == worker["MASTER_ADDR"] == "127.0.0.1"
    assert master["MASTER_PORT"] == worker["MASTER_PORT"]
    assert int(master["MASTER_PORT"]) > 0
    assert (master["RANK"], worker["RANK"]) == ("0", "1")
    assert master["WORLD_SIZE"] == worker["WORLD_SIZE"] == "2"
    assert master["LOCAL_RANK"] == "0"
    assert master["CUDA_VISIBLE_DEVICES"] == ""
    assert master["PYTHONUNBUFFERED"] == "0"
    assert master["TF_CONFIG"] is None
    assert master["KUBEDL_PREFECT_CHECKPOINT_DIR"] == str(ckpt)
    assert master["EXTRA"] == "from-the-backend"
    assert master["python"] == sys.executable
    assert master["cwd"] == str(tmp_path)

    by_replica = {(line.replica, line.text) for line in lines}
    assert ("master-0", "hello from master-0") in by_replica
    assert ("worker-0", "bye from worker-0") in by_replica
    assert all(line.container == "pytorch" and line.attempt == 1 for line in lines)
    assert all(line.timestamp.endswith("Z") for line in lines)
    # Every replica is gone when the job ends; the supervisor exits right after.
    _, alive = psutil.wait_procs(job_processes(workspace), timeout=5)
    assert alive == []


async def test_a_finished_job_is_replayed_from_its_record_without_running_again(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory
) -> None:
    spec = replica_spec(workers=0)
    first = await arun_to_completion(backend, spec, key="nightly", retry=FAST_RETRY)
    assert first.succeeded
    assert not first.replayed
    await backend.cancel(first.ref)  # the job is cleaned up; its record stays
    again = await arun_to_completion(backend, spec, key="nightly", retry=FAST_RETRY)
    assert again.replayed
    assert again.succeeded
    assert again.ref == first.ref
    starts = (checkpoint_of(workspace) / "starts-master-0").read_text().split()
    assert len(starts) == 1
    record = await backend.history(spec, key="nightly")
    assert record is not None
    assert [a.phase for a in record.attempts] == ["Succeeded"]
    assert (workspace / "records" / f"{record_name('tiny', 'nightly')}.json").exists()


async def test_submitting_the_same_attempt_twice_adopts_the_running_job(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory
) -> None:
    spec = replica_spec("sleep", workers=0, REPLICA_SLEEP=1)
    first, second = await asyncio.gather(
        backend.submit(spec, key="k"), backend.submit(spec, key="k")
    )
    assert first == second
    outcome = await backend.wait_completed(first)
    assert outcome.succeeded
    assert len((checkpoint_of(workspace) / "starts-master-0").read_text().split()) == 1


async def test_another_spec_under_the_same_key_is_refused(
    backend: LocalBackend, replica_spec: SpecFactory
) -> None:
    ref = await backend.submit(replica_spec("sleep", workers=0, REPLICA_SLEEP=1), key="k")
    with pytest.raises(AdoptionRefusedError, match="another spec"):
        await backend.submit(replica_spec("sleep", workers=0, REPLICA_SLEEP=2), key="k")
    await backend.cancel(ref)


@pytest.mark.parametrize(
    ("code", "category", "retryable"),
    [
        (3, FailureCategory.USER_CODE, False),
        (143, FailureCategory.KILLED, True),
        (127, FailureCategory.COMMAND_NOT_RUNNABLE, False),
    ],
)
async def test_exit_codes_are_diagnosed_like_a_clusters_and_the_others_are_stopped(
    backend: LocalBackend,
    workspace: Path,
    replica_spec: SpecFactory,
    code: int,
    category: FailureCategory,
    retryable: bool,
) -> None:
    spec = replica_spec("exit", workers=1, REPLICA_WHO="worker-0", REPLICA_EXIT=code)
    ref = await backend.submit(spec, key=f"exit-{code}")
    outcome = await backend.wait_completed(ref)
    assert outcome.status.phase == Phase.FAILED
    diagnosis = outcome.diagnosis
    assert diagnosis is not None
    assert (diagnosis.category, diagnosis.retryable) == (category, retryable)
    assert (diagnosis.replica, diagnosis.exit_code) == ("worker-0", code)
    # The master waited 30 s; it was stopped when the worker failed, and is not the cause. The
    # supervisor writes the end before it exits itself: give it a moment, far less than 30 s.
    deadline = time.monotonic() + 10
    while job_processes(workspace):
        assert time.monotonic() < deadline, job_processes(workspace)
        await asyncio.sleep(0.05)


async def test_a_command_that_does_not_exist_is_not_runnable(
    backend: LocalBackend, replica_spec: SpecFactory
) -> None:
    spec = replica_spec(workers=0).model_copy(update={"command": ["no-such-command-here"]})
    ref = await backend.submit(spec, key="missing")
    outcome = await backend.wait_completed(ref)
    assert outcome.diagnosis is not None
    assert outcome.diagnosis.category == FailureCategory.COMMAND_NOT_RUNNABLE
    assert "command not found: no-such-command-here" in outcome.diagnosis.message
    assert outcome.diagnosis.exit_code == 127


async def test_a_replica_killed_by_sigkill_is_retried_and_the_next_attempt_resumes(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory
) -> None:
    spec = replica_spec("sigkill-once", workers=1, REPLICA_WHO="worker-0")
    attempts: list[JobRef] = []
    lines: list[str] = []

    def on_attempt(ref: JobRef) -> None:
        attempts.append(ref)

    outcome = await arun_to_completion(
        backend, spec, key="resume", retry=FAST_RETRY, on_attempt=on_attempt
    )
    assert outcome.succeeded
    assert outcome.ref.attempt == 2
    assert [r.attempt for r in attempts] == [1, 2]
    record = await backend.history(spec, key="resume")
    assert record is not None
    first = record.get(1)
    assert first is not None
    assert first.diagnosis is not None
    assert first.diagnosis.category == FailureCategory.KILLED
    assert (first.diagnosis.replica, first.diagnosis.exit_code) == ("worker-0", 137)
    assert "SIGKILL" in first.diagnosis.message
    # Both attempts got the same checkpoint directory; the second went on from where the first
    # left its checkpoint (epoch 1 or later: the master may have got further before it was
    # stopped), not from the start.
    await backend.follow_logs(outcome.ref, lambda line: lines.append(line.text))
    resumed = [int(text.rsplit(" ", 1)[1]) for text in lines if text.startswith("resuming at")]
    assert resumed
    assert min(resumed) >= 1
    assert (checkpoint_of(workspace) / "progress").read_text() == "4"


async def test_cancelling_ends_the_whole_process_tree_and_deletes_the_job(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory
) -> None:
    spec = replica_spec("spawn", workers=1)
    ref = await backend.submit(spec, key="cancel-me")
    ckpt = checkpoint_of(workspace)
    deadline = time.monotonic() + 20
    while not all((ckpt / f"pids-{n}").exists() for n in ("master-0", "worker-0")):
        assert time.monotonic() < deadline, "the replicas did not spawn their children"
        await asyncio.sleep(0.05)
    tree = job_processes(workspace)
    spawned = {
        int(p) for n in ("master-0", "worker-0") for p in (ckpt / f"pids-{n}").read_text().split()
    }
    assert spawned <= {p.pid for p in tree}  # the detached grandchildren are found too
    assert len(tree) == 1 + 2 + 4  # supervisor, two replicas, a child and a daemon each

    await backend.cancel(ref, timeout_s=30)

    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert not (workspace / "jobs" / ref.name).exists()
    await backend.cancel(ref)  # idempotent
    with pytest.raises(JobCancelledError):
        await backend.attach(ref)
    with pytest.raises(JobCancelledError):
        await backend.wait_completed(ref)


async def test_find_jobs_returns_the_jobs_of_one_flow_run_only(
    workspace: Path, capacity: LocalCapacity, tmp_path: Path, replica_spec: SpecFactory
) -> None:
    # What clean-up of a cancelled or crashed Prefect flow run finds and deletes.
    def labelled(run: str) -> LocalBackend:
        return LocalBackend(
            workspace, capacity=capacity, working_dir=tmp_path, labels={"flow-run": run}
        )

    ours, theirs = labelled("a"), labelled("b")
    spec = replica_spec("sleep", workers=0, REPLICA_SLEEP=30)
    mine = await ours.submit(spec, key="mine")
    other = await theirs.submit(spec, key="other")
    try:
        assert await ours.find_jobs({"flow-run": "a"}) == [mine]
        assert await theirs.find_jobs({"flow-run": "b"}) == [other]
        assert await ours.find_jobs({"flow-run": "nobody"}) == []
    finally:
        await ours.cancel(mine, timeout_s=30)
        await theirs.cancel(other, timeout_s=30)
    assert await ours.find_jobs({"flow-run": "a"}) == []


async def test_a_job_asking_for_more_than_the_machine_is_refused_with_the_reason(
    workspace: Path, replica_spec: SpecFactory
) -> None:
    small = LocalBackend(
        workspace, capacity=LocalCapacity(processes=2, cpus=2, memory_bytes=2**30, gpus=0)
    )
    spec = replica_spec(workers=4)
    with pytest.raises(AdmissionRefusedError) as refused:
        await small.submit(spec, key="big")
    assert refused.value.blocker == "InsufficientResources"
    assert "too many processes (5 replicas, 2 allowed)" in refused.value.reason
    assert not (workspace / "jobs").exists()

    heavy = parse_spec(
        {
            **spec.model_dump(by_alias=True, exclude_none=True),
            "replicas": {"master": 1},
            "resources": {"cpu": "4", "memory": "2Gi", "gpus": 1},
        }
    )
    with pytest.raises(AdmissionRefusedError) as refused:
        await small.submit(heavy, key="big")
    assert refused.value.blocker == "InsufficientGPU"
    assert "Insufficient cpu (4 asked, 2 here)" in refused.value.reason
    assert "Insufficient memory (2Gi asked, 1Gi here)" in refused.value.reason
    assert "Insufficient nvidia.com/gpu (1 asked, 0 here)" in refused.value.reason


async def test_what_cannot_run_locally_is_refused_with_the_field(
    backend: LocalBackend, replica_spec: SpecFactory
) -> None:
    spec = replica_spec().model_copy(update={"command": None})
    with pytest.raises(SpecError, match=r"replicas\.master\.command"):
        await backend.submit(spec, key="k")


async def test_a_reference_is_attached_from_a_backend_of_another_workspace(
    backend: LocalBackend, tmp_path: Path, replica_spec: SpecFactory
) -> None:
    ref = await backend.submit(replica_spec(workers=0), key="k")
    other = LocalBackend(tmp_path / "elsewhere")
    run = await areattach(ref.to_json(), backend=other)
    outcome = await run.wait_completed()
    assert outcome.succeeded
    foreign = JobRef.from_dict({**ref.to_dict(), "cluster": "local://another-machine"})
    with pytest.raises(KubeDLPrefectError, match="another-machine"):
        await other.attach(foreign)


async def test_a_completion_timeout_leaves_the_job_running(
    backend: LocalBackend, replica_spec: SpecFactory
) -> None:
    ref = await backend.submit(replica_spec("sleep", workers=0, REPLICA_SLEEP=30), key="slow")
    with pytest.raises(CompletionTimeoutError):
        await backend.wait_completed(ref, timeouts=WaitTimeouts(completion_s=0.5))
    assert (await backend.attach(ref)) == ref
    await backend.cancel(ref)


async def test_a_supervisor_killed_with_sigkill_reads_as_a_lost_node_and_leaves_nothing(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory
) -> None:
    ref = await backend.submit(replica_spec("sleep", workers=1, REPLICA_SLEEP=30), key="lost")
    state = json.loads((workspace / "jobs" / ref.name / "state.json").read_text())
    while state["phase"] != "Running":
        await asyncio.sleep(0.05)
        state = json.loads((workspace / "jobs" / ref.name / "state.json").read_text())
    tree = job_processes(workspace)
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    outcome = await backend.wait_completed(ref)
    assert outcome.diagnosis is not None
    assert (outcome.diagnosis.category, outcome.diagnosis.retryable) == (
        FailureCategory.NODE_LOST,
        True,
    )
    psutil.wait_procs(tree, timeout=5)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


async def test_wait_admitted_of_a_failed_job_raises_its_diagnosis_and_of_a_done_one_returns(
    backend: LocalBackend, replica_spec: SpecFactory
) -> None:
    ok = await backend.submit(replica_spec(workers=0), key="ok")
    admitted = await backend.wait_admitted(ok, timeout_s=10)
    assert admitted.admitted
    assert admitted.expected == 1
    await backend.wait_completed(ok)
    failed = await backend.submit(
        replica_spec("exit", workers=0, REPLICA_WHO="master-0", REPLICA_EXIT=2), key="bad"
    )
    outcome = await backend.wait_completed(failed)
    assert outcome.diagnosis is not None
    await backend.cancel(failed)
    with pytest.raises(JobFailedError, match="recorded"):
        await backend.wait_admitted(failed, timeout_s=10)


def test_the_sync_face_runs_a_job(backend: LocalBackend, replica_spec: SpecFactory) -> None:
    sync = SyncTrainingBackend(backend)
    ref = sync.submit(replica_spec(workers=1), key="sync")
    assert sync.attach(ref) == ref
    lines: list[LogLine] = []
    sync.follow_logs(ref, lines.append)
    outcome = sync.wait_completed(ref)
    assert outcome.succeeded
    assert lines
    record = sync.history(replica_spec(workers=1), key="sync")
    assert record is not None
    assert record.latest is not None
    assert record.latest.succeeded
    sync.cancel(ref)
    sync.close()


def test_a_job_outlives_its_caller_killed_with_sigkill_and_is_adopted_not_started_twice(
    workspace: Path, replica_spec: SpecFactory, capacity: LocalCapacity, tmp_path: Path
) -> None:
    spec = replica_spec("sleep", workers=1, REPLICA_SLEEP=3)
    (tmp_path / "spec.json").write_text(spec.model_dump_json(by_alias=True, exclude_none=True))
    caller = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from kubedl_prefect.lifecycle.local import LocalBackend, LocalCapacity
        from kubedl_prefect.lifecycle.retry import arun_to_completion
        from kubedl_prefect.spec import parse_spec

        spec = parse_spec(json.loads(open({str(tmp_path / "spec.json")!r}).read()))
        backend = LocalBackend({str(workspace)!r}, capacity=LocalCapacity(4, 4, 2**33))

        def started(ref):
            print(ref.to_json(), flush=True)

        asyncio.run(arun_to_completion(backend, spec, key="crash", on_attempt=started))
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert process.stdout is not None
    first = JobRef.from_json(process.stdout.readline())
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    process.stdout.close()
    assert job_processes(workspace), "the job should outlive its caller"

    backend = LocalBackend(workspace, capacity=capacity)
    seen: list[JobRef] = []
    outcome = asyncio.run(
        arun_to_completion(backend, spec, key="crash", retry=FAST_RETRY, on_attempt=seen.append)
    )
    assert outcome.succeeded
    assert outcome.ref == first
    assert seen == [first]
    ckpt = checkpoint_of(workspace)
    assert len((ckpt / "starts-master-0").read_text().split()) == 1
    assert len((ckpt / "starts-worker-0").read_text().split()) == 1


def _imported_modules(source: Path) -> set[str]:
    """The modules a source file imports (import statements, not docstrings or comments)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


#: Code that runs only inside a replica, the user's training process: what a replica of a
#: function task runs (kubedl_prefect.prefect.bootstrap: torch, when installed there, for the
#: process group the user's function expects), and the example flow's function body (the
#: example program). The library's own processes (flows, workers, the CLI) never load either
#: (the probe below imports them).
REPLICA_SIDE = {"bootstrap.py": "torch", "function_training.py": "kubedl_prefect_examples"}


def test_the_library_never_imports_torch_or_the_example_program() -> None:
    library = Path(__file__).resolve().parents[3] / "kubedl_prefect"
    for source in library.rglob("*.py"):
        imported = {name.split(".")[0] for name in _imported_modules(source)}
        allowed = REPLICA_SIDE.get(source.name)
        for forbidden in ("torch", "kubedl_prefect_examples"):
            if forbidden != allowed:
                assert forbidden not in imported, source
    probe = (
        "import sys, kubedl_prefect.lifecycle.local.backend, "
        "kubedl_prefect.lifecycle.local.supervisor, kubedl_prefect.prefect.functions, "
        "kubedl_prefect.prefect.replica, kubedl_prefect.prefect.flows.function_training; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'kubedl_prefect_examples')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"


async def test_a_job_that_failed_for_good_names_its_failed_attempt_live_and_replayed(
    backend: LocalBackend, replica_spec: SpecFactory
) -> None:
    # What reads the failed attempt's pods (a function task's replica errors) finds them by
    # this reference, not by rebuilding the job's name.
    spec = replica_spec("exit", workers=0, REPLICA_WHO="master-0", REPLICA_EXIT=2)
    attempts: list[JobRef] = []
    with pytest.raises(JobFailedError) as live:
        await arun_to_completion(
            backend, spec, key="bad", retry=FAST_RETRY, on_attempt=attempts.append
        )
    (failed,) = attempts
    assert live.value.ref == failed.to_dict()
    assert JobRef.from_dict(live.value.ref) == failed
    with pytest.raises(JobFailedError, match="recorded") as replayed:
        await arun_to_completion(backend, spec, key="bad", retry=FAST_RETRY)
    assert replayed.value.ref == failed.to_dict()
