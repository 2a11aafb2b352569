"""The local backend gives a ``trainer`` job what Kubeflow Trainer's torch plugin gives its nodes.

Trainer v2.3.0 sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``
and ``PET_MASTER_PORT`` on every node, and the program runs under ``torchrun``, which reads them
and sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` per process. The last test runs such a
program, unchanged, as two local nodes: ``torchrun`` rendezvouses them with gloo.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.lifecycle.local import LocalBackend, LocalCapacity
from kubedl_prefect.lifecycle.local.contract import (
    launch_env,
    replica_plans,
    trainer_procs_per_node,
)
from kubedl_prefect.spec import TrainingJobSpec, parse_spec

PET = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def spec(**extra: Any) -> TrainingJobSpec:
    data: dict[str, Any] = {
        "name": "ddp",
        "image": "ghcr.io/example/ddp:1.0",
        "command": ["torchrun", "train.py"],
        "replicas": {"worker": 3},
        **extra,
    }
    return parse_spec(data)


def envs(job: TrainingJobSpec, dialect: str | None = "trainer") -> dict[str, dict[str, str]]:
    made = replica_plans(
        job,
        job_name="ddp-abc-a1",
        ports=[29511],
        python="/venv/bin/python",
        working_dir="/work",
        checkpoint_dir=None,
        dialect=dialect,
    )
    return {p.name: dict(p.env) for p in made}


def test_every_node_gets_torchruns_pet_variables() -> None:
    made = envs(spec())
    assert [(e["PET_NODE_RANK"], e["PET_NNODES"]) for e in made.values()] == [
        ("0", "3"),
        ("1", "3"),
        ("2", "3"),
    ]
    for env in made.values():
        assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("127.0.0.1", "29511")
        assert env["PET_NPROC_PER_NODE"] == "1"
        # As on Trainer: torchrun sets these per process, the pod does not have them.
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            assert name not in env


def test_a_master_is_node_zero() -> None:
    made = envs(spec(replicas={"master": 1, "worker": 1}))
    assert (made["master-0"]["PET_NODE_RANK"], made["worker-0"]["PET_NODE_RANK"]) == ("0", "1")


def test_the_v1_contract_stays_the_default() -> None:
    made = envs(spec(replicas={"master": 1, "worker": 1}), dialect=None)
    assert made["worker-0"]["RANK"] == "1"
    assert not any(name.startswith("PET_") for env in made.values() for name in env)


@pytest.mark.parametrize(
    ("extra", "procs"),
    [
        ({"nprocPerNode": "4"}, "4"),
        ({"nprocPerNode": "auto", "resources": {"cpu": "2"}}, "2"),
        ({"resources": {"cpu": "500m"}}, "1"),
        ({"resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "6"}}}, "3"),
        ({"resources": {"gpus": 2}}, "auto"),
        ({}, "1"),
    ],
)
def test_procs_per_node_as_trainer_sets_them(extra: dict[str, Any], procs: str) -> None:
    assert trainer_procs_per_node(spec(**extra)) == procs


def test_xgboost_nodes_get_trainers_dmlc_variables_not_the_v1_ones() -> None:
    made = envs(spec(framework="xgboost", replicas={"master": 1, "worker": 2}))
    assert [(e["DMLC_TASK_ID"], e["DMLC_NUM_WORKER"]) for e in made.values()] == [
        ("0", "3"),
        ("1", "3"),
        ("2", "3"),
    ]
    for env in made.values():
        assert (env["DMLC_TRACKER_URI"], env["DMLC_TRACKER_PORT"]) == ("127.0.0.1", "29511")
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            assert name not in env
        assert not any(name.startswith("PET_") for name in env)


def test_xgboost_workers_are_one_per_gpu_as_trainer_counts_them() -> None:
    job = spec(framework="xgboost", replicas={"master": 1, "worker": 1}, resources={"gpus": 2})
    made = replica_plans(
        job,
        job_name="xgb-abc-a1",
        ports=[29511],
        python="/venv/bin/python",
        working_dir="/work",
        checkpoint_dir=None,
        gpu_ids=[0, 1, 2, 3],
        dialect="trainer",
    )
    assert {p.env["DMLC_NUM_WORKER"] for p in made} == {"4"}


def test_inherited_pet_variables_do_not_leak() -> None:
    env = launch_env({"PET_NODE_RANK": "7", "HOME": "/h"}, {"A": "1"}, "/venv/bin/python")
    assert "PET_NODE_RANK" not in env


DDP_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    out = os.path.join(sys.argv[1], f"rank-{dist.get_rank()}.json")
    with open(out, "w") as handle:
        json.dump({"world": dist.get_world_size(), "sum": total.item(),
                   "node": os.environ["PET_NODE_RANK"]}, handle)
    dist.destroy_process_group()
    """
)


async def test_a_torchrun_program_runs_unchanged_as_local_trainer_nodes(
    workspace: Path, tmp_path: Path
) -> None:
    # make test installs every extra; without torch this test must fail, not vanish.
    assert importlib.util.find_spec("torch") is not None, (
        "needs the torch extra (uv sync --all-extras)"
    )
    program = tmp_path / "ddp.py"
    program.write_text(DDP_PROGRAM)
    out = tmp_path / "out"
    out.mkdir()
    backend = LocalBackend(
        workspace,
        capacity=LocalCapacity(processes=4, cpus=4, memory_bytes=8 * 2**30, gpus=0),
        working_dir=tmp_path,
        dialect="trainer",
        termination_grace_s=2.0,
        success_grace_s=5.0,
    )
    job = parse_spec(
        {
            "name": "ddp",
            "image": "ghcr.io/example/ddp:1.0",
            "command": ["torchrun", str(program), str(out)],
            "resources": {"cpu": "1"},
            "replicas": {"worker": 2},
        }
    )
    ref = await backend.submit(job, key="trainer-local")
    outcome = await asyncio.wait_for(backend.wait_completed(ref), 240)
    assert outcome.succeeded, outcome
    results = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert [(r["world"], r["sum"], r["node"]) for r in results] == [(2, 3.0, "0"), (2, 3.0, "1")]
