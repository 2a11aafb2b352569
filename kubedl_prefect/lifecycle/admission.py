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


# Quota first: a quota message names the resource too, but the fix is the quota, not the nodes.
_PATTERNS: tuple[tuple[re.Pattern[str], AdmissionBlocker], ...] = (
    (re.compile(r"quota", re.I), AdmissionBlocker.QUOTA),
    (re.compile(r"nvidia\.com/gpu", re.I), AdmissionBlocker.INSUFFICIENT_GPU),
    (re.compile(r"PersistentVolumeClaim", re.I), AdmissionBlocker.UNBOUND_PVC),
    (re.compile(r"taint", re.I), AdmissionBlocker.UNTOLERATED_TAINT),
    (
        re.compile(r"Insufficient|NotEnoughResources|not enough", re.I),
        AdmissionBlocker.INSUFFICIENT_RESOURCES,
    ),
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


def _latest_event_message(events: Sequence[KubeObject], reasons: set[str]) -> str:
    matching = [e for e in events if e.get("reason") in reasons]
    if not matching:
        return ""
    latest = max(
        matching,
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
    )
    return str(latest.get("message") or "")


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

    message = ""
    for podgroup in podgroups:
        message = _podgroup_message(podgroup)
        if message:
            break
    if not message:
        message = next((m for m in map(_unschedulable_message, live) if m), "")
    if not message:
        message = _latest_event_message(events, {"FailedScheduling", "Unschedulable"})
    if not message:
        quota = _latest_event_message(events, {"FailedCreate", "FailedCreatePod"})
        if quota:
            return AdmissionState(
                False,
                classify_reason(quota),
                _one_line(quota),
                scheduled=scheduled,
                expected=expected,
            )
    if message:
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
