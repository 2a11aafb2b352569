"""Reading what the operators and schedulers wrote. Pure.

The pods' and PodGroups' scheduling messages and the operator's refusals, one line each,
classified into a blocker.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import AdmissionBlocker

_ORIGIN = re.compile(r"Origin reason is [^:]+: (.*)$", re.S)
_KUBEFLOW_POD_EVENT = re.compile(r"^Error pod \S+ condition message: ", re.S)
_GANG_GENERIC = re.compile(r"pod group is not ready|tasks in gang unschedulable", re.I)

SCHEDULER_PATTERNS: tuple[tuple[re.Pattern[str], AdmissionBlocker], ...] = (
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
PLACEMENT_WORDS = re.compile(r"node affinity|node selector|taint", re.I)
QUEUE_SHORT = re.compile(r"queue resource quota insufficient", re.I)


def classify_reason(message: str) -> AdmissionBlocker:
    """Map a scheduler or quota message to an :class:`AdmissionBlocker` (``WAITING`` if none).

    Example:
        >>> classify_reason("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
        <AdmissionBlocker.INSUFFICIENT_GPU: 'InsufficientGPU'>
    """
    for pattern, blocker in SCHEDULER_PATTERNS:
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
