"""Why a job has not started, and whether it ever will: every blocker named, and decided. Pure.

A job that is not admitted waits for a reason. This module names it, from what a person would
read by hand: the operator's events on the job (pods it could not create), the PodGroups'
conditions and events, the pods' scheduling conditions, and the cluster objects the job refers
to (Volcano Queues, PriorityClasses, PersistentVolumeClaims, Nodes, ResourceQuotas and
LimitRanges), read by :mod:`.facts` and passed in as :class:`ClusterFacts`.

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

Sources are ranked so that the message that names the root cause wins over generic scheduler
text ("pod group is not ready"): refusals first (pods that do not exist cannot be scheduled),
then the objects the job refers to, then placement, then the scheduler's specific words, then
what is merely pending.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from kubedl_prefect.errors import Diagnosis, FailureCategory
from kubedl_prefect.kube.resources import KubeObject, ResourceKind
from kubedl_prefect.spec.quantity import parse_quantity

OPERATOR_GRACE_S = 30.0
"""How long after its creation a job may show no sign of an operator (no status, pods, PodGroups
or events) before the wait says that no operator acts on it. Both operators write one of these
within a second or two of a job's creation."""


class AdmissionBlocker(StrEnum):
    """Why a job is not admitted yet: a stable contract (values are never renamed or removed).

    The categories a wait may decide are permanent are also :class:`FailureCategory` values, the
    category of the failure it then reports.
    """

    INSUFFICIENT_GPU = "InsufficientGPU"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    UNBOUND_PVC = "UnboundPVC"
    UNTOLERATED_TAINT = "UntoleratedTaint"
    QUOTA = "QuotaExceeded"
    NOT_CREATED = "PodsNotCreated"
    WAITING = "Waiting"
    OPERATOR_NOT_RUNNING = "OperatorNotRunning"
    QUEUE_NOT_FOUND = "QueueNotFound"
    QUEUE_CLOSED = "QueueClosed"
    QUEUE_CAPABILITY = "QueueCapabilityExceeded"
    PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
    NO_MATCHING_NODE = "NoMatchingNode"
    PVC_NOT_FOUND = "PVCNotFound"
    LIMIT_RANGE = "LimitRangeViolated"
    POD_REFUSED = "PodRefused"
    OPERATOR_NOT_INSTALLED = "OperatorNotInstalled"


GENERIC_BLOCKERS = frozenset({AdmissionBlocker.WAITING, AdmissionBlocker.NOT_CREATED})
"""Blockers that name no cause (yet): a later, vaguer observation never replaces a specific one."""


@dataclass(frozen=True)
class Blocker:
    """What holds a job back, and whether it ever stops doing so.

    Args:
        category: The cause.
        message: One line that says it, naming the object.
        hint: What to do about it.
        subject: The object it names (``Queue gpu-team``, ``PersistentVolumeClaim ml/data``).
        permanent: Whether waiting cannot help (the wait fails the job at once).
        recheck_in_s: In how many seconds the verdict may change by time alone (the operator
            grace running out), even if nothing in the cluster changes.

    Example:
        >>> b = Blocker(AdmissionBlocker.QUEUE_NOT_FOUND, 'Volcano Queue "gpu" does not exist',
        ...             "create it", subject="Queue gpu", permanent=True)
        >>> b.diagnosis().summary()
        'QueueNotFound: Volcano Queue "gpu" does not exist'
    """

    category: AdmissionBlocker
    message: str
    hint: str
    subject: str = ""
    permanent: bool = False
    recheck_in_s: float | None = None

    def diagnosis(self) -> Diagnosis:
        """The failure this blocker makes of the job (meant for permanent ones)."""
        try:
            category = FailureCategory(self.category.value)
        except ValueError:
            category = FailureCategory.UNKNOWN
        return Diagnosis(
            category=category,
            retryable=False,
            replica=None,
            exit_code=None,
            message=self.message,
            hint=self.hint,
            subject=self.subject or None,
        )


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
    """

    queues: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()
    nodes: str | None = None
    quotas: str | None = None
    limit_ranges: str | None = None


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
        unchecked: What could not be read, and why (``Nodes (forbidden)``).
    """

    queues: Mapping[str, KubeObject | None] = field(default_factory=dict)
    priority_classes: Mapping[str, KubeObject | None] = field(default_factory=dict)
    claims: Mapping[str, KubeObject | None] = field(default_factory=dict)
    nodes: Sequence[KubeObject] | None = None
    quotas: Sequence[KubeObject] | None = None
    limit_ranges: Sequence[KubeObject] | None = None
    unchecked: tuple[str, ...] = ()


# --- what the job asks of the cluster ---------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where the pods of one role may run, and what each of them requests.

    Args:
        role: The role, lower-case (``worker``).
        count: Its replicas.
        node_selector: ``nodeSelector`` labels.
        node_terms: The required node affinity's ``nodeSelectorTerms`` (any one must match).
        tolerations: The pods' tolerations.
        requests: Requests of one pod (limits where no request is given), in base units.
        limits: Limits of one pod, in base units.
    """

    role: str
    count: int
    node_selector: Mapping[str, str]
    node_terms: tuple[KubeObject, ...]
    tolerations: tuple[KubeObject, ...]
    requests: Mapping[str, Decimal]
    limits: Mapping[str, Decimal]

    def describe(self) -> str:
        """The placement constraints in words (``nodeSelector disktype=ssd``)."""
        parts = []
        if self.node_selector:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(self.node_selector.items()))
            parts.append(f"nodeSelector {labels}")
        if self.node_terms:
            parts.append(f"node affinity {' or '.join(_describe_term(t) for t in self.node_terms)}")
        return "; ".join(parts) or "no node constraints"


def _describe_term(term: KubeObject) -> str:
    words = []
    for expression in (term.get("matchExpressions") or []) + (term.get("matchFields") or []):
        values = ",".join(str(v) for v in expression.get("values") or [])
        words.append(f"{expression.get('key')} {expression.get('operator')} ({values})".strip())
    return "[" + ", ".join(words) + "]"


def replica_templates(job: KubeObject) -> Iterator[tuple[str, int, KubeObject]]:
    """``(role, replicas, pod template)`` of every role of a KubeDL or Kubeflow job."""
    spec = job.get("spec") or {}
    for key, roles in spec.items():
        if not (key.endswith("ReplicaSpecs") and isinstance(roles, dict)):
            continue
        for role, replica_spec in roles.items():
            replica_spec = replica_spec or {}
            count = replica_spec.get("replicas", 1)
            yield str(role).lower(), int(count or 0), replica_spec.get("template") or {}


def _scheduling_policy(job: KubeObject) -> KubeObject:
    spec = job.get("spec") or {}
    policy = spec.get("schedulingPolicy") or (spec.get("runPolicy") or {}).get("schedulingPolicy")
    return policy or {}


def _quantities(values: Mapping[str, Any] | None) -> dict[str, Decimal]:
    parsed: dict[str, Decimal] = {}
    for key, value in (values or {}).items():
        try:
            parsed[str(key)] = parse_quantity(str(value))
        except ValueError:
            continue
    return parsed


def _pod_resources(pod_spec: KubeObject) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        own_limits = _quantities(resources.get("limits"))
        own_requests = {**own_limits, **_quantities(resources.get("requests"))}
        for key, value in own_requests.items():
            requests[key] = requests.get(key, Decimal(0)) + value
        for key, value in own_limits.items():
            limits[key] = limits.get(key, Decimal(0)) + value
    return requests, limits


def _pod_role(pod: KubeObject) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    role = labels.get("replica-type") or labels.get("training.kubeflow.org/replica-type") or ""
    return str(role).lower()


def placements(job: KubeObject, pods: Sequence[KubeObject] = ()) -> list[Placement]:
    """One :class:`Placement` per role: from a pod of the role when one exists, else its template.

    A pod is preferred because admission webhooks may have changed it (added tolerations).
    """
    found = []
    pods_by_role = {_pod_role(pod): pod for pod in pods}
    for role, count, template in replica_templates(job):
        source = pods_by_role.get(role) or template
        pod_spec = source.get("spec") or {}
        affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        requests, limits = _pod_resources(pod_spec)
        found.append(
            Placement(
                role=role,
                count=count,
                node_selector={
                    str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()
                },
                node_terms=tuple(affinity.get("nodeSelectorTerms") or []),
                tolerations=tuple(pod_spec.get("tolerations") or []),
                requests=requests,
                limits=limits,
            )
        )
    return found


def job_total(job: KubeObject, key: str) -> Decimal | None:
    """What the whole job asks of a ResourceQuota key (``requests.cpu``, ``pods``...), if known."""
    roles = placements(job)
    if key in ("pods", "count/pods"):
        return Decimal(sum(p.count for p in roles))
    if key.startswith("limits."):
        resource, source = key.removeprefix("limits."), "limits"
    else:
        resource, source = key.removeprefix("requests."), "requests"
    if "/" in resource and not resource.count("."):
        return None  # count/<resource> quotas are not about pods
    total = Decimal(0)
    for placement in roles:
        values = placement.limits if source == "limits" else placement.requests
        total += values.get(resource, Decimal(0)) * placement.count
    return total


def _template_specs(job: KubeObject) -> Iterator[KubeObject]:
    for _, _, template in replica_templates(job):
        yield template.get("spec") or {}


def needed_priority_classes(
    job: KubeObject, podgroups: Sequence[KubeObject] = ()
) -> list[tuple[str, str]]:
    """``(name, where it is named)`` of every PriorityClass the job names."""
    found: dict[str, str] = {}
    policy = _scheduling_policy(job)
    for key in ("priorityClassName", "priorityClass"):
        if policy.get(key):
            found.setdefault(str(policy[key]), "gang.priorityClass")
    for podgroup in podgroups:
        name = (podgroup.get("spec") or {}).get("priorityClassName")
        if name:
            found.setdefault(str(name), "gang.priorityClass")
    for pod_spec in _template_specs(job):
        if pod_spec.get("priorityClassName"):
            found.setdefault(str(pod_spec["priorityClassName"]), "priorityClassName of the pods")
    return sorted(found.items())


def needed_claims(job: KubeObject) -> list[str]:
    """The PersistentVolumeClaims the job's pods mount."""
    claims = {
        str(claim)
        for pod_spec in _template_specs(job)
        for volume in pod_spec.get("volumes") or []
        if (claim := (volume.get("persistentVolumeClaim") or {}).get("claimName"))
    }
    return sorted(claims)


def job_queues(job: KubeObject, podgroups: Sequence[KubeObject]) -> list[str]:
    """The Volcano Queues the job is in: its PodGroups', else the one its spec names."""
    queues = {str(q) for pg in podgroups if (q := (pg.get("spec") or {}).get("queue"))}
    if not queues and not podgroups and _scheduling_policy(job).get("queue"):
        queues.add(str(_scheduling_policy(job)["queue"]))
    return sorted(queues)


def _waiting_podgroups(podgroups: Sequence[KubeObject]) -> list[KubeObject]:
    """PodGroups Volcano has not enqueued yet (their queue may be what holds them)."""
    return [
        pg for pg in podgroups if (pg.get("status") or {}).get("phase") in (None, "", "Pending")
    ]


# --- reading the messages ---------------------------------------------------------------------


_ORIGIN = re.compile(r"Origin reason is [^:]+: (.*)$", re.S)
_KUBEFLOW_POD_EVENT = re.compile(r"^Error pod \S+ condition message: ", re.S)
_GANG_GENERIC = re.compile(r"pod group is not ready|tasks in gang unschedulable", re.I)

_SCHEDULER_PATTERNS: tuple[tuple[re.Pattern[str], AdmissionBlocker], ...] = (
    (re.compile(r'persistentvolumeclaim "[^"]+" not found', re.I), AdmissionBlocker.PVC_NOT_FOUND),
    (re.compile(r"exceeded quota", re.I), AdmissionBlocker.QUOTA),
    # Volcano says "queue resource quota insufficient: insufficient nvidia.com/gpu" when the
    # cluster (the queue's share of it) lacks GPUs: that is a GPU shortage to the user.
    (re.compile(r"nvidia\.com/gpu", re.I), AdmissionBlocker.INSUFFICIENT_GPU),
    (re.compile(r"PersistentVolumeClaim", re.I), AdmissionBlocker.UNBOUND_PVC),
    (re.compile(r"taint", re.I), AdmissionBlocker.UNTOLERATED_TAINT),
    (
        re.compile(r"didn't match (Pod's )?node (affinity|selector)", re.I),
        AdmissionBlocker.NO_MATCHING_NODE,
    ),
    (
        re.compile(r"Insufficient|NotEnoughResources|not enough", re.I),
        AdmissionBlocker.INSUFFICIENT_RESOURCES,
    ),
    (re.compile(r"quota", re.I), AdmissionBlocker.QUOTA),
)

# The scheduler's words that make the nodes worth reading.
_PLACEMENT_WORDS = re.compile(r"node affinity|node selector|taint", re.I)
_QUEUE_SHORT = re.compile(r"queue resource quota insufficient", re.I)


def classify_reason(message: str) -> AdmissionBlocker:
    """Map a scheduler or quota message to an :class:`AdmissionBlocker` (``WAITING`` if none).

    Example:
        >>> classify_reason("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
        <AdmissionBlocker.INSUFFICIENT_GPU: 'InsufficientGPU'>
    """
    for pattern, blocker in _SCHEDULER_PATTERNS:
        if pattern.search(message):
            return blocker
    return AdmissionBlocker.WAITING


def one_line(message: str) -> str:
    """``message`` with its whitespace runs (newlines included) made single spaces."""
    return " ".join(message.split())


def _scheduler_text(message: str) -> str:
    """A scheduling message without Kubeflow's prefix, and Volcano's origin reason when given."""
    message = _KUBEFLOW_POD_EVENT.sub("", message)
    origin = _ORIGIN.search(message)
    return one_line(origin.group(1) if origin else message)


def _by_time(events: Iterable[KubeObject], reasons: set[str]) -> list[KubeObject]:
    """Events with one of ``reasons``, newest first."""
    matching = [e for e in events if e.get("reason") in reasons]
    matching.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "", reverse=True)
    return matching


def scheduling_messages(
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject],
    events: Sequence[KubeObject],
) -> list[str]:
    """What the schedulers said about the job, most structured first, each on one line."""
    raw: list[str] = []
    for podgroup in podgroups:
        for condition in reversed((podgroup.get("status") or {}).get("conditions") or []):
            if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
                raw.append(str(condition.get("message") or condition.get("reason") or ""))
                break
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                raw.append(str(condition.get("message") or condition.get("reason") or ""))
    for event in _by_time(events, {"FailedScheduling", "Unschedulable"}):
        raw.append(str(event.get("message") or ""))
    seen: dict[str, None] = {}
    for message in raw:
        text = _scheduler_text(message)
        if text:
            seen.setdefault(text, None)
    return list(seen)


def refusals(events: Sequence[KubeObject]) -> list[str]:
    """Why the operator could not create pods (its ``FailedCreate*`` events), newest first."""
    found: dict[str, None] = {}
    for event in _by_time(events, {"FailedCreate", "FailedCreatePod"}):
        text = one_line(str(event.get("message") or "")).removeprefix("Error creating: ")
        if text:
            found.setdefault(text, None)
    return list(found)


# --- the decisions ----------------------------------------------------------------------------


_PRIORITY_REFUSED = re.compile(r"no PriorityClass with name (\S+) was found")
_QUOTA_REFUSED = re.compile(
    r"exceeded quota: (?P<name>[^,]+)(?:, requested: (?P<requested>.*?))?"
    r"(?:, used: (?P<used>.*?))?(?:, limited: (?P<limited>.*))?$"
)
_QUOTA_UNSPECIFIED = re.compile(r"failed quota: (?P<name>[^:]+): must specify (?P<what>.*)$")
_LIMIT_RANGE = re.compile(
    r"(maximum|minimum) \S+ usage per (Container|Pod) is|limit to request ratio per", re.I
)
_SERVICE_ACCOUNT = re.compile(r'serviceaccount "([^"]+)" not found', re.I)
_WEBHOOK = re.compile(r'admission webhook "([^"]+)" denied the request')
_POD_NAME = re.compile(r'^[Pp]ods? "([^"]+)"')


def _pairs(text: str | None) -> dict[str, Decimal]:
    values: dict[str, Decimal] = {}
    for item in (text or "").split(","):
        key, _, value = item.strip().partition("=")
        if key and value:
            try:
                values[key] = parse_quantity(value.strip())
            except ValueError:
                continue
    return values


def _number(value: Decimal) -> str:
    return format(value.normalize(), "f") if value == value.to_integral() else str(value)


def _quota_blocker(
    job: KubeObject, namespace: str, message: str, facts: ClusterFacts | None
) -> Blocker | None:
    unspecified = _QUOTA_UNSPECIFIED.search(message)
    if unspecified:
        name = unspecified.group("name").strip()
        return Blocker(
            AdmissionBlocker.QUOTA,
            f"ResourceQuota {namespace}/{name} requires every pod to set "
            f"{unspecified.group('what').strip()}, and the job's pods do not",
            f"set the replicas' resources (cpu, memory and their limits) in the spec, or change "
            f"ResourceQuota {name}",
            subject=f"ResourceQuota {namespace}/{name}",
            permanent=True,
        )
    refused = _QUOTA_REFUSED.search(message)
    if not refused:
        return None
    name = refused.group("name").strip()
    subject = f"ResourceQuota {namespace}/{name}"
    requested, used = _pairs(refused.group("requested")), _pairs(refused.group("used"))
    limited = _pairs(refused.group("limited"))
    # One pod larger than the quota, or the whole job larger than the quota's hard limits:
    # freeing the namespace up can never make it fit.
    for key, value in requested.items():
        if key in limited and value > limited[key]:
            return Blocker(
                AdmissionBlocker.QUOTA,
                f"{subject} allows {key}={_number(limited[key])} in all, and one pod of the job "
                f"asks for {_number(value)}",
                f"raise {subject} or ask for less per replica",
                subject=subject,
                permanent=True,
            )
    quotas = (facts.quotas or []) if facts is not None else []
    quota = next((q for q in quotas if q["metadata"]["name"] == name), None)
    if quota is not None:
        hard = _quantities((quota.get("spec") or {}).get("hard"))
        for key, limit in sorted(hard.items()):
            need = job_total(job, key)
            if need is not None and need > limit:
                return Blocker(
                    AdmissionBlocker.QUOTA,
                    f"{subject} allows {key}={_number(limit)} in all, and the job needs "
                    f"{key}={_number(need)}",
                    f"raise {subject} to at least {key}={_number(need)}, or ask for less "
                    "(fewer replicas, smaller resources)",
                    subject=subject,
                    permanent=True,
                )
    detail = ", ".join(
        f"{key} {_number(used.get(key, Decimal(0)))} of {_number(limited[key])} used, a pod "
        f"needs {_number(requested[key])} more"
        for key in sorted(requested)
        if key in limited
    )
    return Blocker(
        AdmissionBlocker.QUOTA,
        f"{subject} is used up" + (f": {detail}" if detail else f" ({message})"),
        f"wait for other pods in {namespace} to finish, or raise {subject}",
        subject=subject,
    )


def _refusal_blocker(
    job: KubeObject, namespace: str, message: str, facts: ClusterFacts | None
) -> Blocker:
    pod = _POD_NAME.search(message)
    pod_name = pod.group(1) if pod else ""
    pod_text = f"pod {pod_name}" if pod_name else "a pod"
    pod_subject = f"Pod {namespace}/{pod_name}" if pod_name else ""
    priority = _PRIORITY_REFUSED.search(message)
    if priority:
        name = priority.group(1)
        return _missing_priority_class(name, "priorityClassName of the pods")
    quota = _quota_blocker(job, namespace, message, facts) if "quota" in message else None
    if quota is not None:
        return quota
    if _LIMIT_RANGE.search(message):
        ranges = (facts.limit_ranges or []) if facts is not None else []
        names = sorted(str(lr["metadata"]["name"]) for lr in ranges)
        subject = (
            f"LimitRange {namespace}/{names[0]}"
            if len(names) == 1
            else f"LimitRange in {namespace}" + (f" ({', '.join(names)})" if names else "")
        )
        detail = message.split(" is forbidden: ", 1)[-1].strip("[]")
        return Blocker(
            AdmissionBlocker.LIMIT_RANGE,
            f"{subject} refuses {pod_text}: {detail}",
            f"fit the replicas' resources within {subject} (kubectl describe limitrange -n "
            f"{namespace}), or change it",
            subject=subject,
            permanent=True,
        )
    account = _SERVICE_ACCOUNT.search(message)
    if account:
        subject = f"ServiceAccount {namespace}/{account.group(1)}"
        return Blocker(
            AdmissionBlocker.POD_REFUSED,
            f"the API server refuses {pod_text}: {subject} does not exist",
            f"create {subject} or fix serviceAccountName in the spec",
            subject=subject,
            permanent=True,
        )
    webhook = _WEBHOOK.search(message)
    if webhook:
        subject = f"admission webhook {webhook.group(1)}"
        why = message.split("denied the request", 1)[-1].lstrip(": ")
        return Blocker(
            AdmissionBlocker.POD_REFUSED,
            f"{subject} refuses {pod_text}: {why}",
            f"change the spec to satisfy {subject}, or ask its owner",
            subject=subject,
            permanent=True,
        )
    if " is invalid: " in message or " is forbidden: " in message:
        detail = (
            message.split(" is invalid: ", 1)[-1]
            if " is invalid: " in message
            else (message.split(" is forbidden: ", 1)[-1])
        )
        return Blocker(
            AdmissionBlocker.POD_REFUSED,
            f"the API server refuses {pod_text}: {detail}",
            "fix the pod template in the spec (podTemplate, volumes, resources, env): the API "
            "server refuses the pods as rendered",
            subject=pod_subject,
            permanent=True,
        )
    return Blocker(
        AdmissionBlocker.NOT_CREATED,
        f"the operator could not create {pod_text}: {message}",
        "it retries; if this persists, read the operator's log",
        subject=pod_subject,
    )


def _missing_priority_class(name: str, where: str) -> Blocker:
    return Blocker(
        AdmissionBlocker.PRIORITY_CLASS_NOT_FOUND,
        f'PriorityClass "{name}" does not exist ({where})',
        "create it (kubectl get priorityclasses lists those there are) or name an existing one "
        "in the spec",
        subject=f"PriorityClass {name}",
        permanent=True,
    )


def _queue_blocker(
    job: KubeObject,
    podgroups: Sequence[KubeObject],
    facts: ClusterFacts,
    queue_short: bool,
) -> Blocker | None:
    waiting = _waiting_podgroups(podgroups)
    if podgroups and not waiting:
        return None  # enqueued: the queue let them in
    groups = waiting or [{"metadata": {"name": ""}, "spec": {}}]
    for name in job_queues(job, podgroups):
        if name not in facts.queues:
            continue
        queue = facts.queues[name]
        subject = f"Queue {name}"
        if queue is None:
            return Blocker(
                AdmissionBlocker.QUEUE_NOT_FOUND,
                f'Volcano Queue "{name}" does not exist: nothing admits the job\'s PodGroup',
                "create the queue (kubectl get queues lists those there are) or set gang.queue "
                "to an existing one",
                subject=subject,
                permanent=True,
            )
        state = str((queue.get("status") or {}).get("state") or "Open")
        if state in ("Closed", "Closing"):
            return Blocker(
                AdmissionBlocker.QUEUE_CLOSED,
                f'Volcano Queue "{name}" is {state}: it admits no new jobs',
                "open the queue, or set gang.queue to an open one",
                subject=subject,
                permanent=True,
            )
        capability = _quantities((queue.get("spec") or {}).get("capability"))
        if not capability:
            continue
        group = next((pg for pg in groups if (pg.get("spec") or {}).get("queue") == name), None)
        need = _quantities(((group or {}).get("spec") or {}).get("minResources"))
        if not need:
            need = {
                key: total
                for key in capability
                if (total := job_total(job, f"requests.{key}")) is not None
            }
        for key, limit in sorted(capability.items()):
            if need.get(key, Decimal(0)) > limit:
                return Blocker(
                    AdmissionBlocker.QUEUE_CAPABILITY,
                    f'the job needs {key}={_number(need[key])} but Volcano Queue "{name}" is '
                    f"capped at {key}={_number(limit)} (spec.capability)",
                    f"raise the queue's capability to at least {key}={_number(need[key])}, or "
                    "ask for less (fewer replicas, smaller resources)",
                    subject=subject,
                    permanent=True,
                )
        if queue_short:
            allocated = _quantities((queue.get("status") or {}).get("allocated"))
            for key, limit in sorted(capability.items()):
                taken = allocated.get(key, Decimal(0))
                if key in need and taken + need[key] > limit:
                    return Blocker(
                        AdmissionBlocker.QUEUE_CAPABILITY,
                        f'Volcano Queue "{name}" is at its capability: {key} '
                        f"{_number(taken)} of {_number(limit)} allocated, the job needs "
                        f"{_number(need[key])}",
                        "wait for the queue's other jobs to finish, or raise its capability",
                        subject=subject,
                    )
    return None


def _claims_blocker(job: KubeObject, namespace: str, facts: ClusterFacts) -> Blocker | None:
    for name in needed_claims(job):
        if name in facts.claims and facts.claims[name] is None:
            return _missing_claim(namespace, name)
    return None


def _missing_claim(namespace: str, name: str) -> Blocker:
    return Blocker(
        AdmissionBlocker.PVC_NOT_FOUND,
        f'PersistentVolumeClaim "{name}" does not exist in namespace {namespace}',
        f"create the claim in {namespace}, or fix the volume's pvc in the spec",
        subject=f"PersistentVolumeClaim {namespace}/{name}",
        permanent=True,
    )


def _unbound_claims(job: KubeObject, namespace: str, facts: ClusterFacts | None) -> Blocker:
    pending = [
        (name, claim)
        for name in needed_claims(job)
        if facts is not None
        and (claim := facts.claims.get(name)) is not None
        and (claim.get("status") or {}).get("phase") != "Bound"
    ]
    if not pending:
        return Blocker(
            AdmissionBlocker.UNBOUND_PVC,
            "a PersistentVolumeClaim of the pods is not bound",
            "check the claims' storage class and provisioner (kubectl describe pvc)",
        )
    name, claim = pending[0]
    phase = (claim.get("status") or {}).get("phase") or "Pending"
    storage_class = (claim.get("spec") or {}).get("storageClassName")
    where = f'storage class "{storage_class}"' if storage_class else "no storage class"
    return Blocker(
        AdmissionBlocker.UNBOUND_PVC,
        f'PersistentVolumeClaim "{name}" is {phase}, not bound ({where})',
        f"it binds once a volume is provisioned for it: check its storage class and provisioner "
        f"(kubectl describe pvc {name} -n {namespace})",
        subject=f"PersistentVolumeClaim {namespace}/{name}",
    )


# Taints the node lifecycle sets and clears by itself (not ready, unreachable, pressure,
# cordoned, being deleted by the autoscaler): waiting may help.
_LIFECYCLE_TAINT = re.compile(
    r"^(node\.kubernetes\.io/|node\.cloudprovider\.kubernetes\.io/|ToBeDeletedByClusterAutoscaler"
    r"|DeletionCandidateOfClusterAutoscaler)"
)


def _matches_expression(value: str | None, present: bool, expression: KubeObject) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            number, bound = int(str(value)), int(values[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def node_matches(node: KubeObject, placement: Placement) -> bool:
    """Whether ``node`` has the labels (and fields) ``placement`` requires."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if any(labels.get(k) != v for k, v in placement.node_selector.items()):
        return False
    if not placement.node_terms:
        return True
    fields = {"metadata.name": metadata.get("name")}
    for term in placement.node_terms:
        expressions = term.get("matchExpressions") or []
        matched = all(
            _matches_expression(labels.get(e.get("key")), e.get("key") in labels, e)
            for e in expressions
        ) and all(
            _matches_expression(fields.get(e.get("key")), e.get("key") in fields, e)
            for e in term.get("matchFields") or []
        )
        if matched and (expressions or term.get("matchFields")):
            return True
    return False


def tolerates(tolerations: Iterable[KubeObject], taint: KubeObject) -> bool:
    """Whether one of ``tolerations`` tolerates ``taint`` (Kubernetes' matching rules)."""
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        operator = toleration.get("operator") or "Equal"
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or str(toleration.get("value") or "") == str(
            taint.get("value") or ""
        ):
            return True
    return False


def blocking_taints(node: KubeObject, tolerations: Sequence[KubeObject]) -> list[KubeObject]:
    """The taints of ``node`` that keep pods with ``tolerations`` off it (a cordon counts)."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    return [
        t
        for t in taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)
    ]


def _taint_text(taint: KubeObject) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _placement_blocker(
    job: KubeObject, pods: Sequence[KubeObject], facts: ClusterFacts, scaling_up: bool
) -> Blocker | None:
    nodes = facts.nodes
    if not nodes:
        return None  # not read, or a cluster without nodes (yet): nothing to decide on
    for placement in placements(job, pods):
        candidates = [n for n in nodes if node_matches(n, placement)]
        if not candidates:
            return Blocker(
                AdmissionBlocker.NO_MATCHING_NODE,
                f"no node matches the {placement.describe()} of the {placement.role} pods "
                f"(0 of {len(nodes)} nodes)",
                "fix nodeSelector/affinity in the spec (kubectl get nodes --show-labels), or add "
                "nodes with those labels",
                subject=f"{placement.describe()} ({placement.role})",
                permanent=not scaling_up,
            )
        blocked = [(n, blocking_taints(n, placement.tolerations)) for n in candidates]
        if any(not taints for _, taints in blocked):
            continue
        deliberate = [
            (n, [t for t in taints if not _LIFECYCLE_TAINT.match(str(t.get("key") or ""))])
            for n, taints in blocked
        ]
        permanent = all(taints for _, taints in deliberate) and not scaling_up
        node, taints = next(((n, t) for n, t in deliberate if t), blocked[0])
        shown = ", ".join(sorted({_taint_text(t) for t in taints}))
        names = ", ".join(sorted(str(n["metadata"]["name"]) for n, _ in blocked)[:5])
        return Blocker(
            AdmissionBlocker.UNTOLERATED_TAINT,
            f"every node the {placement.role} pods may use has a taint they do not tolerate: "
            f"{shown} ({names})",
            f"add a toleration for {shown} to the spec (tolerations), or target other nodes"
            if permanent
            else "the nodes are cordoned, not ready or under pressure; wait, or add a toleration",
            subject=f"taint {shown} on node {node['metadata']['name']}",
            permanent=permanent,
        )
    return None


def _created_at(job: KubeObject) -> float | None:
    stamp = (job.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return None
    try:
        return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _operator(job: KubeObject) -> tuple[str, str]:
    """The operator a job waits for, and how to check it."""
    group = str(job.get("apiVersion") or "").partition("/")[0]
    kind = str(job.get("kind") or "the job's kind")
    if group == "kubeflow.org":
        managed_by = ((job.get("spec") or {}).get("runPolicy") or {}).get("managedBy")
        if managed_by and managed_by != "kubeflow.org/training-operator":
            return (
                f"{managed_by} (its runPolicy.managedBy)",
                f"check that the controller {managed_by} runs; the Kubeflow training operator "
                "leaves jobs managed by another controller alone",
            )
        return (
            "the Kubeflow training operator",
            f"check that it runs with {kind.lower()} enabled (--enable-scheme): kubectl get pods "
            "-A | grep training-operator, then read its log",
        )
    return (
        "the KubeDL operator",
        f"check that it runs with {kind} in its --workloads: kubectl get pods -A | grep kubedl, "
        "then read its log",
    )


def _operator_blocker(
    job: KubeObject,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject],
    events: Sequence[KubeObject],
    now: float | None,
    grace_s: float,
) -> Blocker | None:
    if now is None or job.get("status") or pods or podgroups or events:
        return None  # something acted on it
    created = _created_at(job)
    if created is None:
        return None
    age = now - created
    if age < grace_s:
        return Blocker(
            AdmissionBlocker.NOT_CREATED,
            "the operator has not acted on the job yet",
            "wait a moment",
            recheck_in_s=max(grace_s - age, 0.05),
        )
    operator, how = _operator(job)
    metadata = job.get("metadata") or {}
    name = f"{job.get('kind')} {metadata.get('namespace')}/{metadata.get('name')}"
    return Blocker(
        AdmissionBlocker.OPERATOR_NOT_RUNNING,
        f"no operator has acted on {name} for {age:.0f}s (no status, pods or PodGroups): is "
        f"{operator} running?",
        how,
        subject=operator,
    )


def fact_request(
    job: KubeObject,
    *,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject] = (),
    events: Sequence[KubeObject] = (),
) -> FactRequest:
    """Which cluster objects :func:`find_blocker` needs for this job now."""
    messages = scheduling_messages(pods, podgroups, events)
    placement = sorted(m for m in messages if _PLACEMENT_WORDS.search(m))
    refused = refusals(events)
    queues = job_queues(job, podgroups) if (not podgroups or _waiting_podgroups(podgroups)) else []
    return FactRequest(
        queues=tuple(queues),
        priority_classes=tuple(name for name, _ in needed_priority_classes(job, podgroups)),
        claims=tuple(needed_claims(job)),
        nodes=" | ".join(placement) or None,
        quotas=next((m for m in refused if "exceeded quota" in m), None),
        limit_ranges=next((m for m in refused if _LIMIT_RANGE.search(m)), None),
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
        grace_s: The operator grace (default :data:`OPERATOR_GRACE_S`).
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

    # 1. Pods the API server refuses: nothing else matters until they can be created.
    if len(pods) < expected:
        refused = refusals(events)
        if refused:
            refusal = _refusal_blocker(job, namespace, refused[0], facts)
            if refusal.permanent or refusal.category is not AdmissionBlocker.NOT_CREATED:
                return refusal
    # 2. Objects the job names that do not exist (or never admit it).
    if facts is not None:
        for name, where in needed_priority_classes(job, podgroups):
            if name in facts.priority_classes and facts.priority_classes[name] is None:
                return _missing_priority_class(name, where)
        queue_short = any(_QUEUE_SHORT.search(m) for m in messages)
        found = _queue_blocker(job, podgroups, facts, queue_short)
        found = found or _claims_blocker(job, namespace, facts)
        # 3. Nodes that can never take the pods.
        found = found or _placement_blocker(job, pods, facts, scaling_up)
        if found is not None:
            return found
    # 4. The schedulers' own words, the most specific first.
    specific = [(classify_reason(m), m) for m in messages]
    specific = [(b, m) for b, m in specific if b is not AdmissionBlocker.WAITING]
    if specific:
        order = [blocker for _, blocker in _SCHEDULER_PATTERNS]
        blocker, message = min(specific, key=lambda item: order.index(item[0]))
        return _from_scheduler(job, namespace, blocker, message, facts)
    # 5. Nothing said why: pending pods, a gang not enqueued, or no operator at all.
    found = _operator_blocker(
        job, pods, podgroups, events, now, OPERATOR_GRACE_S if grace_s is None else grace_s
    )
    if found is not None and found.category is AdmissionBlocker.OPERATOR_NOT_RUNNING:
        return found
    recheck = found.recheck_in_s if found is not None else None
    waiting = _waiting_podgroups(podgroups)
    if len(pods) < expected:
        if waiting:
            return _not_enqueued(waiting, recheck)
        refused = refusals(events)
        if refused:
            return _refusal_blocker(job, namespace, refused[0], facts)
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


def _scheduler_name(job: KubeObject, pods: Sequence[KubeObject]) -> str:
    for pod in pods:
        name = (pod.get("spec") or {}).get("schedulerName")
        if name and name != "default-scheduler":
            return str(name)
    for pod_spec in _template_specs(job):
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
            return _missing_claim(namespace, name)
        blocker = AdmissionBlocker.UNBOUND_PVC
    if blocker is AdmissionBlocker.UNBOUND_PVC:
        found = _unbound_claims(job, namespace, facts)
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


_OPERATORS = {"kubedl": "the KubeDL operator", "kubeflow": "the Kubeflow training operator"}
"""The operator of each dialect, in words."""


def operator_not_installed(
    kind: ResourceKind, dialect: str, server: str, served_elsewhere: Sequence[tuple[str, str]]
) -> Blocker:
    """The permanent blocker of a job whose kind the cluster does not serve (its CRD is missing).

    Args:
        kind: The job's :class:`~kubedl_prefect.kube.resources.ResourceKind`.
        dialect: The dialect it was rendered for.
        server: The API server's URL.
        served_elsewhere: ``(dialect, apiVersion)`` of other dialects whose kind is served.

    Example:
        >>> from kubedl_prefect.kube.resources import ResourceKind
        >>> kind = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")
        >>> operator_not_installed(kind, "kubedl", "https://k", [("kubeflow", "kubeflow.org/v1")]
        ...                        ).hint
        'install the KubeDL operator, or submit with dialect="kubeflow": the cluster serves \
PyTorchJob of kubeflow.org/v1'
    """
    operator = _OPERATORS.get(dialect, f"the operator of {kind.group}")
    crd = f"{kind.plural}.{kind.group}"
    if served_elsewhere:
        other, api_version = served_elsewhere[0]
        hint = (
            f'install {operator}, or submit with dialect="{other}": the '
            f"cluster serves {kind.kind} of {api_version}"
        )
    else:
        hint = (
            f"install {operator} (docs/operators.md), or the operator of "
            "another dialect, in this cluster"
        )
    return Blocker(
        AdmissionBlocker.OPERATOR_NOT_INSTALLED,
        f"{kind.kind} ({kind.api_version}) is not served by {server}: the CRD {crd} of "
        f"{operator} is not installed",
        hint,
        subject=f"CustomResourceDefinition {crd}",
        permanent=True,
    )
