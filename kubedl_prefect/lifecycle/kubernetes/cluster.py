"""What a decision reads of the cluster: the objects it needs, and what was read. Pure data.

:func:`~.blockers.fact_request` computes a :class:`FactRequest`; :class:`~.facts.FactReader`
reads it and hands :class:`ClusterFacts` to the pure decision (:func:`~.blockers.find_blocker`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubedl_prefect.kube.resources import KubeObject


@dataclass(frozen=True)
class FactRequest:
    """The cluster objects a diagnosis needs now (computed by :func:`fact_request`).

    Named objects are read once per wait; the lists (``nodes``, ``quotas``, ``limit_ranges``)
    are read when asked for, and again only when the message that asks changes.

    Args:
        queues: Volcano Queues (cluster-scoped) the job's PodGroups are in.
        priority_classes: PriorityClasses the job names.
        claims: PersistentVolumeClaims its pods mount (in the job's namespace).
        nodes: The scheduler message that makes the nodes worth reading, if any.
        quotas: The refusal that makes the namespace's ResourceQuotas worth reading, if any.
        limit_ranges: The refusal that makes its LimitRanges worth reading, if any.
        local_queues: Kueue LocalQueues the job is labelled for (in its namespace); the
            ClusterQueue each one names is read with it.
        workloads: ``(uid, resourceVersion)`` of a job in a Kueue LocalQueue: its Workloads
            (labelled with the uid) are read, and read again when the job changes.
    """

    queues: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()
    nodes: str | None = None
    quotas: str | None = None
    limit_ranges: str | None = None
    local_queues: tuple[str, ...] = ()
    workloads: tuple[str, str] | None = None


@dataclass(frozen=True)
class ClusterFacts:
    """The cluster objects read for a diagnosis. What was not read is absent (or ``None``).

    Args:
        queues: Queue name to the Queue, or ``None`` where it does not exist.
        priority_classes: PriorityClass name to the object, or ``None`` where it does not exist.
        claims: PersistentVolumeClaim name to the object, or ``None`` where it does not exist.
        nodes: Every node, when they were read.
        quotas: The namespace's ResourceQuotas, when they were read.
        limit_ranges: The namespace's LimitRanges, when they were read.
        local_queues: Kueue LocalQueue name to the object, or ``None`` where it does not exist.
        cluster_queues: Kueue ClusterQueue name to the object, or ``None`` where it does not
            exist (those the LocalQueues name).
        workloads: The job's Kueue Workloads (labelled with its uid), when they were read.
        unchecked: What could not be read, and why (``Nodes (forbidden)``).
    """

    queues: Mapping[str, KubeObject | None] = field(default_factory=dict)
    priority_classes: Mapping[str, KubeObject | None] = field(default_factory=dict)
    claims: Mapping[str, KubeObject | None] = field(default_factory=dict)
    nodes: Sequence[KubeObject] | None = None
    quotas: Sequence[KubeObject] | None = None
    limit_ranges: Sequence[KubeObject] | None = None
    local_queues: Mapping[str, KubeObject | None] = field(default_factory=dict)
    cluster_queues: Mapping[str, KubeObject | None] = field(default_factory=dict)
    workloads: Sequence[KubeObject] | None = None
    unchecked: tuple[str, ...] = ()
