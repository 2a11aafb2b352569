"""A function task's exception on a real pod comes back naming the replica (issue 21).

A ``@distributed_task`` function runs on 2 process pods made by the real KubeDL operator, in one
gloo process group (an ``all_reduce`` both ranks join); then rank 1 raises at once (rank 0 is
still busy). Its bootstrap leaves the error record (rank, exception, the traceback's last line)
as its container's termination message, which the node agent reports as a kubelet does; the
worker's exit 1 fails the job (ExitCode), and the task raises ``ReplicaFunctionError`` naming
``worker-0`` (rank 1) with what the pod's status says.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prefect import flow

from kubedl_prefect.errors import ReplicaFunctionError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PODS
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.prefect import KubernetesCluster, current_replica, distributed_task
from kubedl_prefect.prefect.replica import read_termination_message
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL
from kubedl_prefect.testbed.testbed import Testbed

# Minutes: torch starts in two pods of a shared machine; in `make test`'s second phase.
pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(900)]

ON_PROCESS_NODE = {
    "nodeSelector": {PROCESS_NODE_LABEL: "true"},
    "tolerations": [{"key": PROCESS_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}


async def test_a_function_that_raises_on_a_pod_fails_the_task_naming_its_replica(
    prefect_server: dict[str, str],
    process_node: Testbed,
    admin_kubeconfig: Path,
    namespace: str,
    kube: KubeClient,
) -> None:
    @distributed_task(
        replicas=2,
        cluster=KubernetesCluster(kubeconfig_path=str(admin_kubeconfig), namespace=namespace),
        image="python:3.11",  # the process node runs it in this project's environment
        process_group="gloo",
        retry={"max_attempts": 1},
        spec_fields=ON_PROCESS_NODE,
    )
    def shard_sums(shard: int) -> float:
        import time

        import torch
        import torch.distributed as dist

        replica = current_replica()
        total = torch.tensor([float(replica.rank + shard)])
        dist.all_reduce(total)  # both ranks joined the process group
        if replica.rank == 1:
            raise ValueError(f"rank 1 refuses shard {shard}")
        time.sleep(120)  # rank 1 fails first: its failure fails the job
        return float(shard)

    @flow
    def sums(shard: int) -> float:
        return shard_sums(shard)

    with pytest.raises(ReplicaFunctionError) as caught:
        await asyncio.to_thread(sums, 7)
    error = caught.value
    assert (error.replica, error.rank, error.exit_code) == ("worker-0", 1, 1)
    assert error.last_line == "ValueError: rank 1 refuses shard 7"
    assert error.error_type == "ValueError"
    assert "replica worker-0 (rank 1 of 2) failed with exit code 1" in str(error)
    assert not error.retryable

    # What the task read: the failed worker pod's termination message, as the agent reported it.
    pods = (await kube.list(PODS, namespace)).items
    (worker,) = [p for p in pods if p["metadata"]["name"].endswith("-worker-0")]
    # The error names the failed attempt's job, whose pods the task read.
    assert error.ref is not None
    failed = JobRef.from_dict(error.ref)
    assert (failed.namespace, failed.attempt) == (namespace, 1)
    assert worker["metadata"]["name"] == f"{failed.name}-worker-0"
    (status,) = worker["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 1
    record = read_termination_message(terminated["message"], where="worker-0").error
    assert record is not None
    assert (record.rank, record.last_line) == (1, "ValueError: rank 1 refuses shard 7")
