"""Why a job has not started, and whether it ever will: every blocker named, and decided. Pure.

A job that is not admitted waits for a reason. This module names it, from what a person would
read by hand: the operator's events on the job (pods it could not create), the PodGroups'
conditions and events, the pods' scheduling conditions, and the cluster objects the job refers
to (Volcano Queues, PriorityClasses, PersistentVolumeClaims, Nodes, ResourceQuotas and
LimitRanges; Kueue's Workload, LocalQueue and ClusterQueue), read by :mod:`.facts` and passed in
as :class:`ClusterFacts`.

Each blocker is a :class:`Blocker`: a category (:class:`AdmissionBlocker`, a stable contract),
the object it names, a one-line message, a hint, and a decision, ``permanent`` or not:

- **permanent** — it never goes away by waiting, so the wait fails the job at once and deletes
  it: the operator could not create the pods because the API server refuses them (an invalid pod
  template, a LimitRange, an admission webhook, a missing PriorityClass or ServiceAccount, a
  ResourceQuota smaller than the whole job), a missing or closed Volcano Queue or one whose
  capability is smaller than the job, a missing PriorityClass, a missing PersistentVolumeClaim,
  a node selector or affinity that no node matches, and taints (other than the node lifecycle
  ones) on every node the pods may use;
- **transient** — capacity may free up or the object may still change, so the wait goes on and
  reports it: GPUs, CPU or memory short, a queue at its capability, a ResourceQuota used up by
  other pods, an unbound PersistentVolumeClaim, a cordoned or not-ready node, an operator that
  has not acted on the job yet (it may be restarting).

What a read could not check (RBAC) is said in the message instead of failing: placement blockers
found only in the scheduler's words stay transient then. A cluster autoscaler that triggered a
scale-up for a pod makes placement blockers transient too: a node with those labels is coming.

Kueue's blockers are decided by :mod:`.kueue` (each with its decision) and come first: a job
Kueue has not admitted is suspended, so it has no pods for anything else to be about.

Sources are ranked so that the message that names the root cause wins over generic scheduler
text ("pod group is not ready"): Kueue first, then refusals (pods that do not exist cannot be
scheduled),
then the objects the job refers to, then placement, then the scheduler's specific words, then
what is merely pending.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, Blocker
from kubedl_prefect.lifecycle.kubernetes import operators
from kubedl_prefect.lifecycle.kubernetes.cluster import ClusterFacts, FactRequest
from kubedl_prefect.lifecycle.kubernetes.decisions import (
    LIMIT_RANGE,
    claims_blocker,
    missing_claim,
    missing_priority_class,
    queue_blocker,
    refusal_blocker,
    unbound_claims,
)
from kubedl_prefect.lifecycle.kubernetes.demand import (
    job_queues,
    needed_claims,
    needed_priority_classes,
    replica_templates,
    template_specs,
    waiting_podgroups,
)
from kubedl_prefect.lifecycle.kubernetes.kueue import (
    job_workload,
    kueue_blocker,
    kueue_queue,
    kueue_request,
    suspended,
)
from kubedl_prefect.lifecycle.kubernetes.operators import operator_blocker
from kubedl_prefect.lifecycle.kubernetes.scheduler import (
    PLACEMENT_WORDS,
    QUEUE_SHORT,
    SCHEDULER_PATTERNS,
    classify_reason,
    refusals,
    scheduling_messages,
)
from kubedl_prefect.lifecycle.kubernetes.taints import placement_blocker
from kubedl_prefect.spec.kueue import suspend_field


def fact_request(
    job: KubeObject,
    *,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject] = (),
    events: Sequence[KubeObject] = (),
) -> FactRequest:
    """Which cluster objects :func:`find_blocker` needs for this job now."""
    messages = scheduling_messages(pods, podgroups, events)
    placement = sorted(m for m in messages if PLACEMENT_WORDS.search(m))
    refused = refusals(events)
    queues = job_queues(job, podgroups) if (not podgroups or waiting_podgroups(podgroups)) else []
    kueue = kueue_request(job) or FactRequest()
    return FactRequest(
        queues=tuple(queues),
        priority_classes=tuple(name for name, _ in needed_priority_classes(job, podgroups)),
        claims=tuple(needed_claims(job)),
        nodes=" | ".join(placement) or None,
        quotas=next((m for m in refused if "exceeded quota" in m), None),
        limit_ranges=next((m for m in refused if LIMIT_RANGE.search(m)), None),
        local_queues=kueue.local_queues,
        workloads=kueue.workloads,
    )


def find_blocker(
    job: KubeObject,
    *,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject] = (),
    events: Sequence[KubeObject] = (),
    facts: ClusterFacts | None = None,
    now: float | None = None,
    grace_s: float | None = None,
) -> Blocker:
    """Why ``job`` (not admitted yet) waits, and whether it ever stops.

    Args:
        job: The training job.
        pods: Its live pods.
        podgroups: Its Volcano PodGroups.
        events: Events about it, its pods and PodGroups.
        facts: The cluster objects read for it (:func:`fact_request` says which); without them,
            only the operators' and schedulers' words are read.
        now: The time (Unix seconds), for the operator grace; without it, no verdict depends on
            time.
        grace_s: The operator grace (default :data:`operators.OPERATOR_GRACE_S`).
    """
    found = _find_blocker(job, pods, podgroups, events, facts, now, grace_s)
    return _with_unchecked(found, facts)


def _find_blocker(
    job: KubeObject,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject],
    events: Sequence[KubeObject],
    facts: ClusterFacts | None,
    now: float | None,
    grace_s: float | None,
) -> Blocker:
    metadata = job.get("metadata") or {}
    namespace = str(metadata.get("namespace") or "")
    expected = sum(count for _, count, _ in replica_templates(job))
    messages = scheduling_messages(pods, podgroups, events)
    scaling_up = any(e.get("reason") == "TriggeredScaleUp" for e in events)

    # 0. Kueue: a job it has not admitted is suspended, and has no pods to look at.
    found = _kueue(job, facts, now) or _suspended_by_hand(job)
    if found is not None:
        return found
    # 1. Pods the API server refuses: nothing else matters until they can be created.
    if len(pods) < expected:
        refused = refusals(events)
        if refused:
            refusal = refusal_blocker(job, namespace, refused[0], facts)
            if refusal.permanent or refusal.category is not AdmissionBlocker.NOT_CREATED:
                return refusal
    # 2. Objects the job names that do not exist (or never admit it).
    if facts is not None:
        for name, where in needed_priority_classes(job, podgroups):
            if name in facts.priority_classes and facts.priority_classes[name] is None:
                return missing_priority_class(name, where)
        queue_short = any(QUEUE_SHORT.search(m) for m in messages)
        found = queue_blocker(job, podgroups, facts, queue_short)
        found = found or claims_blocker(job, namespace, facts)
        # 3. Nodes that can never take the pods.
        found = found or placement_blocker(job, pods, facts, scaling_up)
        if found is not None:
            return found
    # 4. The schedulers' own words, the most specific first.
    specific = [(classify_reason(m), m) for m in messages]
    specific = [(b, m) for b, m in specific if b is not AdmissionBlocker.WAITING]
    if specific:
        order = [blocker for _, blocker in SCHEDULER_PATTERNS]
        blocker, message = min(specific, key=lambda item: order.index(item[0]))
        return _from_scheduler(job, namespace, blocker, message, facts)
    # 5. Nothing said why: pending pods, a gang not enqueued, or no operator at all.
    found = operator_blocker(
        job,
        pods,
        podgroups,
        events,
        now,
        operators.OPERATOR_GRACE_S if grace_s is None else grace_s,
    )
    if found is not None and found.category is AdmissionBlocker.OPERATOR_NOT_RUNNING:
        return found
    recheck = found.recheck_in_s if found is not None else None
    waiting = waiting_podgroups(podgroups)
    if len(pods) < expected:
        if waiting:
            return _not_enqueued(waiting, recheck)
        refused = refusals(events)
        if refused:
            return refusal_blocker(job, namespace, refused[0], facts)
        return Blocker(
            AdmissionBlocker.NOT_CREATED,
            f"{len(pods)}/{expected} pods created so far",
            "check the operator's events on the job (kubectl describe) and its log",
            recheck_in_s=recheck,
        )
    if messages:
        return Blocker(
            AdmissionBlocker.WAITING,
            messages[0],
            "describe the job's pods and PodGroups; check that the scheduler runs",
        )
    scheduler = _scheduler_name(job, pods)
    queues = job_queues(job, podgroups)
    where = f" (Queue {', '.join(queues)})" if queues else ""
    return Blocker(
        AdmissionBlocker.WAITING,
        f"waiting for the {scheduler} scheduler{where}",
        f"check that the {scheduler} scheduler runs",
    )


def _kueue(job: KubeObject, facts: ClusterFacts | None, now: float | None) -> Blocker | None:
    """Kueue's blocker of a job in one of its LocalQueues (see :mod:`.kueue`)."""
    if kueue_queue(job) is None:
        return None
    workloads = facts.workloads if facts is not None else None
    return kueue_blocker(
        job,
        workload=job_workload(job, workloads or []),
        workloads_read=workloads is not None,
        local_queues=facts.local_queues if facts is not None else {},
        cluster_queues=facts.cluster_queues if facts is not None else {},
        now=now,
    )


def _suspended_by_hand(job: KubeObject) -> Blocker | None:
    """A job suspended outside Kueue (created so, or patched): it waits for whoever resumes it."""
    path = suspend_field(job)
    if path is None or not suspended(job):
        return None
    metadata = job.get("metadata") or {}
    subject = f"{job.get('kind')} {metadata.get('namespace')}/{metadata.get('name')}"
    field = ".".join(path)
    return Blocker(
        AdmissionBlocker.WAITING,
        f"{subject} is suspended ({field}: true): nothing runs until it is resumed",
        f"resume it (set {field} to false, e.g. kubectl patch), or cancel it",
        subject=subject,
    )


def _scheduler_name(job: KubeObject, pods: Sequence[KubeObject]) -> str:
    for pod in pods:
        name = (pod.get("spec") or {}).get("schedulerName")
        if name and name != "default-scheduler":
            return str(name)
    for pod_spec in template_specs(job):
        name = pod_spec.get("schedulerName")
        if name and name != "default-scheduler":
            return str(name)
    return "default"


def _not_enqueued(waiting: Sequence[KubeObject], recheck: float | None) -> Blocker:
    names = ", ".join(str(pg["metadata"]["name"]) for pg in waiting)
    queues = sorted({str(q) for pg in waiting if (q := (pg.get("spec") or {}).get("queue"))})
    where = f" in Volcano Queue {', '.join(queues)}" if queues else ""
    return Blocker(
        AdmissionBlocker.WAITING,
        f"PodGroup {names} waiting to be enqueued{where}",
        "check that the Volcano scheduler runs and that the queue is open and has room "
        "(kubectl get queues)",
        subject=f"Queue {', '.join(queues)}" if queues else "",
        recheck_in_s=recheck,
    )


def _from_scheduler(
    job: KubeObject,
    namespace: str,
    blocker: AdmissionBlocker,
    message: str,
    facts: ClusterFacts | None,
) -> Blocker:
    if blocker is AdmissionBlocker.PVC_NOT_FOUND:
        claim = re.search(r'persistentvolumeclaim "([^"]+)" not found', message, re.I)
        name = claim.group(1) if claim else "?"
        exists = facts is not None and facts.claims.get(name) is not None
        if not exists:
            return missing_claim(namespace, name)
        blocker = AdmissionBlocker.UNBOUND_PVC
    if blocker is AdmissionBlocker.UNBOUND_PVC:
        found = unbound_claims(job, namespace, facts)
        if found.subject:
            return found
    hints = {
        AdmissionBlocker.INSUFFICIENT_GPU: "ask for fewer GPUs per replica or fewer replicas, or "
        "wait for GPUs to free up",
        AdmissionBlocker.INSUFFICIENT_RESOURCES: "lower the replicas' CPU/memory requests, or "
        "wait for capacity",
        AdmissionBlocker.UNBOUND_PVC: "check the claims' storage class and provisioner "
        "(kubectl describe pvc)",
        AdmissionBlocker.UNTOLERATED_TAINT: "add a toleration for the nodes' taint to the spec",
        AdmissionBlocker.NO_MATCHING_NODE: "fix nodeSelector/affinity in the spec (kubectl get "
        "nodes --show-labels), or add nodes with those labels",
        AdmissionBlocker.QUOTA: "raise the namespace's ResourceQuota, or wait for other pods to "
        "finish",
    }
    return Blocker(blocker, message, hints.get(blocker, "describe the job's pods and PodGroups"))


def _with_unchecked(blocker: Blocker, facts: ClusterFacts | None) -> Blocker:
    """A transient blocker, with what could not be checked said in its message."""
    if blocker.permanent or facts is None or not facts.unchecked:
        return blocker
    return Blocker(
        blocker.category,
        f"{blocker.message} (could not check: {'; '.join(facts.unchecked)})",
        f"{blocker.hint}; grant the read-only access of deploy/ to check more",
        subject=blocker.subject,
        permanent=False,
        recheck_in_s=blocker.recheck_in_s,
    )
