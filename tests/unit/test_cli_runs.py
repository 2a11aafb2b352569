"""``kubedl-prefect status|logs|cancel REF``: a saved run reference looked at from a terminal.

The local backend runs real processes (tests/unit/local/replica.py as every replica); the
Kubernetes backend talks to the in-memory API server of tests/support through a kubeconfig file,
as a user's terminal would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from kubedl_prefect.cli import ExitCode, app, backend_for, read_reference
from kubedl_prefect.kube.credentials import KubeconfigFile
from kubedl_prefect.kube.resources import ResourceKind
from kubedl_prefect.lifecycle.backend import JobRef, SyncTrainingBackend
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.local import LocalBackend, LocalCapacity
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from tests.support.fakeapi import FakeKubeAPI
from tests.unit.local.helpers import REPLICA, job_processes

runner = CliRunner()

PYTORCHJOBS = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")


def replica_spec(mode: str, **env: str) -> TrainingJobSpec:
    return parse_spec(
        {
            "name": "tiny",
            "image": "ghcr.io/example/tiny:1.0",
            "command": ["python", str(REPLICA)],
            "replicas": {"master": 1, "worker": 1},
            "env": {
                "REPLICA_MODE": mode,
                "REPLICA_POD": {"fieldRef": {"fieldPath": "metadata.name"}},
                **env,
            },
            "checkpoint": {"location": "s3://bucket/team"},
        }
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ws"
    yield path
    _, left = psutil.wait_procs(job_processes(path), timeout=5)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    assert not left, f"the test left processes running: {left}"


def submit(workspace: Path, tmp_path: Path, mode: str, **env: str) -> JobRef:
    backend = LocalBackend(
        workspace,
        capacity=LocalCapacity(processes=4, cpus=4, memory_bytes=8 * 2**30, gpus=0),
        working_dir=tmp_path,
        termination_grace_s=2.0,
    )
    return asyncio.run(backend.submit(replica_spec(mode, **env), key=f"cli-{mode}"))


def wait_ended(ref: JobRef) -> None:
    outcome = asyncio.run(LocalBackend(ref.namespace).wait_completed(ref))
    assert outcome.succeeded, outcome


def test_status_logs_and_cancel_of_a_local_job(workspace: Path, tmp_path: Path) -> None:
    ref = submit(workspace, tmp_path, "sleep", REPLICA_SLEEP="60")
    saved = tmp_path / "ref.json"
    saved.write_text(ref.to_json())

    status = runner.invoke(app, ["status", str(saved)])
    assert status.exit_code == ExitCode.OK, status.output
    lines = status.stdout.splitlines()
    assert lines[0] == f"job:        PyTorchJob {ref.name} (attempt 1, key 'cli-sleep')"
    assert lines[2].split()[1] in ("Created", "Running")
    as_json = runner.invoke(app, ["status", ref.to_json(), "-o", "json"])
    data = json.loads(as_json.stdout)
    assert data["ref"] == ref.to_dict()
    assert data["diagnosis"] is None
    assert set(data["replicas"]) <= {"master", "worker"}

    cancel = runner.invoke(app, ["cancel", "-", "--timeout", "30"], input=ref.to_json())
    assert cancel.exit_code == ExitCode.OK, cancel.output
    assert cancel.stdout == f"PyTorchJob {ref.name} cancelled: its pods are gone\n"
    assert job_processes(workspace) == []
    again = runner.invoke(app, ["cancel", str(saved)])
    assert again.exit_code == ExitCode.OK, again.output
    assert again.stdout == f"PyTorchJob {ref.name} is already gone\n"
    gone = runner.invoke(app, ["status", str(saved)])
    assert gone.exit_code == ExitCode.JOB
    assert gone.stdout == ""
    assert gone.stderr.startswith("error: ")
    assert "hint: " in gone.stderr


def test_logs_of_a_finished_job_and_its_status_from_a_saved_run(
    workspace: Path, tmp_path: Path
) -> None:
    ref = submit(workspace, tmp_path, "ok")
    wait_ended(ref)
    saved_run = {"schemaVersion": 1, "specName": "tiny", "key": ref.key, "ref": ref.to_dict()}

    logs = runner.invoke(app, ["logs", json.dumps(saved_run)])
    assert logs.exit_code == ExitCode.OK, logs.output
    lines = logs.stdout.splitlines()
    assert "[master-0] hello from master-0" in lines
    assert "[worker-0] hello from worker-0" in lines
    stamped = runner.invoke(app, ["logs", ref.to_json(), "--timestamps", "-o", "json"])
    first = json.loads(stamped.stdout.splitlines()[0])
    assert set(first) == {"replica", "container", "timestamp", "attempt", "text"}
    assert first["attempt"] == 1

    result_like = {"spec_name": "tiny", "phase": "Succeeded", "ref": ref.to_dict()}
    status = runner.invoke(app, ["status", json.dumps(result_like), "-o", "json"])
    assert status.exit_code == ExitCode.OK, status.output
    data = json.loads(status.stdout)
    assert data["phase"] == "Succeeded"
    assert data["replicas"]["master"]["succeeded"] == 1
    assert data["completionTime"]


def test_a_failed_job_shows_its_diagnosis(workspace: Path, tmp_path: Path) -> None:
    ref = submit(workspace, tmp_path, "exit", REPLICA_WHO="master-0", REPLICA_EXIT="1")
    asyncio.run(LocalBackend(ref.namespace).wait_completed(ref))
    status = runner.invoke(app, ["status", ref.to_json()])
    assert status.exit_code == ExitCode.OK, status.output
    assert "phase:      Failed" in status.stdout
    assert "diagnosis:  " in status.stdout


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("not json", "is not JSON"),
        ('{"backend": "kubernetes"}', "a job reference lacks"),
        ("{[", "is not JSON"),
    ],
)
def test_what_is_no_reference_is_a_usage_error(given: str, words: str) -> None:
    for command in ("status", "logs", "cancel"):
        result = runner.invoke(app, [command, "-"], input=given)
        assert result.exit_code == ExitCode.USAGE
        assert words in result.stderr
        assert result.stdout == ""


def test_an_unreadable_reference_file_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", str(tmp_path / "missing.json")])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.startswith(f"error: cannot read {tmp_path / 'missing.json'}")


KUBE_REF = JobRef(
    backend="kubernetes",
    cluster="",
    dialect="kubeflow",
    namespace="ml",
    name="mnist-abc-a1",
    uid="",
    api_version="kubeflow.org/v1",
    kind="PyTorchJob",
    key="nightly",
    attempt=1,
    spec_hash="",
)


def test_the_cluster_comes_from_the_flags_on_the_references_namespace_and_dialect(
    tmp_path: Path,
) -> None:
    backend = backend_for(KUBE_REF, kubeconfig=tmp_path / "kc", context="gpu")
    assert isinstance(backend, KubernetesBackend)
    assert (backend.namespace, backend.dialect.value) == ("ml", "kubeflow")
    assert backend.credentials == KubeconfigFile(str(tmp_path / "kc"), "gpu")
    result = runner.invoke(
        app, ["status", KUBE_REF.to_json(), "--cluster", "prod", "--context", "gpu"]
    )
    assert result.exit_code == ExitCode.USAGE
    assert "not both" in result.stderr
    local = JobRef.from_dict({**KUBE_REF.to_dict(), "backend": "local", "namespace": "/w"})
    result = runner.invoke(app, ["logs", local.to_json(), "--kubeconfig", "kc"])
    assert result.exit_code == ExitCode.USAGE
    assert "are for a Kubernetes cluster" in result.stderr


def test_the_cluster_can_be_a_saved_prefect_block(
    monkeypatch: pytest.MonkeyPatch, workspace: Path, tmp_path: Path
) -> None:
    from kubedl_prefect.prefect import blocks

    asked: list[tuple[str, dict[str, Any]]] = []

    class Block:
        def backend(self, **kwargs: Any) -> LocalBackend:
            asked.append(("backend", kwargs))
            return LocalBackend(workspace)

    def load_cluster(name: str) -> Block:
        asked.append(("load", {"name": name}))
        return Block()

    monkeypatch.setattr(blocks, "load_cluster", load_cluster)
    ref = submit(workspace, tmp_path, "ok")
    wait_ended(ref)
    result = runner.invoke(app, ["status", ref.to_json(), "--cluster", "laptop"])
    assert result.exit_code == ExitCode.OK, result.output
    assert asked == [
        ("load", {"name": "laptop"}),
        ("backend", {"dialect": ref.dialect, "namespace": ref.namespace}),
    ]


def test_status_and_cancel_on_kubernetes_through_a_kubeconfig(
    fake_api_thread: FakeKubeAPI, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake_api_thread.kubeconfig())
    backend = KubernetesBackend(
        namespace="ml", dialect="kubeflow", kubeconfig=str(kubeconfig), context="fake"
    )
    sync = SyncTrainingBackend(backend)
    ref = sync.submit(
        parse_spec({"name": "mnist", "image": "i:1", "replicas": {"master": 1}}), key="k"
    )
    sync.close()
    kind = ResourceKind("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
    fake_api_thread.store.merge(
        kind,
        "ml",
        ref.name,
        {
            "status": {
                "conditions": [
                    {"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
                    {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"},
                ],
                "replicaStatuses": {"Master": {"active": 1}},
            }
        },
    )
    flags = ["--kubeconfig", str(kubeconfig)]
    status = runner.invoke(app, ["status", ref.to_json(), *flags])
    assert status.exit_code == ExitCode.OK, status.output
    assert "phase:      Running (PyTorchJobRunning)" in status.stdout
    assert "replicas:   master 1 active, 0 succeeded, 0 failed" in status.stdout
    assert f"cluster:    {fake_api_thread.url} (kubernetes, kubeflow operator)" in status.stdout

    started = time.monotonic()
    cancel = runner.invoke(app, ["cancel", ref.to_json(), *flags, "--timeout", "30"])
    assert cancel.exit_code == ExitCode.OK, cancel.output
    assert time.monotonic() - started < 30
    assert fake_api_thread.store.get(kind, "ml", ref.name) is None
    gone = runner.invoke(app, ["status", ref.to_json(), *flags])
    assert gone.exit_code == ExitCode.JOB
    assert "error: " in gone.stderr


def test_read_reference_takes_a_record_whose_result_holds_the_run() -> None:
    record = {"metadata": {"storage_key": "x"}, "result": json.dumps({"ref": KUBE_REF.to_dict()})}
    assert read_reference(json.dumps(record)) == KUBE_REF


def test_logs_into_a_closed_pipe_stops_following_quietly(workspace: Path, tmp_path: Path) -> None:
    ref = submit(workspace, tmp_path, "sleep", REPLICA_SLEEP="60")
    script = Path(sys.executable).with_name("kubedl-prefect")
    try:
        with subprocess.Popen(
            [str(script), "logs", ref.to_json()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as logs:
            assert logs.stdout is not None
            assert logs.stderr is not None
            assert logs.stdout.readline().startswith("[")
            logs.stdout.close()  # as `| head -1` does
            try:
                assert logs.wait(timeout=30) == ExitCode.OK  # not followed to the job's end
                assert logs.stderr.read() == ""
            finally:
                if logs.poll() is None:
                    logs.kill()
    finally:
        asyncio.run(LocalBackend(ref.namespace).cancel(ref, timeout_s=30))
