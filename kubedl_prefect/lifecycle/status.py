"""What phase a training job is in, read from the objects the operators write. Pure functions.

Both operators keep ``status.conditions`` as a list where each new condition is appended (an older
one of the same type is removed first, and ``Running`` is set to False when the job ends), so the
last condition whose status is ``True`` is the current one; a job is terminal once ``Succeeded`` or
``Failed`` is True. KubeDL uses bare reasons (``JobRunning``), Kubeflow prefixes the kind
(``PyTorchJobRunning``); both use the same condition *types*, which is what we read.

Admission is not a job condition: it comes from the gang's PodGroups (or the pods' scheduling),
see :mod:`kubedl_prefect.lifecycle.admission`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kubedl_prefect.kube.resources import KubeObject


class Phase(StrEnum):
    """Phases of a training job as kubedl-prefect reports them (a stable contract)."""

    CREATED = "Created"
    QUEUING = "Queuing"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        """Whether the job can no longer change phase."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


_CONDITION_PHASES = {
    "Created": Phase.CREATED,
    "Queuing": Phase.QUEUING,
    "Running": Phase.RUNNING,
    "Restarting": Phase.RESTARTING,
    "Suspended": Phase.SUSPENDED,
    "Succeeded": Phase.SUCCEEDED,
    "Failed": Phase.FAILED,
}


@dataclass(frozen=True)
class ReplicaCounts:
    """Counts of one role's replicas, as the operator reports them."""

    active: int = 0
    succeeded: int = 0
    failed: int = 0
    evicted: int = 0


@dataclass(frozen=True)
class JobStatus:
    """A training job's state at one resourceVersion.

    Args:
        phase: The current phase from the conditions (``CREATED`` when there are none yet).
        reason: The reason of the condition that gives the phase.
        message: Its message.
        replicas: Counts per replica role, lower-case (``master``, ``worker``).
        start_time: ``status.startTime`` (RFC 3339), if set.
        completion_time: ``status.completionTime``, if set.
        resource_version: The object's resourceVersion.
        transition_time: ``lastTransitionTime`` of the condition that gives the phase.
    """

    phase: Phase
    reason: str = ""
    message: str = ""
    replicas: dict[str, ReplicaCounts] = field(default_factory=dict)
    start_time: str | None = None
    completion_time: str | None = None
    resource_version: str = ""
    transition_time: str | None = None


def job_status(job: KubeObject) -> JobStatus:
    """Read the phase and replica counts of a KubeDL or Kubeflow training job object."""
    status = job.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    phase, current = Phase.CREATED, None
    terminal = [c for c in conditions if c.get("type") in ("Succeeded", "Failed")]
    chosen = terminal[-1] if terminal else (conditions[-1] if conditions else None)
    if chosen is not None and chosen.get("type") in _CONDITION_PHASES:
        phase, current = _CONDITION_PHASES[chosen["type"]], chosen
    replicas = {
        role.lower(): ReplicaCounts(
            active=int(counts.get("active") or 0),
            succeeded=int(counts.get("succeeded") or 0),
            failed=int(counts.get("failed") or 0),
            evicted=int(counts.get("evicted") or 0),
        )
        for role, counts in (status.get("replicaStatuses") or {}).items()
    }
    return JobStatus(
        phase=phase,
        reason=str((current or {}).get("reason") or ""),
        message=str((current or {}).get("message") or ""),
        replicas=replicas,
        start_time=status.get("startTime"),
        completion_time=status.get("completionTime"),
        resource_version=str(job.get("metadata", {}).get("resourceVersion") or ""),
        transition_time=(current or {}).get("lastTransitionTime"),
    )
