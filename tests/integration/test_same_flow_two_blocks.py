"""One flow function, two cluster blocks: this machine (LocalCluster) and the test bed.

The flow takes the cluster block as its parameter and nothing else differs: the same spec, the
same TrainingJob block, the same task. Locally the replicas really run (the command prints its
rank); on the test bed kwok plays the pods (the run-duration stage annotation, which the local
backend ignores). Both flow runs must end Completed on a real Prefect server, with their jobs
Succeeded, and the local one must have run each replica under the operators' environment.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.prefect import (
    CLEANUP_HOOKS,
    KubernetesCluster,
    RetrySettings,
    TrainingJob,
    TrainingResult,
    run_training_job,
)
from kubedl_prefect.prefect.blocks import ClusterBlock, LocalCluster, load_cluster
from kubedl_prefect.spec import loads_spec, spec_to_data

pytestmark = [
    pytest.mark.integration,
    # Prefect 3.9.1 leaks one HTTP connection per flow run (see test_prefect_flows.py).
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
        "ignore:unclosed <socket.socket:ResourceWarning",
    ),
]

ROOT = Path(__file__).parents[2]
RBAC = ROOT / "deploy" / "rbac.yaml"
SPEC = spec_to_data(
    loads_spec(
        """
name: hello-ranks
framework: pytorch
image: registry.example/hello:1.0
command:
  - python
  - -c
  - "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)"
annotations: {"testbed.kubedl-prefect.io/run-duration": "3s"}
resources: {cpu: 1, memory: 256Mi}
replicas:
  master: 1
  worker: 1
"""
    )
)


@flow(**CLEANUP_HOOKS)
def train_on(cluster: ClusterBlock, key: str) -> TrainingResult:
    """The flow under test: the cluster block is all that changes between the two runs."""
    job = TrainingJob(spec=SPEC, cluster=cluster, retry=RetrySettings(max_attempts=1))
    return run_training_job(job, key=key)


@pytest.fixture(autouse=True)
def collect_prefects_leaked_connections() -> Iterator[None]:
    yield
    gc.collect()


@pytest.fixture
def kubernetes_cluster(
    namespace: str, service_account_kubeconfig: Callable[..., Path]
) -> KubernetesCluster:
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    role = next(d for d in documents if d["kind"] == "Role")
    kubeconfig = service_account_kubeconfig(namespace, role["rules"])
    return KubernetesCluster(kubeconfig_path=str(kubeconfig), namespace=namespace)


def flow_logs(flow_run_id: object, needles: list[str], timeout_s: float = 30.0) -> str:
    """The flow run's log messages, once they hold every needle (logs arrive in batches)."""

    async def read() -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            async with get_client() as client:
                logs = await client.read_logs(
                    log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                    limit=200,
                )
            text = "\n".join(log.message for log in logs)
            if all(n in text for n in needles) or time.monotonic() > deadline:
                return text
            await asyncio.sleep(0.5)

    return asyncio.run(read())


def test_the_same_flow_trains_on_this_machine_and_on_the_test_bed_with_only_the_block_changed(
    prefect_server: dict[str, str], kubernetes_cluster: KubernetesCluster, tmp_path: Path
) -> None:
    local = LocalCluster(workspace=str(tmp_path / "ws"), working_dir=str(tmp_path), cpus=2)
    runs = {}
    for label, cluster in (("local", local), ("kubernetes", kubernetes_cluster)):
        state = train_on(cluster, key=f"two-blocks-{label}", return_state=True)
        assert state.is_completed(), (label, state)
        runs[label] = (state, state.result())

    for label, (_, result) in runs.items():
        assert isinstance(result, TrainingResult)
        assert result.phase == "Succeeded", (label, result)
        assert result.spec_name == "hello-ranks"
        assert result.ref["backend"] == label
    assert runs["local"][1].ref["namespace"] == str((tmp_path / "ws").resolve())
    assert runs["kubernetes"][1].ref["namespace"] == kubernetes_cluster.namespace

    # The local replicas really ran, under the operators' contract, and their lines reached the
    # flow run's logs labelled with the replica.
    (local_state, _) = runs["local"]
    needles = ["rank 0 of 2", "rank 1 of 2"]
    text = flow_logs(local_state.state_details.flow_run_id, needles)
    for needle in needles:
        assert needle in text


def test_saved_cluster_blocks_of_either_kind_load_by_name(
    prefect_server: dict[str, str], kubernetes_cluster: KubernetesCluster, tmp_path: Path
) -> None:
    LocalCluster(workspace=str(tmp_path), max_processes=2).save("laptop", overwrite=True)
    kubernetes_cluster.save("bed", overwrite=True)
    laptop = load_cluster("laptop")
    assert isinstance(laptop, LocalCluster)
    assert laptop.max_processes == 2
    assert isinstance(load_cluster("kubedl-local-cluster/laptop"), LocalCluster)
    bed = load_cluster("bed")
    assert isinstance(bed, KubernetesCluster)
    assert bed.namespace == kubernetes_cluster.namespace
    # A training job saved with a local cluster loads with it.
    TrainingJob(spec=SPEC, cluster=laptop).save("hello-here", overwrite=True)
    loaded = TrainingJob.load("hello-here")
    assert isinstance(loaded, TrainingJob)
    assert isinstance(loaded.cluster, LocalCluster)
    assert loaded.cluster.workspace == str(tmp_path)
    with pytest.raises(KubeDLPrefectError, match="no cluster block named 'nowhere'"):
        load_cluster("nowhere")
