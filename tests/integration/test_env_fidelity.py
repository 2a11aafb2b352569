"""The local backend gives each replica the environment the operators give the pods (issue 20, 7).

For every kind and dialect, the same small spec is rendered and submitted to the test bed's real
operator, and the environment of each pod it creates (as the operator wrote it into the pod) is
compared with the environment the local backend plans for the same replica
(:func:`kubedl_prefect.lifecycle.local.contract.replica_plans`): the same variable names, with the
same meanings. Addresses and ports are not compared (``127.0.0.1`` and a free port locally, a
Service name and the operator's port on a cluster), nor are the contents of ``TF_CONFIG``'s
addresses (its roles, their sizes and the task are). A difference fails the test unless
:data:`DOCUMENTED` lists it, with its reason; docs/testbed.md ("Environment fidelity") has the
same table. MPI is refused by the local backend (documented), so it has no local side.

The pods are kwok's (their environment is what the operator wrote, which is what a container
gets); 38 s here for the eight kinds (marked ``long`` to keep it out of the default phase,
which is at its 15-minute budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.errors import SpecError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PODS
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.local.contract import check_local, replica_plans
from kubedl_prefect.lifecycle.local.layout import JOB_MARKER_ENV
from kubedl_prefect.spec import Dialect, Framework, TrainingJobSpec, loads_spec
from kubedl_prefect.testbed.nodeagent.podspec import PodFacts, field_value
from kubedl_prefect.testbed.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(600)]

STAGE = "testbed.kubedl-prefect.io"
Obj = dict[str, Any]

#: The roles of a small job of each kind.
REPLICAS = {
    Framework.PYTORCH: {"master": 1, "worker": 2},
    Framework.TENSORFLOW: {"ps": 1, "worker": 2},
    Framework.XGBOOST: {"master": 1, "worker": 2},
}
KINDS = [
    (dialect, framework)
    for dialect in Dialect
    for framework in REPLICAS
    if not (dialect is Dialect.TRAINER and framework is Framework.TENSORFLOW)
]

#: Variables whose values are addresses or ports (compared by name only).
ADDRESSES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "WORKER_ADDRS",
        "WORKER_PORT",
        "DMLC_TRACKER_URI",
        "DMLC_TRACKER_PORT",
    }
)

#: Differences found on the real operators (KubeDL v0.5.0, Kubeflow v1.9.4, Trainer v2.3.0) and
#: accepted: (dialect, framework, variable) -> why; ``*`` matches any. docs/testbed.md has them.
DOCUMENTED: dict[tuple[str, str, str], str] = {
    ("*", "*", "PYTHONUNBUFFERED"): (
        "the local backend sets 0 everywhere (KubeDL's PyTorch value); Kubeflow sets 1 for "
        "PyTorch and XGBoost, KubeDL and Kubeflow set none for TensorFlow, KubeDL none for "
        "XGBoost, Trainer none: unbuffered output is only a matter of when lines appear"
    ),
    ("kubedl", "*", "LOCAL_RANK"): "the local backend sets 0 (one process per replica)",
    ("kubeflow", "*", "LOCAL_RANK"): "the local backend sets 0 (one process per replica)",
    ("kubedl", "xgboost", "RANK"): (
        "KubeDL v0.5.0 gives worker i RANK=i, so worker 0 shares rank 0 with the master; the "
        "local backend gives worker i RANK=i+1 as Kubeflow does (a KubeDL defect)"
    ),
    ("kubeflow", "pytorch", "PET_NNODES"): "Kubeflow v1.9 also sets torchrun's PET_* variables",
    ("kubeflow", "pytorch", "PET_NODE_RANK"): "Kubeflow v1.9 also sets torchrun's PET_*",
    ("kubeflow", "pytorch", "PET_NPROC_PER_NODE"): "Kubeflow v1.9 also sets torchrun's PET_*",
    ("kubeflow", "pytorch", "PET_MASTER_ADDR"): "Kubeflow v1.9 also sets torchrun's PET_*",
    ("kubeflow", "pytorch", "PET_MASTER_PORT"): "Kubeflow v1.9 also sets torchrun's PET_*",
    ("kubeflow", "xgboost", "WORKER_ADDRS"): "Kubeflow's XGBoost workers' addresses: not local",
    ("kubeflow", "xgboost", "WORKER_PORT"): "Kubeflow's XGBoost workers' port: not local",
    ("trainer", "*", "JOB_COMPLETION_INDEX"): "the indexed Job's own variable (JobSet's Job)",
    ("trainer", "*", "KUBEFLOW_TRAINER_SERVER_URL"): "Trainer's status server: cluster only",
    ("trainer", "*", "KUBEFLOW_TRAINER_SERVER_CA_CERT"): "Trainer's status server: cluster only",
    ("trainer", "*", "KUBEFLOW_TRAINER_SERVER_TOKEN"): "Trainer's status server: cluster only",
}
#: The local backend's own variables, in every dialect: variable -> why.
LOCAL_ONLY: dict[str, str] = {
    "GLOO_SOCKET_IFNAME": "gloo pinned to the loopback interface: every peer is on this machine",
    "NCCL_SOCKET_IFNAME": "NCCL pinned to the loopback interface, as gloo",
    JOB_MARKER_ENV: "the job marker the local supervisor finds its replicas by",
    "CUDA_VISIBLE_DEVICES": "the machine's GPUs handed out per replica (a device plugin's job)",
    "PATH": "the current environment's bin first (an image's PATH on a cluster)",
}


def documented(dialect: Dialect, framework: Framework, name: str) -> bool:
    """Whether :data:`DOCUMENTED` explains a difference of ``name``."""
    return any(
        (d, f, name) in DOCUMENTED for d in (dialect.value, "*") for f in (framework.value, "*")
    )


def small_spec(framework: Framework) -> TrainingJobSpec:
    """A job of ``framework`` whose kwok pods stay Running (their environment is read)."""
    replicas = "".join(f"  {role}: {count}\n" for role, count in REPLICAS[framework].items())
    return loads_spec(
        f"""
name: env-{framework.value}
framework: {framework.value}
image: registry.example/train:1.0
command: [python, train.py]
annotations: {{"{STAGE}/run-duration": "600s"}}
replicas:
{replicas}"""
    )


def meaning(name: str, value: str) -> str:
    """What a value means, addresses and ports left out."""
    if name in ADDRESSES:
        return "<address>"
    if name == "TF_CONFIG":
        config = json.loads(value)
        cluster = {role: len(hosts) for role, hosts in config.get("cluster", {}).items()}
        return json.dumps({"cluster": cluster, "task": config.get("task")}, sort_keys=True)
    return value


def local_envs(spec: TrainingJobSpec, dialect: Dialect) -> dict[int, dict[str, str]]:
    """The local backend's environment of each replica, by replica order (node rank)."""
    plans = replica_plans(
        spec,
        job_name="job",
        ports=list(range(29500, 29520)),
        python="/venv/bin/python",
        working_dir="/w",
        checkpoint_dir=None,
        inherited={},
        dialect=dialect,
    )
    return {number: dict(plan.env) for number, plan in enumerate(plans)}


def replica_order(pod: Obj, spec: TrainingJobSpec, dialect: Dialect) -> int:
    """The pod's replica, numbered in the spec's role order (Trainer: its node index)."""
    meta = pod["metadata"]
    if dialect is Dialect.TRAINER:
        return int(meta["annotations"]["batch.kubernetes.io/job-completion-index"])
    labels = meta.get("labels") or {}
    role = labels.get("training.kubeflow.org/replica-type") or labels.get("replica-type")
    index = int(
        labels.get("training.kubeflow.org/replica-index") or labels.get("replica-index") or 0
    )
    order = 0
    for resolved in spec.resolved_roles():
        if resolved.role.value == str(role).lower():
            return order + index
        order += resolved.count
    raise AssertionError(f"pod {meta['name']}: unknown role {role!r}")


def cluster_env(pod: Obj) -> dict[str, str]:
    """The training container's environment, as the operator wrote it (downward API resolved)."""
    container = pod["spec"]["containers"][0]
    facts = PodFacts(pod_ip="", host_ip="", venv=Path("/venv"))
    env = {}
    for item in container.get("env") or []:
        field = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        env[item["name"]] = field_value(pod, field, facts) if field else str(item.get("value", ""))
    return env


@pytest.fixture
async def kube(testbed: Testbed) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(str(testbed.kubeconfig)) as client:
        yield client


async def pods_of(kube: KubeClient, namespace: str, count: int) -> list[Obj]:
    """The job's ``count`` pods, once the operator (or JobSet) made them all."""
    found: list[Obj] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(180):
            while True:
                found = (await kube.list(PODS, namespace)).items
                if len(found) >= count:
                    return found
                await asyncio.sleep(1.0)
    raise AssertionError(f"{len(found)} of {count} pods after 180 s")


def test_mpi_has_no_local_side() -> None:
    spec = loads_spec(
        "name: m\nframework: mpi\nimage: x\ncommand: [mpirun, a]\n"
        "replicas: {launcher: 1, worker: 1}\n"
    )
    with pytest.raises(SpecError, match="MPI"):
        check_local(spec)


@pytest.mark.parametrize(
    ("dialect", "framework"), KINDS, ids=[f"{d.value}-{f.value}" for d, f in KINDS]
)
async def test_the_local_env_matches_the_operators(
    dialect: Dialect,
    framework: Framework,
    kube: KubeClient,
    namespace: str,
    admin_kubeconfig: Path,
) -> None:
    spec = small_spec(framework)
    backend = KubernetesBackend(
        namespace=namespace, dialect=dialect, kubeconfig=str(admin_kubeconfig)
    )
    try:
        await backend.submit(spec, key=f"env-{framework.value}", attempt=1)
    finally:
        await backend.close()
    count = sum(REPLICAS[framework].values())
    pods = await pods_of(kube, namespace, count)
    local = local_envs(spec, dialect)

    unexplained: list[str] = []
    for pod in pods:
        order = replica_order(pod, spec, dialect)
        remote = {k: meaning(k, v) for k, v in cluster_env(pod).items()}
        mine = {k: meaning(k, v) for k, v in local[order].items() if k not in LOCAL_ONLY}
        for name in sorted(set(remote) | set(mine)):
            if remote.get(name) == mine.get(name):
                continue
            if documented(dialect, framework, name):
                continue
            unexplained.append(
                f"replica {order} ({pod['metadata']['name']}): {name}: "
                f"operator {remote.get(name)!r}, local {mine.get(name)!r}"
            )
    assert not unexplained, "\n".join(unexplained)
