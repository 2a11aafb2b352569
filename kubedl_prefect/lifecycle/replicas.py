"""The replicas of a training job, one row per pod: who runs where, in what state. Pure.

What a replica table shows (the Prefect surface keeps one current as an artifact): the role and
index the operator gave the pod, the pod, the node it was bound to, the pod's phase and how often
its containers restarted. Both operators label pods with the role and index
(``replica-type``/``replica-index`` for KubeDL, ``training.kubeflow.org/replica-*`` for Kubeflow);
a TrainJob's pods carry their replicated Job (``jobset.sigs.k8s.io/replicatedjob-name``: ``node``,
``launcher``) and their Indexed Job's ``batch.kubernetes.io/job-completion-index``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.diagnosis import (
    JOB_COMPLETION_INDEX_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    replica_name,
)


@dataclass(frozen=True)
class ReplicaState:
    """One pod of a training job.

    Args:
        replica: ``master-0``, ``worker-1``... (the pod's name when it has no role labels).
        role: The role, lower-case (``worker``); empty when unknown.
        index: The index within the role; ``-1`` when unknown.
        pod: The pod's name.
        node: The node it was bound to (empty while not scheduled).
        phase: The pod's phase (``Pending``, ``Running``, ``Succeeded``, ``Failed``), or
            ``Terminating`` once it is being deleted.
        restarts: Container restarts, summed over its containers.

    Example:
        >>> pod = {"metadata": {"name": "mnist-a1-worker-0",
        ...                     "labels": {"replica-type": "worker", "replica-index": "0"}},
        ...        "spec": {"nodeName": "gpu-1"},
        ...        "status": {"phase": "Running", "containerStatuses": [{"restartCount": 2}]}}
        >>> replica_states([pod])[0]
        ReplicaState(replica='worker-0', role='worker', index=0, pod='mnist-a1-worker-0', \
node='gpu-1', phase='Running', restarts=2)
    """

    replica: str
    role: str
    index: int
    pod: str
    node: str
    phase: str
    restarts: int


_ROLE_ORDER = {
    "chief": 0,
    "master": 1,
    "launcher": 2,
    "ps": 3,
    "worker": 4,
    "node": 4,
    "evaluator": 5,
}


def replica_state(pod: KubeObject) -> ReplicaState:
    """The :class:`ReplicaState` of one pod."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    role = (
        labels.get("replica-type")
        or labels.get("training.kubeflow.org/replica-type")
        or labels.get(JOBSET_REPLICATED_JOB_LABEL)
        or ""
    )
    raw_index = (
        labels.get("replica-index")
        or labels.get("training.kubeflow.org/replica-index")
        or labels.get(JOB_COMPLETION_INDEX_LABEL)
    )
    try:
        index = int(raw_index) if raw_index is not None else -1
    except ValueError:
        index = -1
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    if metadata.get("deletionTimestamp"):
        phase = "Terminating"
    containers = (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    )
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    return ReplicaState(
        replica=replica_name(pod),
        role=str(role).lower(),
        index=index,
        pod=str(metadata.get("name") or ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        phase=phase,
        restarts=restarts,
    )


def replica_states(pods: Iterable[KubeObject]) -> tuple[ReplicaState, ...]:
    """One :class:`ReplicaState` per pod, coordinators first, then by role and index."""
    states = [replica_state(pod) for pod in pods]
    return tuple(sorted(states, key=lambda s: (_ROLE_ORDER.get(s.role, 9), s.role, s.index, s.pod)))
