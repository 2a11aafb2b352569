"""Whether a job's replicas were admitted together, and if not, why. Pure functions.

Gang admission differs by operator: KubeDL with Volcano makes PodGroups labelled
``kubedl.io/gang-job-name`` (one per job, or one per role when its DAG scheduling is on) and
creates the pods at once, letting the scheduler hold them;
Kubeflow makes one PodGroup named like the job and creates pods only once it is ``Inqueue``; a
job without gang scheduling has only its pods. In every case the job is admitted when each of its
replicas has been bound to a node, and what blocks it is found, in this order, in the PodGroups'
``Unschedulable`` conditions, the pods' ``PodScheduled`` conditions, and ``FailedScheduling`` /
``FailedCreate`` events. The scheduler's standard wording is matched to a stable category.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kubedl_prefect.kube.resources import KubeObject


class AdmissionBlocker(StrEnum):
    """Why a job is not admitted yet (a stable contract)."""

    INSUFFICIENT_GPU = "InsufficientGPU"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    UNBOUND_PVC = "UnboundPVC"
    UNTOLERATED_TAINT = "UntoleratedTaint"
    QUOTA = "QuotaExceeded"
    NOT_CREATED = "PodsNotCreated"
    WAITING = "Waiting"


@dataclass(frozen=True)
class AdmissionState:
    """Whether all replicas are admitted; else the blocker and a one-line reason."""

    admitted: bool
    blocker: AdmissionBlocker | None = None
    reason: str = ""
    scheduled: int = 0
    expected: int = 0

    def __str__(self) -> str:
        if self.admitted:
            return f"admitted: {self.scheduled}/{self.expected} replicas scheduled"
        return f"not admitted ({self.scheduled}/{self.expected} scheduled): {self.reason}"


# A ResourceQuota rejection names the resource too, but its fix is the quota: it comes first.
# Volcano says "queue resource quota insufficient: insufficient nvidia.com/gpu" when the
# cluster (the queue's share of it) lacks GPUs: that is a GPU shortage to the user.
_PATTERNS: tuple[tuple[re.Pattern[str], AdmissionBlocker], ...] = (
    (re.compile(r"exceeded quota", re.I), AdmissionBlocker.QUOTA),
    (re.compile(r"nvidia\.com/gpu", re.I), AdmissionBlocker.INSUFFICIENT_GPU),
    (re.compile(r"PersistentVolumeClaim", re.I), AdmissionBlocker.UNBOUND_PVC),
    (re.compile(r"taint", re.I), AdmissionBlocker.UNTOLERATED_TAINT),
    (
        re.compile(r"Insufficient|NotEnoughResources|not enough", re.I),
        AdmissionBlocker.INSUFFICIENT_RESOURCES,
    ),
    (re.compile(r"quota", re.I), AdmissionBlocker.QUOTA),
)


_SPECIFIC = frozenset(
    {
        AdmissionBlocker.INSUFFICIENT_GPU,
        AdmissionBlocker.UNBOUND_PVC,
        AdmissionBlocker.UNTOLERATED_TAINT,
        AdmissionBlocker.QUOTA,
    }
)


def classify_reason(message: str) -> AdmissionBlocker:
    """Map a scheduler or quota message to an :class:`AdmissionBlocker`."""
    for pattern, blocker in _PATTERNS:
        if pattern.search(message):
            return blocker
    return AdmissionBlocker.WAITING


def expected_replicas(job: KubeObject) -> int:
    """How many pods the job asks for in total (over every ``*ReplicaSpecs`` role)."""
    spec = job.get("spec") or {}
    total = 0
    for key, roles in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(roles, dict):
            total += sum(int((role or {}).get("replicas", 1) or 0) for role in roles.values())
    return total


def _is_scheduled(pod: KubeObject) -> bool:
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return True
    return False


def _unschedulable_message(pod: KubeObject) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "")
    return ""


def _podgroup_message(podgroup: KubeObject) -> str:
    for condition in reversed((podgroup.get("status") or {}).get("conditions") or []):
        if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
            return str(condition.get("message") or condition.get("reason") or "")
    return ""


def _event_messages(events: Sequence[KubeObject], reasons: set[str]) -> list[str]:
    """Messages of events with one of ``reasons``, newest first."""
    matching = [e for e in events if e.get("reason") in reasons]
    matching.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "", reverse=True)
    return [str(e.get("message") or "") for e in matching]


def _one_line(message: str) -> str:
    return " ".join(message.split())


def admission_state(
    job: KubeObject,
    *,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject] = (),
    events: Sequence[KubeObject] = (),
) -> AdmissionState:
    """Decide whether ``job`` is admitted, from its pods, PodGroups and related events.

    Args:
        job: The training job object.
        pods: The job's pods (any phase).
        podgroups: The job's Volcano PodGroups, if it is gang-scheduled.
        events: Events about the job, its pods and PodGroups.
    """
    expected = expected_replicas(job)
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    scheduled = sum(1 for p in live if _is_scheduled(p))
    if expected and scheduled >= expected:
        return AdmissionState(True, scheduled=scheduled, expected=expected)

    # Every place that may say why, most structured first; the first message that names a cause
    # wins (a PodGroup's condition is often generic while an event names the resource).
    messages = [
        *(_podgroup_message(podgroup) for podgroup in podgroups),
        *(_unschedulable_message(pod) for pod in live),
        *_event_messages(events, {"FailedScheduling", "Unschedulable"}),
        *_event_messages(events, {"FailedCreate", "FailedCreatePod"}),
    ]
    messages = [m for m in messages if m]
    if messages:
        message = next((m for m in messages if classify_reason(m) in _SPECIFIC), messages[0])
        return AdmissionState(
            False, classify_reason(message), _one_line(message), scheduled, expected
        )
    if len(live) < expected:
        pending_groups = [
            pg["metadata"]["name"]
            for pg in podgroups
            if (pg.get("status") or {}).get("phase") in (None, "Pending")
        ]
        reason = (
            f"PodGroup {', '.join(pending_groups)} waiting to be enqueued"
            if pending_groups
            else f"{len(live)}/{expected} pods created so far"
        )
        blocker = AdmissionBlocker.WAITING if pending_groups else AdmissionBlocker.NOT_CREATED
        return AdmissionState(False, blocker, reason, scheduled, expected)
    return AdmissionState(
        False, AdmissionBlocker.WAITING, "waiting for the scheduler", scheduled, expected
    )
