"""Function tasks on two real replicas (LocalCluster) against the session's real Prefect server.

A flow whose training step is a ``@distributed_task`` function: the ready flow
``train-function`` trains the shipped example model (PyTorch DDP, gloo) on 2 local processes and
returns rank 0's metrics; a function that raises on rank 1 fails the task with an error naming
replica ``worker-0`` (rank 1), its exit code and the traceback's last line. An async flow awaits
two ``@adistributed_task`` calls and an ``arun_training_job`` at once and leaves no socket of
ours open (Prefect's own leak, one per async flow run, is told apart by where it was opened).
On the test bed, a decorated function runs on 2 real process pods made by the real KubeDL
operator (and by the real Kubeflow operator v1), joins one gloo process group across them (rank
0's rendezvous store on its pod's address, where the worker's ``MASTER_ADDR``, the master's
Service name, leads), and the ``all_reduce``'s sum comes back as rank 0's value through its
container's termination message.

Needs torch (installed into this environment by ``test_local_ddp``'s fixture when missing).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psutil
import pytest
from prefect import flow

from kubedl_prefect.errors import ReplicaFunctionError
from kubedl_prefect.prefect import (
    KubernetesCluster,
    LocalCluster,
    TrainingJob,
    TrainingResult,
    adistributed_task,
    arun_training_job,
    current_replica,
    distributed_task,
)
from kubedl_prefect.prefect.flows.function_training import train_function
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.test_local_ddp import torch_installed
from tests.support.sockets import not_prefects, sockets_left_unclosed

pytestmark = pytest.mark.integration

__all__ = ["torch_installed"]


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ws"
    yield path
    leftovers = []
    for state_file in path.glob("jobs/*/state.json"):
        state = json.loads(state_file.read_text())
        for who in [state.get("supervisor")] + [r.get("process") for r in state["replicas"]]:
            if who and psutil.pid_exists(who["pid"]):
                process = psutil.Process(who["pid"])
                if abs(process.create_time() - who["createTime"]) < 0.01:
                    leftovers.append(process)
    _, alive = psutil.wait_procs(leftovers, timeout=10)
    for process in alive:
        process.kill()
    assert not alive, f"processes left running: {alive}"


def test_a_decorated_function_trains_the_example_model_on_two_replicas_and_rank_0_answers(
    prefect_server: dict[str, str], torch_installed: None, workspace: Path
) -> None:
    metrics = train_function(epochs=3, replicas=2, workspace=str(workspace))
    assert metrics["rank"] == 0.0
    assert metrics["world_size"] == 2.0
    assert metrics["val_accuracy"] > 0.5  # three classes: better than guessing
    (job,) = (workspace / "jobs").iterdir()
    logs = {path.stem: path.read_text(errors="replace") for path in (job / "logs").glob("*.log")}
    assert "rank 0: starting from scratch (2 replicas" in logs["master-0"]
    assert "rank 1: starting from scratch (2 replicas" in logs["worker-0"]
    assert "epoch 2 done" in logs["master-0"]


def test_a_function_that_raises_on_rank_1_fails_the_task_naming_replica_1(
    prefect_server: dict[str, str], torch_installed: None, workspace: Path
) -> None:
    @distributed_task(
        replicas=2,
        cluster=LocalCluster(workspace=str(workspace), max_processes=2),
        retry={"max_attempts": 1},
    )
    def shard_sums(shard: int) -> float:
        import torch
        import torch.distributed as dist

        replica = current_replica()
        total = torch.tensor([float(replica.rank + shard)])
        dist.all_reduce(total)  # both ranks joined the process group
        if replica.rank == 1:
            raise ValueError(f"rank 1 refuses shard {shard}")
        return float(total.item())

    @flow
    def sums(shard: int) -> float:
        return shard_sums(shard)

    with pytest.raises(ReplicaFunctionError) as caught:
        sums(7)
    error = caught.value
    assert (error.replica, error.rank, error.exit_code) == ("worker-0", 1, 1)
    assert error.last_line == "ValueError: rank 1 refuses shard 7"
    assert "replica worker-0 (rank 1 of 2) failed with exit code 1" in str(error)
    assert not error.retryable


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("dialect", ["kubedl", "kubeflow"])
def test_on_two_real_pods_a_gloo_all_reduce_comes_back_as_rank_0s_value(
    dialect: Literal["kubedl", "kubeflow"],
    prefect_server: dict[str, str],
    torch_installed: None,
    testbed: Testbed,
    admin_kubeconfig: Path,
    namespace: str,
) -> None:
    """Two pods of the real operator join one gloo process group through what it injected.

    The worker's ``MASTER_ADDR`` is the master's Service name; KubeDL gives the master itself
    ``localhost``: rank 0's rendezvous store must listen on its pod's own address all the same.
    """
    testbed.start_process_node()
    on_process_node = {
        "nodeSelector": {PROCESS_NODE_LABEL: "true"},
        "tolerations": [{"key": PROCESS_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    }

    @distributed_task(
        replicas=2,
        cluster=KubernetesCluster(kubeconfig_path=str(admin_kubeconfig), namespace=namespace),
        image="python:3.11",  # the process node runs it in this project's environment
        process_group="gloo",
        dialect=dialect,
        retry={"max_attempts": 1},
        spec_fields=on_process_node,
    )
    def summed(tag: str) -> dict[str, object]:
        import os
        import socket

        import torch
        import torch.distributed as dist

        replica = current_replica()
        total = torch.tensor([float(10**replica.rank)])  # rank 0 adds 1, rank 1 adds 10
        dist.all_reduce(total)
        return {
            "tag": tag,
            "rank": replica.rank,
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
            "sum": float(total.item()),
            "master_addr": os.environ["MASTER_ADDR"],
            "host": socket.gethostname(),
        }

    @flow
    def ask(tag: str) -> dict[str, object]:
        return summed(tag)

    answer = ask("from a pod")
    assert {k: answer[k] for k in ("tag", "rank", "world_size", "backend", "sum")} == {
        "tag": "from a pod",
        "rank": 0,
        "world_size": 2,
        "backend": "gloo",
        "sum": 11.0,  # both ranks' shares: the worker joined rank 0's group
    }
    if dialect == "kubedl":
        assert answer["master_addr"] == "localhost"  # what KubeDL gives its master
    else:
        assert str(answer["master_addr"]).endswith("master-0")  # the master's Service
    assert str(answer["host"]).endswith("master-0")  # the master pod's own host name


PROGRESS_JOB = {
    "name": "count-steps",
    "framework": "pytorch",
    "image": "local",
    "command": [
        "python",
        "-c",
        "import json\nfor step in range(1, 5): print(json.dumps({'step': step, 'total': 4}))",
    ],
    "replicas": {"master": 1, "worker": 1},
}
"""A plain training job whose master and worker print progress lines (the artifacts' writer)."""


def test_an_async_flow_awaits_function_tasks_and_a_training_job_and_leaves_no_socket_open(
    prefect_server: dict[str, str], workspace: Path
) -> None:
    cluster = LocalCluster(workspace=str(workspace), max_processes=6)

    @adistributed_task(replicas=2, cluster=cluster, process_group="none", retry={"max_attempts": 1})
    def shard_rank(shard: int) -> dict[str, int]:
        replica = current_replica()
        print(json.dumps({"step": 1, "total": 1, "shard": shard}), flush=True)  # progress
        return {"shard": shard, "rank": replica.rank, "world_size": replica.world_size}

    @flow
    async def shards_and_steps() -> tuple[list[dict[str, int]], TrainingResult]:
        job = TrainingJob(spec=PROGRESS_JOB, cluster=cluster, retry={"max_attempts": 1})
        *shards, steps = await asyncio.gather(
            shard_rank(0), shard_rank(1), arun_training_job(job, key="count-steps")
        )
        return shards, steps

    with sockets_left_unclosed() as leaked:
        shards, steps = asyncio.run(shards_and_steps())
    assert shards == [
        {"shard": 0, "rank": 0, "world_size": 2},
        {"shard": 1, "rank": 0, "world_size": 2},
    ]
    assert steps.phase == "Succeeded"
    assert len(list((workspace / "jobs").iterdir())) == 3  # one job per call
    ours = not_prefects(leaked)  # Prefect's own: one per async flow run
    assert not ours, "sockets left open:\n\n" + "\n\n".join(ours)
