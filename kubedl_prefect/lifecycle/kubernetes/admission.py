"""Whether a job's replicas were admitted together, and if not, why. Pure functions.

Gang admission differs by operator: KubeDL with Volcano makes PodGroups labelled
``kubedl.io/gang-job-name`` (one per job, or one per role when its DAG scheduling is on) and
creates the pods at once, letting the scheduler hold them;
Kubeflow makes one PodGroup named like the job and creates pods only once it is ``Inqueue``; a
job without gang scheduling has only its pods. In every case the job is admitted when each of its
replicas has been bound to a node. What holds it back otherwise — the blocker, the object it
names, and whether waiting can help — is found by :mod:`.blockers` from the operator's events,
the PodGroups' and pods' scheduling state, and the cluster objects the job refers to.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.kubernetes.blockers import find_blocker
from kubedl_prefect.lifecycle.kubernetes.cluster import ClusterFacts
from kubedl_prefect.lifecycle.kubernetes.demand import replica_templates

__all__ = ["admission_state", "expected_replicas"]


def expected_replicas(job: KubeObject) -> int:
    """How many pods the job asks for in total (over every ``*ReplicaSpecs`` role)."""
    return sum(count for _, count, _ in replica_templates(job))


def _is_scheduled(pod: KubeObject) -> bool:
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return True
    return False


def admission_state(
    job: KubeObject,
    *,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject] = (),
    events: Sequence[KubeObject] = (),
    facts: ClusterFacts | None = None,
    now: float | None = None,
) -> AdmissionState:
    """Decide whether ``job`` is admitted, from its pods, PodGroups and related events.

    Args:
        job: The training job object.
        pods: The job's pods (any phase).
        podgroups: The job's Volcano PodGroups, if it is gang-scheduled.
        events: Events about the job, its pods and PodGroups.
        facts: Cluster objects the job refers to (see :func:`.blockers.fact_request`); without
            them only the operators' and schedulers' words are read.
        now: The current time (Unix seconds) for verdicts that depend on it (no operator has
            acted on the job within a grace period); without it, none does.

    Example:
        >>> job = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}}
        >>> pod = {"metadata": {"name": "p"}, "spec": {}, "status": {"conditions": [
        ...     {"type": "PodScheduled", "status": "False",
        ...      "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]}}
        >>> state = admission_state(job, pods=[pod])
        >>> state.blocker, state.permanent
        (<AdmissionBlocker.INSUFFICIENT_GPU: 'InsufficientGPU'>, False)
    """
    expected = expected_replicas(job)
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    scheduled = sum(1 for p in live if _is_scheduled(p))
    if expected and scheduled >= expected:
        return AdmissionState(True, scheduled=scheduled, expected=expected, pods=len(live))
    found = find_blocker(job, pods=live, podgroups=podgroups, events=events, facts=facts, now=now)
    return AdmissionState(
        False,
        found.category,
        found.message,
        scheduled,
        expected,
        subject=found.subject,
        hint=found.hint,
        permanent=found.permanent,
        pods=len(live),
        recheck_in_s=found.recheck_in_s,
    )
