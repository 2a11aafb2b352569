"""Whether a job was admitted, and if not why: the vocabulary every backend reports in.

:class:`AdmissionBlocker` names the causes (a stable contract), :class:`Blocker` is one cause
decided (permanent or not), and :class:`AdmissionState` is what a wait reports. Each backend
decides them its own way: the Kubernetes backend from the cluster
(:mod:`kubedl_prefect.lifecycle.kubernetes.admission` and
:mod:`kubedl_prefect.lifecycle.kubernetes.blockers`), the local backend from the machine
(:mod:`kubedl_prefect.lifecycle.local.capacity`). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kubedl_prefect.errors import Diagnosis, FailureCategory

__all__ = [
    "GENERIC_BLOCKERS",
    "AdmissionBlocker",
    "AdmissionState",
    "Blocker",
]


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
    # Kueue (lifecycle.kubernetes.kueue): what its Workload says, and its queues.
    INSUFFICIENT_QUOTA = "InsufficientQuota"
    WAITING_FOR_PREEMPTION = "WaitingForPreemption"
    NO_MATCHING_FLAVOR = "NoMatchingFlavor"
    QUEUE_MISCONFIGURED = "QueueMisconfigured"
    REQUEUED = "Requeued"
    REQUEUING_LIMIT = "RequeuingLimitExceeded"
    WORKLOAD_DEACTIVATED = "WorkloadDeactivated"


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
class AdmissionState:
    """Whether all replicas are admitted; else the blocker, a one-line reason and the decision.

    Args:
        admitted: Every replica is bound to a node.
        blocker: What holds the job back (``None`` once admitted).
        reason: One line that says it, naming the object; once admitted, how, if that is news
            (Kueue lent the job quota from its ClusterQueue's cohort).
        scheduled: Replicas bound to a node.
        expected: Replicas the job asks for.
        subject: The object the blocker names (``Queue gpu-team``), if any.
        hint: What to do about it.
        permanent: Waiting cannot help: the wait fails the job at once.
        pods: Live pods created so far.
        recheck_in_s: Decide again after this long even if nothing changes (a grace period).
    """

    admitted: bool
    blocker: AdmissionBlocker | None = None
    reason: str = ""
    scheduled: int = 0
    expected: int = 0
    subject: str = ""
    hint: str = ""
    permanent: bool = False
    pods: int = 0
    recheck_in_s: float | None = None

    def __str__(self) -> str:
        if self.admitted:
            how = f"; {self.reason}" if self.reason else ""
            return f"admitted: {self.scheduled}/{self.expected} replicas scheduled{how}"
        return f"not admitted ({self.scheduled}/{self.expected} scheduled): {self.reason}"

    def diagnosis(self) -> Diagnosis | None:
        """The failure a permanent blocker makes of the job; ``None`` for any other state."""
        if self.admitted or not self.permanent or self.blocker is None:
            return None
        return Blocker(
            self.blocker, self.reason, self.hint, subject=self.subject, permanent=True
        ).diagnosis()
