"""What phase a training job is in, read from the objects the operators write. Pure functions.

Both operators keep ``status.conditions`` as a list where each new condition is appended (an older
one of the same type is removed first, and ``Running`` is set to False when the job ends), so the
last condition whose status is ``True`` is the current one; a job is terminal once ``Succeeded`` or
``Failed`` is True. KubeDL uses bare reasons (``JobRunning``), Kubeflow prefixes the kind
(``PyTorchJobRunning``); both use the same condition *types*, which is what we read.

Kubeflow Trainer v2's ``TrainJob`` has other conditions (``trainer.kubeflow.org/v1alpha1``,
v2.3.0): only ``Suspended``, ``Complete`` and ``Failed``, the last two copied from its JobSet with
the JobSet's reason and message (``AllJobsCompleted``, ``FailedJobs``, ``DeadlineExceeded``...). A
suspended TrainJob (Kueue holds it, or it was created suspended) is *queuing*, never failed; one
without a terminal condition runs once a child Job of its JobSet is ready (all its pods ready) or
has succeeded: an *active* Job may have nothing but Pending pods (a gang Volcano holds). Its
``status.jobsStatus`` counts each replicated Job's child Jobs (not pods), and
``status.trainerStatus`` is what the training program reported to Trainer's status server
(:func:`trainer_progress`).

Admission is not a job condition: it comes from the gang's PodGroups (or the pods' scheduling),
see :mod:`kubedl_prefect.lifecycle.admission`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final

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


@dataclass(frozen=True)
class QueueHold:
    """What the admission system that queues a job (Kueue) says of it now.

    A job it manages is created suspended and waits in a queue until admitted; an admitted job
    may be evicted (preempted, pods not ready in time, a node lost), suspended again and put
    back in the queue: the *same* job is admitted again later. The Kubernetes wing reads this
    from Kueue's Workload (:func:`kubedl_prefect.lifecycle.kubernetes.kueue.queue_hold`).

    Args:
        admitted: It lets the job run now (it holds the job's quota).
        requeued: It evicted the job after admitting it, and queues it again.
        reason: Its word for why (``Preempted``, ``PodsReadyTimeout``, ``WaitingForQuota``).
        message: Its message.
        requeues: How often it has evicted the job so far.
        preemption: Why it preempted the job, when ``reason`` is ``Preempted`` (Kueue's
            ``InClusterQueue``, ``InCohortReclamation``...; empty when it did not say).
    """

    admitted: bool
    requeued: bool = False
    reason: str = ""
    message: str = ""
    requeues: int = 0
    preemption: str = ""


def queued_status(status: JobStatus, hold: QueueHold | None) -> JobStatus:
    """``status`` as the queue holding the job says it is: an eviction is not a failure.

    A job its queue has evicted and requeued is ``Queuing`` with the reason ``Requeued`` and
    the message ``requeued: <reason>: <message>``, whatever the operator says of it meanwhile
    (suspended, its pods stopping): it waits to be admitted again, as the same job, so it is
    neither failed nor a new attempt. A job its queue has not admitted yet is ``Queuing``
    rather than ``Suspended`` or ``Created``; one it has admitted but the operator has not
    resumed yet is ``Created``. A terminal status is left as it is, and so is any status without
    a hold (``hold`` is ``None``: no queue manages the job, or a user suspended it). Any other
    status carries the hold (:attr:`JobStatus.queue`): what reports the run reads the eviction's
    reason and the requeue count there.

    Example:
        >>> running = JobStatus(Phase.SUSPENDED, reason="PyTorchJobSuspended")
        >>> held = QueueHold(admitted=False, requeued=True, reason="Preempted",
        ...                  message="Preempted to accommodate a workload")
        >>> status = queued_status(running, held)
        >>> status.phase, status.message
        (<Phase.QUEUING: 'Queuing'>, 'requeued: Preempted: Preempted to accommodate a workload')
    """
    if hold is None or status.phase.terminal:
        return status
    status = replace(status, queue=hold)
    if hold.requeued:
        told = f": {hold.message}" if hold.message else ""
        return replace(
            status,
            phase=Phase.QUEUING,
            reason="Requeued",
            message=f"requeued: {hold.reason or 'evicted'}{told}",
        )
    if not hold.admitted and status.phase in (Phase.CREATED, Phase.SUSPENDED, Phase.QUEUING):
        told = f": {hold.message}" if hold.message else ""
        return replace(
            status,
            phase=Phase.QUEUING,
            reason=hold.reason or "Queued",
            message=f"queued{told}",
        )
    if hold.admitted and status.phase is Phase.SUSPENDED:
        return replace(
            status,
            phase=Phase.CREATED,
            reason="Admitted",
            message="admitted by its queue; waiting for the operator to resume it",
        )
    return status


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


TRAINJOB_KIND: Final = "TrainJob"
"""Kubeflow Trainer v2's kind, whose conditions :func:`job_status` reads its own way."""


@dataclass(frozen=True)
class TrainerProgress:
    """What the training program of a TrainJob reported (``status.trainerStatus``, Trainer v2.2+).

    Args:
        percent: ``progressPercentage`` (0 to 100), if reported.
        remaining_s: ``estimatedRemainingSeconds``, if reported.
        metrics: ``metrics`` by name (values are strings, as Trainer keeps them).
        updated: ``lastUpdatedTime`` (RFC 3339), if set.
    """

    percent: int | None = None
    remaining_s: int | None = None
    metrics: Mapping[str, str] = field(default_factory=dict)
    updated: str | None = None

    def progress_line(self) -> str | None:
        """The progress as a JSON progress line (``{"step": ..., "total": 100, ...}``).

        The shape a training program prints to move the progress bar, so this progress feeds
        the same reporting as the lines do; the metrics ride along (they are ignored there).
        ``None`` when no percentage was reported.

        Example:
            >>> TrainerProgress(percent=40, remaining_s=90, metrics={"loss": "0.3"}).progress_line()
            '{"step": 40, "total": 100, "remaining_s": 90, "loss": "0.3"}'
        """
        if self.percent is None:
            return None
        data: dict[str, Any] = {"step": self.percent, "total": 100}
        if self.remaining_s is not None:
            data["remaining_s"] = self.remaining_s
        for name, value in self.metrics.items():
            data.setdefault(name, value)
        return json.dumps(data)


def trainer_progress(job: KubeObject) -> TrainerProgress | None:
    """``status.trainerStatus`` of a TrainJob, or ``None`` when it has none (or is no TrainJob).

    Values out of the CRD's ranges (a percentage over 100, a negative time) are dropped, not
    trusted: the status server validates them, but an object can be written by anyone with the
    right to.

    Example:
        >>> trainer_progress({"kind": "TrainJob", "status": {"trainerStatus": {
        ...     "progressPercentage": 25, "estimatedRemainingSeconds": 300,
        ...     "metrics": [{"name": "loss", "value": "0.41"}],
        ...     "lastUpdatedTime": "2026-08-06T10:00:00Z"}}})
        TrainerProgress(percent=25, remaining_s=300, metrics={'loss': '0.41'}, \
updated='2026-08-06T10:00:00Z')
    """
    raw = (job.get("status") or {}).get("trainerStatus")
    if not isinstance(raw, dict):
        return None
    percent = _bounded_int(raw.get("progressPercentage"), 0, 100)
    remaining = _bounded_int(raw.get("estimatedRemainingSeconds"), 0, 2**31 - 1)
    metrics: dict[str, str] = {}
    for item in raw.get("metrics") or []:
        if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"]:
            value = item.get("value")
            if isinstance(value, str):
                metrics[item["name"]] = value
    updated = raw.get("lastUpdatedTime")
    return TrainerProgress(
        percent=percent,
        remaining_s=remaining,
        metrics=metrics,
        updated=updated if isinstance(updated, str) else None,
    )


def _bounded_int(value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return None
    number = int(value)
    return number if low <= number <= high else None


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
        trainer: A TrainJob's ``status.trainerStatus`` (:func:`trainer_progress`), if any.
        queue: What the queue that holds the job (Kueue) says of it (:func:`queued_status`), if
            one does.
    """

    phase: Phase
    reason: str = ""
    message: str = ""
    replicas: dict[str, ReplicaCounts] = field(default_factory=dict)
    start_time: str | None = None
    completion_time: str | None = None
    resource_version: str = ""
    transition_time: str | None = None
    trainer: TrainerProgress | None = None
    queue: QueueHold | None = None


def job_status(job: KubeObject) -> JobStatus:
    """Read the phase and replica counts of a KubeDL or Kubeflow job, or a Trainer TrainJob."""
    if job.get("kind") == TRAINJOB_KIND:
        return trainjob_status(job)
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


def trainjob_status(job: KubeObject) -> JobStatus:
    """The phase and per-replicated-Job counts of a Kubeflow Trainer v2 ``TrainJob``.

    ``Complete`` and ``Failed`` end it, with the JobSet's reason and message; ``Suspended``
    (True) is queuing, never failed; without either, it runs once one of its replicated Jobs
    has a ready or succeeded Job, and is created before: JobSet counts a Job *active* while
    any of its pods is not finished, Pending ones included (an oversize gang's Jobs are active
    and unscheduled). The replica counts are keyed by replicated Job (``node``, ``launcher``)
    and count its child Jobs.

    Example:
        >>> status = trainjob_status({"kind": "TrainJob", "status": {"conditions": [
        ...     {"type": "Suspended", "status": "True", "reason": "Suspended",
        ...      "message": "TrainJob is suspended"}]}})
        >>> status.phase.value, status.reason
        ('Queuing', 'Suspended')
    """
    status = job.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    true = {c.get("type"): c for c in conditions if c.get("status") == "True"}
    replicas: dict[str, ReplicaCounts] = {}
    busy = False
    for item in status.get("jobsStatus") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        counts = {k: _count(item.get(k)) for k in ("active", "ready", "succeeded", "failed")}
        replicas[item["name"]] = ReplicaCounts(
            active=counts["active"], succeeded=counts["succeeded"], failed=counts["failed"]
        )
        busy = busy or counts["ready"] > 0 or counts["succeeded"] > 0
    current: Mapping[str, Any] | None = None
    if "Failed" in true:
        phase, current = Phase.FAILED, true["Failed"]
    elif "Complete" in true:
        phase, current = Phase.SUCCEEDED, true["Complete"]
    elif "Suspended" in true:
        phase, current = Phase.QUEUING, true["Suspended"]
    else:
        phase = Phase.RUNNING if busy else Phase.CREATED
        resumed = [c for c in conditions if c.get("type") == "Suspended"]
        current = resumed[-1] if resumed else None
    return JobStatus(
        phase=phase,
        reason=str((current or {}).get("reason") or ""),
        message=str((current or {}).get("message") or ""),
        replicas=replicas,
        completion_time=(current or {}).get("lastTransitionTime") if phase.terminal else None,
        resource_version=str((job.get("metadata") or {}).get("resourceVersion") or ""),
        transition_time=(current or {}).get("lastTransitionTime"),
        trainer=trainer_progress(job),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
