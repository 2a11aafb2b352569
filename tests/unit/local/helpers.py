"""Helpers of the local backend tests: the replica program, a job's processes as the OS sees."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psutil

from kubedl_prefect.spec import TrainingJobSpec

REPLICA = Path(__file__).with_name("replica.py")
"""The replica program of these tests."""

SpecFactory = Callable[..., TrainingJobSpec]


def job_processes(workspace: Path) -> list[psutil.Process]:
    """Every live process of every job of ``workspace``: supervisors, replicas, descendants."""
    found: dict[int, psutil.Process] = {}
    for state_file in workspace.glob("jobs/*/state.json"):
        state = json.loads(state_file.read_text())
        identities = [state.get("supervisor")] + [r.get("process") for r in state["replicas"]]
        for identity in identities:
            if not identity:
                continue
            try:
                process = psutil.Process(identity["pid"])
                if abs(process.create_time() - identity["createTime"]) > 0.01:
                    continue
                found[process.pid] = process
                for child in process.children(recursive=True):
                    found[child.pid] = child
            except psutil.Error:
                continue
    return [p for p in found.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
