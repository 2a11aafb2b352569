"""What a training run returns to a flow, and the timeline it is computed from. Pure logic.

:class:`Timeline` collects what a run observes — each attempt's submission, its phase changes —
and :func:`training_result` turns it, the lifecycle's outcome and the logical job's record into
a :class:`TrainingResult`: plain, JSON-able data a Prefect task returns and persists (phase,
attempts and why each ended, time queued and running, how often its queue requeued it, the
admission reason, the checkpoint location, and the commands to look at the job).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kubedl_prefect.errors import Diagnosis
from kubedl_prefect.lifecycle.backend import JobOutcome, JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.kubernetes.dialects import JobObjects, job_kind
from kubedl_prefect.lifecycle.records import RunRecord
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import Dialect


@dataclass
class AttemptTimes:
    """When one attempt was submitted, queued, admitted, started and ended (Unix seconds).

    A job its queue (Kueue) evicts and requeues waits again as the same attempt: each such
    wait, from the requeue to the next admission, is added to ``requeued_s`` (and is not
    running time).
    """

    attempt: int
    submitted_at: float
    queued_at: float | None = None
    admitted_at: float | None = None
    running_at: float | None = None
    ended_at: float | None = None
    queue_reason: str = ""
    queue_blocker: str = ""
    requeues: int = 0
    requeued_at: float | None = None
    requeued_s: float = 0.0
    requeued_after_start_s: float = 0.0

    def queued_s(self) -> float | None:
        """Seconds from submission to admission (or the start), plus the waits after requeues."""
        until = self.admitted_at or self.running_at or self.ended_at
        if until is None:
            return None
        return max(0.0, until - self.submitted_at) + self.requeued_for()

    def requeued_for(self) -> float:
        """Seconds waited after requeues (a wait still open counts until the end, if any)."""
        open_wait = 0.0
        if self.requeued_at is not None and self.ended_at is not None:
            open_wait = max(0.0, self.ended_at - self.requeued_at)
        return self.requeued_s + open_wait

    def running_s(self) -> float | None:
        """Seconds from Running to the end, less the waits after requeues meanwhile."""
        if self.running_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.running_at - self.requeued_after_start_s)


@dataclass
class Timeline:
    """The attempts of one run as observed: fed by the run's callbacks, read at the end."""

    attempts: list[AttemptTimes] = field(default_factory=list)

    @property
    def current(self) -> AttemptTimes | None:
        """The attempt being followed."""
        return self.attempts[-1] if self.attempts else None

    def submitted(self, ref: JobRef, at: float | None = None) -> None:
        """An attempt was submitted (or adopted)."""
        if self.current is not None and self.current.attempt == ref.attempt:
            return
        self.attempts.append(AttemptTimes(ref.attempt, time.time() if at is None else at))

    def observe(self, update: PhaseUpdate) -> None:
        """A phase change of the current attempt."""
        times = self.current
        if times is None:
            return
        at = update.observed_at
        hold = update.status.queue
        if update.phase == Phase.QUEUING and hold is not None and hold.requeued:
            if times.requeued_at is None:
                times.requeued_at = at
                times.requeues += 1
            times.requeues = max(times.requeues, hold.requeues)
        elif update.phase != Phase.QUEUING and times.requeued_at is not None:
            waited = max(0.0, at - times.requeued_at)
            times.requeued_s += waited
            if times.running_at is not None and times.running_at <= times.requeued_at:
                times.requeued_after_start_s += waited
            times.requeued_at = None
        if update.phase == Phase.QUEUING:
            times.queued_at = times.queued_at or at
            if update.admission is not None and update.admission.reason:
                times.queue_reason = update.admission.reason
            if update.admission is not None and update.admission.blocker:
                times.queue_blocker = str(update.admission.blocker)
        elif update.phase == Phase.ADMITTED:
            times.admitted_at = times.admitted_at or at
        elif update.phase in (Phase.RUNNING, Phase.RESTARTING):
            times.running_at = times.running_at or at
        elif update.phase.terminal:
            times.ended_at = at

    def queued_s(self) -> float | None:
        """Seconds spent waiting for admission, over every attempt."""
        values = [v for a in self.attempts if (v := a.queued_s()) is not None]
        return sum(values) if values else None

    def requeues(self) -> int:
        """How often a queue evicted and requeued the job, over every attempt."""
        return sum(a.requeues for a in self.attempts)

    def requeued_s(self) -> float | None:
        """Seconds spent waiting after requeues, over every attempt (``None``: no requeue)."""
        if not self.requeues():
            return None
        return sum(a.requeued_for() for a in self.attempts)

    def running_s(self) -> float | None:
        """Seconds spent running, over every attempt."""
        values = [v for a in self.attempts if (v := a.running_s()) is not None]
        return sum(values) if values else None

    def admission_reason(self) -> str:
        """The last reason a gang waited for (empty if it never queued)."""
        for times in reversed(self.attempts):
            if times.queue_reason:
                return times.queue_reason
        return ""

    def admission_blocker(self) -> str:
        """The category of what the gang last waited for (``InsufficientGPU``; empty: none)."""
        for times in reversed(self.attempts):
            if times.queue_reason:
                return times.queue_blocker
        return ""


class AttemptSummary(BaseModel):
    """One attempt of a logical job: its job and how it ended."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    name: str
    uid: str
    phase: str
    reason: str = ""
    retryable: bool | None = None


class TrainingResult(BaseModel):
    """How a training run ended: what a task returns, and what the summary artifact shows.

    Example:
        >>> result = TrainingResult(spec_name="mnist", key="nightly", phase="Succeeded",
        ...                         ref={"name": "mnist-x-a1"})
        >>> result.succeeded
        True
    """

    model_config = ConfigDict(frozen=True)

    spec_name: str
    key: str
    phase: str
    ref: dict[str, Any] = Field(description="The final attempt's JobRef.to_dict().")
    replayed: bool = False
    attempts: list[AttemptSummary] = Field(default_factory=list)
    queued_s: float | None = None
    requeues: int = Field(default=0, description="How often its queue evicted and requeued it.")
    requeued_s: float | None = Field(
        default=None, description="The part of queued_s waited after requeues."
    )
    running_s: float | None = None
    total_s: float | None = None
    admission_reason: str = ""
    admission_blocker: str = Field(
        default="", description="The category of what it waited for (InsufficientGPU...)."
    )
    diagnosis: dict[str, Any] | None = Field(
        default=None, description="Diagnosis.to_dict() of the failure, for a failed run."
    )
    checkpoint: str | None = None
    commands: list[str] = Field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """Whether the run succeeded."""
        return self.phase == Phase.SUCCEEDED

    @property
    def job_ref(self) -> JobRef:
        """The final attempt's reference."""
        return JobRef.from_dict(self.ref)

    def failure(self) -> Diagnosis | None:
        """The typed diagnosis of a failed run."""
        return Diagnosis.from_dict(self.diagnosis) if self.diagnosis else None


def job_commands(ref: JobRef) -> list[str]:
    """``kubectl`` commands to look at a job and read every replica's logs.

    For a job of the local backend (this machine), the shell commands that do the same with
    its directory in the workspace (the ref's namespace).
    """
    if ref.backend == "local":
        job = f"{ref.namespace}/jobs/{ref.name}"
        return [f"cat {job}/state.json", f"tail -n +1 {job}/logs/*.log"]
    kind = job_kind(ref.api_version, ref.kind)
    label, value = JobObjects(Dialect(ref.dialect), ref.name).pod_label
    return [
        f"kubectl get {kind} -n {ref.namespace} {ref.name}",
        f"kubectl describe {kind} -n {ref.namespace} {ref.name}",
        f"kubectl logs -n {ref.namespace} -l {label}={value} --prefix --all-containers --tail=-1",
    ]


def attempt_summaries(record: RunRecord | None) -> list[AttemptSummary]:
    """One summary per recorded attempt."""
    if record is None:
        return []
    return [
        AttemptSummary(
            attempt=a.attempt,
            name=a.name,
            uid=a.uid,
            phase=a.phase,
            reason=a.diagnosis.summary() if a.diagnosis is not None else (a.reason or a.message),
            retryable=a.diagnosis.retryable if a.diagnosis is not None else None,
        )
        for a in record.attempts
    ]


def training_result(
    *,
    spec_name: str,
    key: str,
    ref: JobRef,
    phase: str,
    timeline: Timeline,
    record: RunRecord | None,
    started_at: float,
    checkpoint: str | None,
    outcome: JobOutcome | None = None,
    diagnosis: Diagnosis | None = None,
    ended_at: float | None = None,
) -> TrainingResult:
    """The result of a run from what it observed and what was recorded."""
    diagnosis = diagnosis or (outcome.diagnosis if outcome is not None else None)
    end = time.time() if ended_at is None else ended_at
    return TrainingResult(
        spec_name=spec_name,
        key=key,
        phase=phase,
        ref=ref.to_dict(),
        replayed=bool(outcome is not None and outcome.replayed),
        attempts=attempt_summaries(record) or _watched_attempt(ref, outcome, diagnosis),
        queued_s=timeline.queued_s(),
        requeues=timeline.requeues(),
        requeued_s=timeline.requeued_s(),
        running_s=timeline.running_s(),
        total_s=max(0.0, end - started_at),
        admission_reason=timeline.admission_reason(),
        admission_blocker=timeline.admission_blocker(),
        diagnosis=diagnosis.to_dict() if diagnosis is not None else None,
        checkpoint=checkpoint,
        commands=job_commands(ref),
    )


def _watched_attempt(
    ref: JobRef, outcome: JobOutcome | None, diagnosis: Diagnosis | None
) -> list[AttemptSummary]:
    """The one attempt a run watched to its end, when no record was read."""
    if outcome is None:
        return []
    status = outcome.status
    return [
        AttemptSummary(
            attempt=ref.attempt,
            name=ref.name,
            uid=ref.uid,
            phase=str(status.phase),
            reason=diagnosis.summary() if diagnosis is not None else status.reason,
            retryable=diagnosis.retryable if diagnosis is not None else None,
        )
    ]
