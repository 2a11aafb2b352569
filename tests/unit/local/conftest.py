"""Fixtures of the local backend tests: a workspace, a backend, specs of the replica program.

Every test gets a workspace of its own; whatever processes its jobs left are killed afterwards
(and the test fails if there were any), so a broken test cannot leave replicas running.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from kubedl_prefect.lifecycle.local import LocalBackend, LocalCapacity
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from tests.unit.local.helpers import REPLICA, SpecFactory, job_processes


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ws"
    yield path
    _, left = psutil.wait_procs(job_processes(path), timeout=5)  # a supervisor finishing up
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=10)
    assert not left, f"the test left processes running: {left}"


@pytest.fixture
def capacity() -> LocalCapacity:
    return LocalCapacity(processes=4, cpus=4, memory_bytes=8 * 2**30, gpus=0)


@pytest.fixture
def backend(workspace: Path, capacity: LocalCapacity, tmp_path: Path) -> LocalBackend:
    return LocalBackend(
        workspace,
        capacity=capacity,
        env={"EXTRA": "from-the-backend"},
        working_dir=tmp_path,
        termination_grace_s=2.0,
        success_grace_s=2.0,
    )


@pytest.fixture
def replica_spec() -> SpecFactory:
    def make(
        mode: str = "ok", *, workers: int = 1, name: str = "tiny", **env: Any
    ) -> TrainingJobSpec:
        data: dict[str, Any] = {
            "name": name,
            "image": "ghcr.io/example/tiny:1.0",
            "command": ["python", str(REPLICA)],
            "replicas": {"master": 1, **({"worker": workers} if workers else {})},
            "env": {
                "REPLICA_MODE": mode,
                "REPLICA_POD": {"fieldRef": {"fieldPath": "metadata.name"}},
                **{k: str(v) for k, v in env.items()},
            },
            "checkpoint": {"location": "s3://bucket/team"},
        }
        return parse_spec(data)

    return make
