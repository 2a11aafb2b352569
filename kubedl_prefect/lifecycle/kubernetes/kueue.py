"""Why Kueue has not admitted a job, and whether it ever will; and whether it requeued it. Pure.

A job labelled with a Kueue LocalQueue (``kueue.x-k8s.io/queue-name``, see
:mod:`kubedl_prefect.spec.kueue`) is created suspended, and Kueue makes a ``Workload`` for it,
labelled ``kueue.x-k8s.io/job-uid`` with the job's uid. Kueue reserves quota for the Workload in
the LocalQueue's ClusterQueue and resumes the job, or says why not in the Workload's
``QuotaReserved`` condition (``status: False``). It may later evict an admitted job (``Evicted``:
``Preempted``, ``PodsReadyTimeout``, ``NodeFailures``...), suspend it, and queue the *same* job
again (``Requeued``).

:func:`kueue_blocker` names the cause as a :class:`~kubedl_prefect.lifecycle.admission.Blocker`
with the object it names, one line with Kueue's own numbers, a fix, and the decision:

- **wait** — quota in use by other workloads (``InsufficientQuota``: "2 more nvidia.com/gpu
  needed in flavor gpu-a"), waiting for preempted workloads to leave (``WaitingForPreemption``),
  not evaluated yet, admission checks pending, a requeued job's backoff (``Requeued``), and a job
  Kueue has not made a Workload for yet (``OperatorNotRunning`` after a grace);
- **fail at once** — the LocalQueue or its ClusterQueue does not exist (``QueueNotFound``), one
  of them is stopped (``QueueClosed``), the ClusterQueue cannot admit anything
  (``QueueMisconfigured``: a missing ResourceFlavor or AdmissionCheck), the job asks for more than
  any quota the queue can reach, borrowing included (``QueueCapabilityExceeded``), no flavor of
  the ClusterQueue fits the pods or covers a resource they ask for (``NoMatchingFlavor``), and a
  Workload Kueue deactivated: requeued too often (``RequeuingLimitExceeded``) or otherwise
  (``WorkloadDeactivated``).

Kueue v0.19 names most causes in the condition's *reason* only with its
``UnadmittedWorkloadsObservability`` feature gate on (off by default); otherwise the reason is
``Pending`` or ``Inadmissible`` and the cause is in the message. Both are read: the message
first (it has the numbers), the reason when the message says nothing known. The message formats
are those of Kueue v0.19.2 (``pkg/scheduler/flavorassigner/flavorassigner.go``,
``pkg/controller/core/workload_controller.go``).

:func:`queue_hold` reads what the Workload says of the job's admission for the phase decision
(:func:`kubedl_prefect.lifecycle.status.queued_status`): an evicted, requeued job is waiting, not
failed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState, Blocker
from kubedl_prefect.lifecycle.kubernetes.cluster import FactRequest
from kubedl_prefect.lifecycle.status import QueueHold
from kubedl_prefect.spec.kueue import JOB_UID_LABEL, QUEUE_LABEL, suspend_field
from kubedl_prefect.spec.quantity import parse_quantity

__all__ = [
    "KUEUE_GRACE_S",
    "admitted_by",
    "admitting_queue",
    "cohort_borrowing",
    "job_workload",
    "kueue_blocker",
    "kueue_queue",
    "kueue_request",
    "queue_hold",
    "suspended",
]

KUEUE_GRACE_S = 30.0
"""How long a queued job may have no Workload before the wait says Kueue does not act on it."""

B = AdmissionBlocker

_UNUSED = re.compile(
    r"insufficient unused quota for (?P<resource>\S+) in flavor (?P<flavor>[^,\s]+), "
    r"(?P<more>\S+) more needed"
)
_ABOVE_MAX = re.compile(
    r"insufficient quota for (?P<resource>\S+) in flavor (?P<flavor>[^,\s]+), "
    r"(?:previously considered podsets requests \((?P<before>[^)]*)\) \+ current podset "
    r"request \((?P<request>[^)]*)\)|request) > maximum capacity \((?P<max>[^)]*)\)"
)
_TAINT = re.compile(r"untolerated taint (?P<taint>.+?) in flavor (?P<flavor>[^,\s]+)")
_AFFINITY = re.compile(r"flavor (?P<flavor>[^,\s]+) doesn't match node affinity")
_NOT_COVERED = re.compile(r"resource (?P<resource>\S+) unavailable in ClusterQueue")
_FLAVOR_MISSING = re.compile(r"flavor (?P<flavor>[^,\s]+) not found")
_POD_SET = re.compile(r"(?:couldn't|failed to) assign flavors to pod set (?P<name>[^:]+): ")
_PREEMPTING = re.compile(r"Pending the preemption of (?P<count>\d+) workload\(s\)")
_QUEUE_WORDS = re.compile(
    r"(?P<kind>LocalQueue|ClusterQueue) (?P<name>\S+) (?P<state>doesn't exist|is terminating or "
    r"missing|is stopped|is inactive)"
)
_EVICTIONS = frozenset(
    {
        "Preempted",
        "PodsReadyTimeout",
        "AdmissionCheck",
        "ClusterQueueStopped",
        "LocalQueueStopped",
        "NodeFailures",
        "FlavorMigration",
        "EvictedOnManagerCluster",
    }
)
"""Kueue's reasons for evicting an admitted Workload that it queues again afterwards."""


def kueue_queue(job: KubeObject) -> str | None:
    """The LocalQueue the job is labelled for, or ``None`` when Kueue does not manage it."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    name = labels.get(QUEUE_LABEL)
    return str(name) if name else None


def kueue_request(job: KubeObject) -> FactRequest | None:
    """What a wait reads to tell Kueue's view of the job: its LocalQueue and its Workloads.

    ``None`` for a job Kueue does not manage. The Workloads are read again each time the job
    changes (Kueue suspends and resumes it as it admits, evicts and admits it again).
    """
    local = kueue_queue(job)
    if local is None:
        return None
    metadata = job.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    version = str(metadata.get("resourceVersion") or "")
    return FactRequest(local_queues=(local,), workloads=(uid, version) if uid else None)


def suspended(job: KubeObject) -> bool:
    """Whether the job object asks to be suspended (``runPolicy.suspend``, ``spec.suspend``)."""
    path = suspend_field(job)
    node: object = job
    for key in path or ():
        node = node.get(key) if isinstance(node, dict) else None
    return node is True


def job_workload(job: KubeObject, workloads: Sequence[KubeObject]) -> KubeObject | None:
    """The job's Workload among ``workloads``: labelled with its uid, and not being deleted."""
    uid = (job.get("metadata") or {}).get("uid")
    if not uid:
        return None
    for workload in workloads:
        metadata = workload.get("metadata") or {}
        if (metadata.get("labels") or {}).get(JOB_UID_LABEL) == uid and not metadata.get(
            "deletionTimestamp"
        ):
            return workload
    return None


def _condition(workload: KubeObject, kind: str) -> KubeObject | None:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _is_true(workload: KubeObject, kind: str) -> bool:
    condition = _condition(workload, kind)
    return condition is not None and condition.get("status") == "True"


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _requeues(workload: KubeObject) -> int:
    """How often Kueue evicted (and requeued) the Workload.

    Kueue v0.19.2 counts every eviction in ``status.schedulingStats.evictions`` (by reason);
    ``requeueState.count`` counts only the back-offs of ``waitForPodsReady`` (a preempted
    Workload has none).
    """
    status = workload.get("status") or {}
    evictions = (status.get("schedulingStats") or {}).get("evictions") or []
    counted = sum(_count(e.get("count")) for e in evictions if isinstance(e, dict))
    return max(counted, _count((status.get("requeueState") or {}).get("count")))


def _preemption(workload: KubeObject, eviction: str) -> str:
    """Why Kueue preempted the Workload (``InClusterQueue``...), for a ``Preempted`` eviction.

    Kueue v0.19.2 sets the ``Preempted`` condition beside ``Evicted`` and resets it to False,
    reason ``QuotaReserved``, when it admits the Workload again: only a True one says why.
    """
    if eviction != "Preempted":
        return ""
    preempted = _condition(workload, "Preempted")
    if preempted is None or preempted.get("status") != "True":
        return ""
    return str(preempted.get("reason") or "")


def _deactivated(workload: KubeObject) -> bool:
    return (workload.get("spec") or {}).get("active") is False


def queue_hold(job: KubeObject, workload: KubeObject | None) -> QueueHold | None:
    """What Kueue says of the job's admission now; ``None`` for a job Kueue does not manage.

    Admitted: the Workload's ``Admitted`` condition is True and it is not evicted. Requeued:
    the Workload was evicted for a reason after which Kueue queues it again (``Evicted`` True,
    or ``Requeued`` naming an eviction, while not admitted); a deactivated Workload is not
    requeued (:func:`kueue_blocker` fails the job). Without a Workload (not made yet, or not
    read) a suspended job is queued, and a running one is taken as admitted.
    """
    if kueue_queue(job) is None:
        return None
    if workload is None:
        return QueueHold(admitted=not suspended(job), reason="Queued" if suspended(job) else "")
    evicted = _condition(workload, "Evicted")
    is_evicted = evicted is not None and evicted.get("status") == "True"
    admitted = _is_true(workload, "Admitted") and not is_evicted
    requeues = _requeues(workload)
    if admitted or _deactivated(workload):
        return QueueHold(admitted=admitted, requeues=requeues)
    if is_evicted and evicted is not None:
        reason = str(evicted.get("reason") or "Evicted")
        if not reason.startswith("Deactivated"):
            return QueueHold(
                False,
                True,
                reason,
                str(evicted.get("message") or ""),
                requeues=requeues,
                preemption=_preemption(workload, reason),
            )
    requeued = _condition(workload, "Requeued")
    if requeued is not None and str(requeued.get("reason") or "") in _EVICTIONS:
        reason = str(requeued.get("reason"))
        return QueueHold(
            False,
            True,
            reason,
            str(requeued.get("message") or ""),
            requeues=requeues,
            preemption=_preemption(workload, reason),
        )
    waiting = _condition(workload, "QuotaReserved") or {}
    return QueueHold(
        False,
        reason=str(waiting.get("reason") or "Queued"),
        message=str(waiting.get("message") or ""),
        requeues=requeues,
    )


@dataclass(frozen=True)
class _Queues:
    namespace: str
    local: str
    local_queue: KubeObject | None
    local_known: bool
    cluster: str
    cluster_queue: KubeObject | None
    cluster_known: bool

    @property
    def local_subject(self) -> str:
        return f"LocalQueue {self.namespace}/{self.local}"

    @property
    def cluster_subject(self) -> str:
        return f"ClusterQueue {self.cluster}" if self.cluster else self.local_subject

    @property
    def where(self) -> str:
        """``ClusterQueue cq`` (of LocalQueue ns/q), or the LocalQueue alone."""
        if self.cluster:
            return f"ClusterQueue {self.cluster} (LocalQueue {self.namespace}/{self.local})"
        return self.local_subject


def kueue_blocker(
    job: KubeObject,
    *,
    workload: KubeObject | None,
    workloads_read: bool,
    local_queues: Mapping[str, KubeObject | None],
    cluster_queues: Mapping[str, KubeObject | None],
    now: float | None = None,
    grace_s: float = KUEUE_GRACE_S,
) -> Blocker | None:
    """Why Kueue holds ``job`` back, and whether it ever stops; ``None`` when it does not.

    ``None`` for a job Kueue does not manage (no queue label) and for one it has admitted
    (what holds its pods back then is the scheduler's, see :mod:`.blockers`).

    Args:
        job: The training job.
        workload: Its Workload (:func:`job_workload`), or ``None`` when it has none.
        workloads_read: Whether the Workloads were read at all (when not, ``None`` says
            nothing).
        local_queues: LocalQueue name to the object (``None``: it does not exist); a queue that
            was not read is absent.
        cluster_queues: ClusterQueue name to the object, likewise.
        now: The time (Unix seconds), for the grace of a job without a Workload.
        grace_s: How long Kueue may take to make the Workload.

    Example:
        >>> job = {"kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1",
        ...        "metadata": {"name": "mnist", "namespace": "ml", "uid": "u1",
        ...                     "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        ...        "spec": {"runPolicy": {"suspend": True}}}
        >>> workload = {"metadata": {"name": "pytorchjob-mnist-1"}, "status": {"conditions": [
        ...     {"type": "QuotaReserved", "status": "False", "reason": "Pending",
        ...      "message": "couldn't assign flavors to pod set worker: insufficient unused "
        ...                 "quota for nvidia.com/gpu in flavor gpu-a, 2 more needed"}]}}
        >>> blocker = kueue_blocker(job, workload=workload, workloads_read=True,
        ...     local_queues={"team-a": {"spec": {"clusterQueue": "gpu"}}}, cluster_queues={})
        >>> blocker.category, blocker.permanent
        (<AdmissionBlocker.INSUFFICIENT_QUOTA: 'InsufficientQuota'>, False)
        >>> blocker.message
        'ClusterQueue gpu (LocalQueue ml/team-a) has no room yet: 2 more nvidia.com/gpu \
needed in flavor gpu-a (pod set worker)'
    """
    local = kueue_queue(job)
    if local is None:
        return None
    metadata = job.get("metadata") or {}
    namespace = str(metadata.get("namespace") or "")
    queues = _queues(namespace, local, workload, local_queues, cluster_queues)
    hold = queue_hold(job, workload)
    if workload is not None and _deactivated(workload):
        return _deactivated_blocker(workload, queues)
    if hold is not None and hold.admitted:
        return None
    found = _queue_objects_blocker(queues)
    if found is not None:
        return found
    if workload is None:
        return _no_workload(job, queues, workloads_read, now, grace_s)
    found = _waiting_blocker(workload, queues)
    if hold is not None and hold.requeued:
        return _requeued(found, hold, workload, queues)
    return found


def _queues(
    namespace: str,
    local: str,
    workload: KubeObject | None,
    local_queues: Mapping[str, KubeObject | None],
    cluster_queues: Mapping[str, KubeObject | None],
) -> _Queues:
    local_queue = local_queues.get(local)
    cluster = str(((local_queue or {}).get("spec") or {}).get("clusterQueue") or "")
    if not cluster and workload is not None:
        admission = (workload.get("status") or {}).get("admission") or {}
        cluster = str(admission.get("clusterQueue") or "")
    return _Queues(
        namespace=namespace,
        local=local,
        local_queue=local_queue,
        local_known=local in local_queues,
        cluster=cluster,
        cluster_queue=cluster_queues.get(cluster),
        cluster_known=bool(cluster) and cluster in cluster_queues,
    )


def _stop_policy(queue: KubeObject | None) -> str:
    return str(((queue or {}).get("spec") or {}).get("stopPolicy") or "None")


def _queue_objects_blocker(queues: _Queues) -> Blocker | None:
    """What the LocalQueue and ClusterQueue objects themselves say: missing, stopped, inactive."""
    if queues.local_known and queues.local_queue is None:
        return _missing_local_queue(queues)
    if queues.local_queue is not None and _stop_policy(queues.local_queue) != "None":
        return _stopped(queues.local_subject, _stop_policy(queues.local_queue), "LocalQueue")
    if queues.cluster_known and queues.cluster_queue is None:
        return _missing_cluster_queue(queues)
    cluster_queue = queues.cluster_queue
    if cluster_queue is not None:
        if _stop_policy(cluster_queue) != "None":
            return _stopped(queues.cluster_subject, _stop_policy(cluster_queue), "ClusterQueue")
        active = _condition(cluster_queue, "Active")
        if active is not None and active.get("status") == "False":
            reason = str(active.get("reason") or "Inactive")
            message = str(active.get("message") or "it cannot admit new workloads")
            return Blocker(
                B.QUEUE_MISCONFIGURED,
                f"{queues.cluster_subject} is inactive ({reason}): {message}",
                f"fix {queues.cluster_subject} (kubectl describe clusterqueue {queues.cluster}):"
                " create the ResourceFlavors and AdmissionChecks it names, or ask its owner",
                subject=queues.cluster_subject,
                permanent=True,
            )
    return None


def _missing_local_queue(queues: _Queues) -> Blocker:
    return Blocker(
        B.QUEUE_NOT_FOUND,
        f'Kueue LocalQueue "{queues.local}" does not exist in namespace {queues.namespace}: '
        "nothing admits the job",
        f"create it, or set kueue.queue to an existing one (kubectl get localqueues -n "
        f"{queues.namespace})",
        subject=queues.local_subject,
        permanent=True,
    )


def _missing_cluster_queue(queues: _Queues) -> Blocker:
    return Blocker(
        B.QUEUE_NOT_FOUND,
        f'Kueue ClusterQueue "{queues.cluster}" of LocalQueue {queues.namespace}/{queues.local} '
        "does not exist: nothing admits the job",
        f"create ClusterQueue {queues.cluster}, or point LocalQueue {queues.local} at an "
        "existing one (kubectl get clusterqueues)",
        subject=queues.cluster_subject,
        permanent=True,
    )


def _stopped(subject: str, policy: str, kind: str) -> Blocker:
    return Blocker(
        B.QUEUE_CLOSED,
        f"Kueue {subject} is stopped (stopPolicy {policy}): it admits no workloads",
        f"ask its owner to restart it (spec.stopPolicy: None), or set kueue.queue to a "
        f"LocalQueue {'' if kind == 'LocalQueue' else 'of a ClusterQueue '}that runs",
        subject=subject,
        permanent=True,
    )


def _no_workload(
    job: KubeObject, queues: _Queues, read: bool, now: float | None, grace_s: float
) -> Blocker:
    waiting = Blocker(
        B.WAITING,
        f"suspended until Kueue admits it from {queues.local_subject}",
        f"check the Workload Kueue made for it (kubectl get workloads -n {queues.namespace})",
        subject=queues.local_subject,
    )
    created = _created_at(job)
    if not read or now is None or created is None:
        return waiting
    age = now - created
    if age < grace_s:
        return Blocker(
            B.WAITING,
            f"suspended until Kueue admits it from {queues.local_subject} (no Workload yet)",
            "wait a moment: Kueue makes a Workload for the job",
            subject=queues.local_subject,
            recheck_in_s=max(grace_s - age, 0.05),
        )
    group = str(job.get("apiVersion") or "").rpartition("/")[0]
    framework = f"{group}/{str(job.get('kind') or '').lower()}"
    name = f"{job.get('kind')} {queues.namespace}/{(job.get('metadata') or {}).get('name')}"
    return Blocker(
        B.OPERATOR_NOT_RUNNING,
        f"Kueue has made no Workload for {name} in {age:.0f}s: is Kueue running, with "
        f"{framework} among its integrations.frameworks?",
        "check Kueue's controller (kubectl -n kueue-system get pods) and its configuration; "
        "without Kueue the job stays suspended: remove kueue from the spec to run it unqueued",
        subject="Kueue",
    )


def _created_at(job: KubeObject) -> float | None:
    stamp = (job.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _number(text: str) -> str:
    """Kueue's quantity as it wrote it (``500m``, ``2``, ``16Gi``)."""
    return text.strip()


def _sum(first: str | None, second: str | None) -> str | None:
    try:
        total: Decimal = parse_quantity((first or "0").strip()) + parse_quantity(
            (second or "0").strip()
        )
    except ValueError:
        return None
    return format(total.normalize(), "f")


def _pod_sets(message: str) -> list[tuple[str, str]]:
    """``(pod set, its reasons)`` of a flavor-assignment message (``""`` pod set: unknown)."""
    found = list(_POD_SET.finditer(message))
    if not found:
        return [("", message)]
    parts = []
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(message)
        parts.append((match.group("name").strip(), message[match.end() : end].rstrip("; ")))
    return parts


def _waiting_blocker(workload: KubeObject, queues: _Queues) -> Blocker:
    """What the Workload's conditions say holds it back (it is not admitted)."""
    reserved = _condition(workload, "QuotaReserved") or {}
    if reserved.get("status") == "True":
        return _admission_checks(workload, queues)
    reason = str(reserved.get("reason") or "")
    message = str(reserved.get("message") or "")
    named = _QUEUE_WORDS.search(message)
    if named is not None:
        return _named_queue(named, queues)
    found = _flavor_blocker(message, queues) if message else None
    preempting = _PREEMPTING.search(message)
    if preempting is not None or reason == "WaitingForPreemptedWorkloads":
        count = f" {preempting.group('count')} workload(s)" if preempting else " workloads"
        need = f": {found.message.split(': ', 1)[-1]}" if found is not None else ""
        return Blocker(
            B.WAITING_FOR_PREEMPTION,
            f"{queues.where} is preempting{count} to make room for the job{need}",
            "wait: Kueue admits the job once the preempted workloads have stopped",
            subject=queues.cluster_subject,
        )
    if found is not None:
        return found
    return _by_reason(reason, message, queues)


def _named_queue(named: re.Match[str], queues: _Queues) -> Blocker:
    kind, name, state = named.group("kind"), named.group("name"), named.group("state")
    if kind == "LocalQueue":
        subject = f"LocalQueue {queues.namespace}/{name}"
    else:
        subject = f"ClusterQueue {name}"
    if state in ("doesn't exist", "is terminating or missing"):
        if kind == "LocalQueue":
            return _missing_local_queue(queues)
        return _missing_cluster_queue(
            _Queues(queues.namespace, queues.local, None, False, name, None, True)
        )
    if state == "is stopped":
        return _stopped(subject, "Hold", kind)
    return Blocker(
        B.QUEUE_MISCONFIGURED,
        f"Kueue {subject} is inactive: it admits no workloads",
        f"kubectl describe {kind.lower()} {name} says why (a missing ResourceFlavor or "
        "AdmissionCheck, or stopped); fix it or set kueue.queue to another LocalQueue",
        subject=subject,
        permanent=True,
    )


def _flavor_blocker(message: str, queues: _Queues) -> Blocker | None:
    """The blocker of a flavor-assignment message; permanent only when nothing there may pass."""
    # Kueue counts a shortfall over the pod sets assigned so far: per resource and flavor, the
    # last pod set's number is the job's ("2 more" for the master, "4 more" with the worker).
    short: dict[tuple[str, str], tuple[str, list[str]]] = {}
    above: list[str] = []
    unfit: list[str] = []
    unknown = False
    for pod_set, reasons in _pod_sets(message):
        where = f" (pod set {pod_set})" if pod_set else ""
        matched = False
        for found in _UNUSED.finditer(reasons):
            matched = True
            key = (found.group("resource"), found.group("flavor"))
            sets = short.get(key, ("", []))[1]
            short[key] = (_number(found.group("more")), [*sets, *([pod_set] if pod_set else [])])
        for found in _ABOVE_MAX.finditer(reasons):
            matched = True
            need = (
                _sum(found.group("before"), found.group("request"))
                if found.group("request") is not None
                else None
            )
            asks = f"the job needs {need}" if need is not None else "the job needs more"
            above.append(
                f"{asks} {found.group('resource')} in flavor {found.group('flavor')}{where}, "
                f"at most {_number(found.group('max'))} can ever be reserved"
            )
        for found in _TAINT.finditer(reasons):
            matched = True
            unfit.append(
                f"flavor {found.group('flavor')} has the untolerated taint {found.group('taint')}"
                f"{where}"
            )
        for found in _AFFINITY.finditer(reasons):
            matched = True
            unfit.append(
                f"flavor {found.group('flavor')} does not match the pods' node selector or "
                f"affinity{where}"
            )
        for found in _NOT_COVERED.finditer(reasons):
            matched = True
            unfit.append(
                f"{queues.cluster_subject} has no quota for {found.group('resource')} in any "
                f"flavor{where}"
            )
        for found in _FLAVOR_MISSING.finditer(reasons):
            matched = True
            unfit.append(f"flavor {found.group('flavor')} does not exist{where}")
        unknown = unknown or not matched
    subject = queues.cluster_subject
    if short:
        needed = [
            f"{more} more {resource} needed in flavor {flavor}{_pod_set_words(sets)}"
            for (resource, flavor), (more, sets) in short.items()
        ]
        return Blocker(
            B.INSUFFICIENT_QUOTA,
            f"{queues.where} has no room yet: {'; '.join(needed)}",
            f"it is admitted when workloads using {subject} (or its cohort) finish or are "
            "preempted; raise its nominalQuota, or give the job a WorkloadPriorityClass that "
            "may preempt (kueue.priorityClass)",
            subject=subject,
        )
    if unknown:
        return None
    if above:
        return Blocker(
            B.QUEUE_CAPABILITY,
            f"{queues.where} can never admit the job: {'; '.join(above)} (its quota plus what "
            "it may borrow)",
            f"ask for less (fewer replicas, smaller resources), or raise {subject}'s "
            "nominalQuota or borrowingLimit",
            subject=subject,
            permanent=True,
        )
    if unfit:
        return Blocker(
            B.NO_MATCHING_FLAVOR,
            f"no ResourceFlavor of {queues.where} fits the job: {'; '.join(unfit)}",
            "fix the pods' nodeSelector, affinity or tolerations in the spec to match a flavor "
            "(kubectl get resourceflavors -o yaml), or set kueue.queue to a LocalQueue whose "
            "ClusterQueue has such a flavor",
            subject=subject,
            permanent=True,
        )
    return None


def _pod_set_words(sets: list[str]) -> str:
    """`` (pod set a)`` or `` (pod sets a, b)``; empty when Kueue named none."""
    unique = list(dict.fromkeys(sets))
    if not unique:
        return ""
    return f" (pod set{'s' if len(unique) > 1 else ''} {', '.join(unique)})"


def _by_reason(reason: str, message: str, queues: _Queues) -> Blocker:
    """The blocker of a reason whose message says nothing the flavor parser knows."""
    told = f": {message}" if message else ""
    subject = queues.cluster_subject
    if reason == "WaitingForQuota":
        return Blocker(
            B.INSUFFICIENT_QUOTA,
            f"{queues.where} has no room yet{told}",
            f"it is admitted when workloads using {subject} finish; raise its nominalQuota",
            subject=subject,
        )
    if reason == "ExceedsMaxQuota":
        return Blocker(
            B.QUEUE_CAPABILITY,
            f"{queues.where} can never admit the job{told}",
            f"ask for less, or raise {subject}'s nominalQuota or borrowingLimit",
            subject=subject,
            permanent=True,
        )
    if reason == "NoMatchingFlavor":
        return Blocker(
            B.NO_MATCHING_FLAVOR,
            f"no ResourceFlavor of {queues.where} fits the job{told}",
            "fix the pods' nodeSelector, affinity or tolerations to match a flavor",
            subject=subject,
            permanent=True,
        )
    if reason == "Misconfigured":
        return Blocker(
            B.QUEUE_MISCONFIGURED,
            f"Kueue cannot admit the job from {queues.where}{told}",
            f"fix {subject} (kubectl describe clusterqueue), or set kueue.queue to another "
            "LocalQueue",
            subject=subject,
            permanent=True,
        )
    if reason == "Suspended":
        return Blocker(
            B.QUEUE_CLOSED,
            f"Kueue's queue for the job is stopped or inactive ({queues.where}){told}",
            "ask its owner to restart it, or set kueue.queue to a LocalQueue that runs",
            subject=subject,
            permanent=True,
        )
    if reason == "WaitingForPodsReady":
        return Blocker(
            B.WAITING,
            f"Kueue admits nothing until the pods of admitted workloads are ready "
            f"(waitForPodsReady.blockAdmission){told}",
            "wait: other workloads' pods are starting",
            subject=subject,
        )
    return Blocker(
        B.WAITING,
        f"waiting in {queues.where} for Kueue to evaluate the job{told}",
        f"check the Workload (kubectl get workloads -n {queues.namespace} -o wide)",
        subject=subject,
    )


def _admission_checks(workload: KubeObject, queues: _Queues) -> Blocker:
    checks = (workload.get("status") or {}).get("admissionChecks") or []
    pending = [
        f"{c.get('name')} ({c.get('state') or 'Pending'})"
        for c in checks
        if c.get("state") != "Ready"
    ]
    waits = f"admission checks {', '.join(pending)}" if pending else "its admission"
    return Blocker(
        B.WAITING,
        f"quota reserved in {queues.where}; waiting for {waits}",
        "wait: Kueue admits the job once its admission checks pass",
        subject=queues.cluster_subject,
    )


def _requeued(found: Blocker, hold: QueueHold, workload: KubeObject, queues: _Queues) -> Blocker:
    """The blocker of a job Kueue evicted and queues again: the same job, admitted again later."""
    times = f", {hold.requeues} times so far" if hold.requeues > 1 else ""
    evicted = f"requeued after eviction ({hold.reason}{times})"
    requeue_at = ((workload.get("status") or {}).get("requeueState") or {}).get("requeueAt")
    if requeue_at:
        evicted += f", back in the queue at {requeue_at}"
    if found.category is B.WAITING:
        return Blocker(
            B.REQUEUED,
            f"{evicted}: {hold.message or found.message}",
            "wait: Kueue admits the same job again (it resumes from its checkpoint); nothing is "
            "submitted twice",
            subject=queues.cluster_subject,
            permanent=found.permanent,
            recheck_in_s=found.recheck_in_s,
        )
    return Blocker(
        found.category,
        f"{evicted}; now {found.message}",
        found.hint,
        subject=found.subject,
        permanent=found.permanent,
        recheck_in_s=found.recheck_in_s,
    )


def _deactivated_blocker(workload: KubeObject, queues: _Queues) -> Blocker:
    name = (workload.get("metadata") or {}).get("name")
    subject = f"Workload {queues.namespace}/{name}"
    words = " ".join(
        f"{c.get('reason')} {c.get('message')}"
        for c in (workload.get("status") or {}).get("conditions") or []
        if c.get("type") in ("Evicted", "DeactivationTarget", "Requeued")
    )
    if "RequeuingLimitExceeded" in words or "re-queuing retries" in words:
        count = _requeues(workload)
        times = f" {count} times," if count else ""
        return Blocker(
            B.REQUEUING_LIMIT,
            f"Kueue deactivated {subject}: its pods did not all get ready in time, and it was "
            f"requeued{times} as often as Kueue allows "
            "(waitForPodsReady.requeuingStrategy.backoffLimitCount)",
            "find why the pods do not start in time (image pulls, node capacity, "
            "waitForPodsReady.timeout too short), then resubmit",
            subject=subject,
            permanent=True,
        )
    evicted = _condition(workload, "Evicted") or {}
    why = str(evicted.get("message") or "spec.active is false")
    return Blocker(
        B.WORKLOAD_DEACTIVATED,
        f"Kueue deactivated {subject}: {why}",
        f"set spec.active: true on {subject} to queue the job again, or resubmit",
        subject=subject,
        permanent=True,
    )


def _quantity(text: object) -> Decimal:
    try:
        return parse_quantity(str(text if text is not None else "0").strip() or "0")
    except ValueError:
        return Decimal(0)


def _workload_usage(admission: KubeObject) -> dict[tuple[str, str], Decimal]:
    """``(flavor, resource)`` to what the admitted Workload holds there, over its pod sets."""
    usage: dict[tuple[str, str], Decimal] = {}
    for assignment in admission.get("podSetAssignments") or []:
        flavors = assignment.get("flavors") or {}
        for resource, amount in (assignment.get("resourceUsage") or {}).items():
            flavor = flavors.get(resource)
            if flavor:
                key = (str(flavor), str(resource))
                usage[key] = usage.get(key, Decimal(0)) + _quantity(amount)
    return usage


def _nominal(cluster_queue: KubeObject) -> dict[tuple[str, str], str]:
    """``(flavor, resource)`` to the ClusterQueue's nominal quota, as written."""
    found: dict[tuple[str, str], str] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                key = (str(flavor.get("name")), str(resource.get("name")))
                found[key] = str(resource.get("nominalQuota") or "0")
    return found


def cohort_borrowing(workload: KubeObject, cluster_queue: KubeObject | None) -> str | None:
    """One line saying that Kueue admitted the Workload on quota borrowed from the cohort.

    Kueue v0.19.2 does not mark a Workload admitted by borrowing: its ``status.admission``
    names the ClusterQueue and, per pod set, the flavor of each resource and what it uses. The
    ClusterQueue's ``status.flavorsUsage`` says how much of each flavor's resource is in use
    (``total``) and how much of that is borrowed from its cohort (``borrowed``, above its
    ``nominalQuota``). The job borrows where it holds a resource of a flavor that its
    ClusterQueue borrows: at most what it holds there, at most what the queue borrows; and at
    least what it alone holds above the queue's nominal quota, which the queue's usage (written
    by Kueue a moment after the admission) may not show yet.

    ``None`` when the Workload holds no quota (neither reserved nor admitted), the ClusterQueue
    is not the one that admitted it (or was not read), it is in no cohort, or it borrows nothing
    the job holds. The queue's usage is read when the wait reads it: a queue that admits or
    ends other jobs meanwhile changes what it borrows.

    Example:
        >>> workload = {"status": {
        ...     "conditions": [{"type": "Admitted", "status": "True"}],
        ...     "admission": {"clusterQueue": "cq-b", "podSetAssignments": [
        ...         {"name": "master", "flavors": {"nvidia.com/gpu": "gpu-a"},
        ...          "resourceUsage": {"nvidia.com/gpu": "2"}}]}}}
        >>> queue = {"metadata": {"name": "cq-b"}, "spec": {"cohortName": "research",
        ...     "resourceGroups": [{"flavors": [{"name": "gpu-a", "resources": [
        ...         {"name": "nvidia.com/gpu", "nominalQuota": "2"}]}]}]},
        ...     "status": {"flavorsUsage": [{"name": "gpu-a", "resources": [
        ...         {"name": "nvidia.com/gpu", "total": "4", "borrowed": "2"}]}]}}
        >>> cohort_borrowing(workload, queue)
        'admitted on quota borrowed from cohort research: 2 nvidia.com/gpu in flavor gpu-a \
(ClusterQueue cq-b: nominal quota 2, 4 in use)'
    """
    admission = (workload.get("status") or {}).get("admission") or {}
    name = str(admission.get("clusterQueue") or "")
    holds = _is_true(workload, "Admitted") or _is_true(workload, "QuotaReserved")
    if not name or cluster_queue is None or not holds:
        return None
    if str((cluster_queue.get("metadata") or {}).get("name") or "") != name:
        return None
    spec = cluster_queue.get("spec") or {}
    cohort = str(spec.get("cohortName") or spec.get("cohort") or "")
    if not cohort:
        return None
    held = _workload_usage(admission)
    nominal = _nominal(cluster_queue)
    usage: dict[tuple[str, str], KubeObject] = {}
    for flavor in (cluster_queue.get("status") or {}).get("flavorsUsage") or []:
        for resource in flavor.get("resources") or []:
            usage[(str(flavor.get("name")), str(resource.get("name")))] = resource
    parts: list[str] = []
    for key, mine in held.items():
        if mine <= 0 or key not in nominal:
            continue
        written = usage.get(key) or {}
        # Kueue writes the queue's usage a moment after the admission: what the job alone
        # holds above the queue's nominal quota is borrowed whatever the usage says yet.
        above = mine - _quantity(nominal[key])
        borrowed = max(min(_quantity(written.get("borrowed")), mine), above)
        if borrowed <= 0:
            continue
        total = str(written.get("total") or "0")
        in_use = _number(total) if _quantity(total) >= mine else format(mine.normalize(), "f")
        parts.append(
            f"{format(borrowed.normalize(), 'f')} {key[1]} in flavor {key[0]} (ClusterQueue "
            f"{name}: nominal quota {nominal[key]}, {in_use} in use)"
        )
    if not parts:
        return None
    return f"admitted on quota borrowed from cohort {cohort}: {'; '.join(parts)}"


def admitting_queue(workload: KubeObject | None) -> str | None:
    """The ClusterQueue that holds quota for the Workload (``status.admission``), if any."""
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    return str(admission.get("clusterQueue") or "") or None


def admitted_by(
    state: AdmissionState, workload: KubeObject | None, cluster_queue: KubeObject | None
) -> AdmissionState:
    """An admitted job's state, its reason saying so when Kueue lent it quota from the cohort.

    The wait reads the admitting ClusterQueue (:func:`admitting_queue`) once, when it sees the
    job's replicas scheduled: its usage is then Kueue's since the admission. Any other state
    (not admitted, nothing borrowed, the queue not read) is ``state`` itself.

    Example: with the Workload and ClusterQueue of :func:`cohort_borrowing`'s example,
    ``str(admitted_by(AdmissionState(admitted=True, scheduled=2, expected=2), workload, queue))``
    is ``admitted: 2/2 replicas scheduled; admitted on quota borrowed from cohort research: 2
    nvidia.com/gpu in flavor gpu-a (ClusterQueue cq-b: nominal quota 2, 4 in use)``
    (``tests/unit/lifecycle/test_kueue_borrowing.py`` checks it on Kueue's own objects).
    """
    if not state.admitted or workload is None:
        return state
    line = cohort_borrowing(workload, cluster_queue)
    return state if line is None else replace(state, reason=line)
