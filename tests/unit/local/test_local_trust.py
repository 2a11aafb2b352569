"""What the local backend refuses to trust: references, its workspace's files, the caller's env.

A reference, a ``state.json`` or a planted symlink must not turn the backend against files or
processes that are not its own job's; replicas get a minimal environment, not the flow's
secrets; the workspace is private to its user. Real jobs, real processes, real files.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from kubedl_prefect.errors import ConflictError, KubeDLPrefectError
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.local import LocalBackend
from tests.unit.local.helpers import SpecFactory


def plant_link(where: Path, target: Path) -> Path:
    """A symbolic link at ``where`` to the new folder ``target``."""
    target.mkdir()
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(target)
    return target


def forged(ref: JobRef, **changes: Any) -> dict[str, Any]:
    return {**ref.to_dict(), **changes}


async def finished_job(backend: LocalBackend, replica_spec: SpecFactory, key: str) -> JobRef:
    """A job that ran and ended, its supervisor gone."""
    ref = await backend.submit(replica_spec(workers=0), key=key)
    outcome = await backend.wait_completed(ref)
    assert outcome.succeeded
    state = json.loads((Path(ref.namespace) / "jobs" / ref.name / "state.json").read_text())
    supervisor = state["supervisor"]["pid"]
    if psutil.pid_exists(supervisor):
        psutil.wait_procs([psutil.Process(supervisor)], timeout=10)
    return ref


async def running_job(backend: LocalBackend, ref: JobRef) -> dict[str, Any]:
    """The state of ``ref`` once every replica runs."""
    path = Path(ref.namespace) / "jobs" / ref.name / "state.json"
    for _ in range(400):
        state: dict[str, Any] = json.loads(path.read_text())
        if state["phase"] == "Running":
            return state
        await asyncio.sleep(0.05)
    raise AssertionError("the job did not start running")


@pytest.mark.parametrize(
    "name", ["../../victim", "..", ".", "a/../../victim", "Upper", "x\n", "-x", "a" * 64, ""]
)
async def test_a_reference_whose_name_is_not_a_job_name_is_refused_everywhere(
    backend: LocalBackend,
    workspace: Path,
    tmp_path: Path,
    replica_spec: SpecFactory,
    name: str,
) -> None:
    ref = await finished_job(backend, replica_spec, "victim")
    victim = tmp_path / "victim"  # what <workspace>/jobs/../../victim names
    shutil.copytree(workspace / "jobs" / ref.name, victim)
    bad = forged(ref, name=name)
    for call in (
        lambda: backend.cancel(JobRef.from_dict(bad)),
        lambda: backend.attach(JobRef.from_dict(bad)),
        lambda: backend.wait_completed(JobRef.from_dict(bad)),
        lambda: backend.follow_logs(JobRef.from_dict(bad), lambda line: None),
    ):
        # Refused by JobRef itself (not a Kubernetes object name) or, for names Kubernetes
        # allows but a local job folder does not (64 characters), by the backend.
        with pytest.raises(
            KubeDLPrefectError, match=r"not a valid local job name|not a Kubernetes object name"
        ):
            await call()
    assert (victim / "job.json").exists()
    assert (workspace / "jobs" / ref.name / "job.json").exists()


@pytest.mark.parametrize("namespace", ["relative/ws", "{ws}/../ws", "{ws}/./", "{ws}/jobs/.."])
async def test_a_reference_whose_workspace_is_not_a_plain_absolute_path_is_refused(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory, namespace: str
) -> None:
    ref = await finished_job(backend, replica_spec, "ns")
    bad = JobRef.from_dict(forged(ref, namespace=namespace.format(ws=workspace)))
    with pytest.raises(KubeDLPrefectError, match="workspace"):
        await backend.cancel(bad)
    with pytest.raises(KubeDLPrefectError, match="workspace"):
        await backend.attach(bad)
    assert (workspace / "jobs" / ref.name).is_dir()


async def test_a_reference_through_a_symlinked_workspace_is_refused(
    backend: LocalBackend, workspace: Path, tmp_path: Path, replica_spec: SpecFactory
) -> None:
    ref = await finished_job(backend, replica_spec, "link")
    (tmp_path / "alias").symlink_to(workspace)
    bad = JobRef.from_dict(forged(ref, namespace=str(tmp_path / "alias")))
    with pytest.raises(KubeDLPrefectError, match="symbolic link"):
        await backend.cancel(bad)
    assert (workspace / "jobs" / ref.name).is_dir()


async def test_cancel_with_the_uid_of_another_job_says_it_was_replaced_and_leaves_it(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory
) -> None:
    ref = await finished_job(backend, replica_spec, "replaced")
    older = JobRef.from_dict(forged(ref, uid="0" * 32))
    with pytest.raises(ConflictError, match="replaced") as refused:
        await backend.cancel(older)
    assert refused.value.hint
    assert (workspace / "jobs" / ref.name / "job.json").exists()
    await backend.cancel(ref)
    assert not (workspace / "jobs" / ref.name).exists()


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this user that is no job's."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


async def test_a_forged_state_cannot_make_cancel_signal_a_process_that_is_not_the_jobs(
    backend: LocalBackend,
    workspace: Path,
    replica_spec: SpecFactory,
    bystander: subprocess.Popen[bytes],
) -> None:
    ref = await finished_job(backend, replica_spec, "forged")
    try:
        who = {"pid": bystander.pid, "createTime": psutil.Process(bystander.pid).create_time()}
        state_file = workspace / "jobs" / ref.name / "state.json"
        state = json.loads(state_file.read_text())
        state["phase"] = "Running"
        state["supervisor"] = who
        state["replicas"][0]["process"] = who
        state_file.write_text(json.dumps(state))

        with pytest.raises(KubeDLPrefectError, match="not a process of this job") as refused:
            await backend.cancel(ref, timeout_s=5)
        assert str(bystander.pid) in refused.value.message
        assert bystander.poll() is None, "cancel signalled a process that is not the job's"
        assert (workspace / "jobs" / ref.name).is_dir()
    finally:
        shutil.rmtree(workspace / "jobs" / ref.name, ignore_errors=True)


async def test_a_replica_does_not_inherit_the_callers_secrets(
    backend: LocalBackend,
    workspace: Path,
    replica_spec: SpecFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2")
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LC_TIME", "C")
    ref = await backend.submit(
        replica_spec("sleep", workers=1, REPLICA_SLEEP=30, FROM_SPEC="yes"), key="env"
    )
    try:
        state = await running_job(backend, ref)
        pids = [state["supervisor"]["pid"]] + [r["process"]["pid"] for r in state["replicas"]]
        for pid in pids:
            environ = psutil.Process(pid).environ()
            leaked = {"MLFLOW_TRACKING_PASSWORD", "PREFECT_API_KEY", "AWS_SECRET_ACCESS_KEY"}
            assert not leaked & set(environ), (pid, sorted(environ))
            assert environ["PATH"]
            assert environ["LC_TIME"] == "C"  # the locale is passed on
        for replica in state["replicas"]:
            environ = psutil.Process(replica["process"]["pid"]).environ()
            assert environ["EXTRA"] == "from-the-backend"  # the block's env
            assert environ["FROM_SPEC"] == "yes"  # the spec's env
            assert environ["MASTER_ADDR"] == "127.0.0.1"  # the contract
    finally:
        await backend.cancel(ref, timeout_s=30)


async def test_job_folders_and_files_are_private_to_their_user(
    backend: LocalBackend, workspace: Path, replica_spec: SpecFactory
) -> None:
    ref = await finished_job(backend, replica_spec, "private")
    job = workspace / "jobs" / ref.name
    (checkpoints,) = (workspace / "checkpoints").iterdir()
    folders = [workspace, workspace / "jobs", job, job / "logs", workspace / "records"]
    for folder in [*folders, workspace / "checkpoints", checkpoints]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    files = [job / "job.json", job / "state.json", *(job / "logs").iterdir()]
    files += list((workspace / "records").glob("*.json"))
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file


async def test_a_symlink_planted_where_the_jobs_folder_is_expected_is_refused(
    backend: LocalBackend, workspace: Path, tmp_path: Path, replica_spec: SpecFactory
) -> None:
    elsewhere = plant_link(workspace / "jobs", tmp_path / "elsewhere")
    with pytest.raises(KubeDLPrefectError, match="symbolic link"):
        await backend.submit(replica_spec(workers=0), key="planted")
    assert list(elsewhere.iterdir()) == []


async def test_a_symlink_planted_where_a_job_folder_is_expected_is_not_followed(
    backend: LocalBackend, workspace: Path, tmp_path: Path, replica_spec: SpecFactory
) -> None:
    ref = await finished_job(backend, replica_spec, "planted-dir")
    outside = tmp_path / "outside"
    shutil.move(workspace / "jobs" / ref.name, outside)
    (workspace / "jobs" / ref.name).symlink_to(outside)
    with pytest.raises(KubeDLPrefectError, match="symbolic link"):
        await backend.attach(ref)
    with pytest.raises(KubeDLPrefectError, match="symbolic link"):
        await backend.cancel(ref)
    assert (outside / "job.json").exists()
    assert await backend.find_jobs({}) == []  # not listed either


async def test_a_symlink_planted_where_a_state_file_or_log_is_expected_is_not_followed(
    backend: LocalBackend, workspace: Path, tmp_path: Path, replica_spec: SpecFactory
) -> None:
    ref = await finished_job(backend, replica_spec, "planted-file")
    job = workspace / "jobs" / ref.name
    secret = tmp_path / "secret.txt"
    secret.write_text("2026-01-01T00:00:00Z TOPSECRET\n")
    log = job / "logs" / "master-0.log"
    log.unlink()
    log.symlink_to(secret)
    with pytest.raises(KubeDLPrefectError, match="symbolic link"):
        await backend.follow_logs(ref, lambda line: None)

    state = job / "state.json"
    shutil.move(state, tmp_path / "state.json")
    state.symlink_to(tmp_path / "state.json")
    with pytest.raises(KubeDLPrefectError, match="symbolic link"):
        await backend.cancel(ref)
    assert (job / "job.json").exists()


async def test_a_socket_folder_planted_by_someone_else_is_refused(
    backend: LocalBackend, replica_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = Path(tempfile.mkdtemp(prefix="kp-"))  # short: a socket path has ~100 bytes
    try:
        monkeypatch.setenv("TMPDIR", str(temp))
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        (temp / "theirs").mkdir(mode=0o777)
        (temp / f"kubedl-prefect-{os.getuid()}").symlink_to(temp / "theirs")
        with pytest.raises(KubeDLPrefectError, match="symbolic link"):
            await backend.submit(replica_spec(workers=0), key="socket")
        assert list((temp / "theirs").iterdir()) == []
    finally:
        shutil.rmtree(temp)
