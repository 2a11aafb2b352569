"""What happened to each attempt of a logical job, kept where a replay finds it. Pure logic.

A logical job is a spec name plus the caller's key. Its attempts are separate cluster jobs, and
clusters clean finished jobs up (``ttlSecondsAfterFinished``, a janitor, a person), so the jobs
themselves cannot tell a replay — a Prefect flow run retried days later — what happened. A
:class:`RunRecord` can: one small record per logical job (on Kubernetes a ConfigMap labelled like
the jobs, one data key per attempt, see :mod:`.kubernetes`), to which the backend writes each
attempt when it is submitted and its outcome when a wait sees it end. An adopted job that has
already ended keeps the end recorded for it.

:func:`replay_step` decides from a record where :func:`~.retry.arun_to_completion` starts: return
the recorded success, raise the recorded permanent failure, submit the next attempt after a
recorded retryable failure, or follow (adopt) the latest attempt whose end nobody saw.

An attempt that finished while nobody waited, and whose job was deleted before anybody looked, has
no recorded outcome; it cannot be told from a job that never ran, and is submitted again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kubedl_prefect.errors import (
    AdoptionRefusedError,
    Diagnosis,
    JobFailedError,
    KubeDLPrefectError,
)
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.spec import key_hash

RECORD_SCHEMA = 1
"""Version of :meth:`RunRecord.to_dict`'s layout."""


def record_name(spec_name: str, key: str) -> str:
    """The name of the record of the logical job ``(spec_name, key)``.

    Its jobs' names less the attempt suffix (``mnist-<key hash>``).
    """
    return f"{spec_name}-{key_hash(key)}"


def record_name_of(job_name: str) -> str:
    """The record name of the logical job an attempt's job name belongs to."""
    stem, _, attempt = job_name.rpartition("-a")
    return stem if attempt.isdigit() else job_name


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt: its job, and how it ended once someone saw it end.

    Args:
        attempt: The attempt number, from 1.
        name: The job's name in the cluster.
        uid: The uid the cluster gave it.
        phase: ``Submitted`` until an end was seen, then ``Succeeded`` or ``Failed``.
        reason: The reason of the terminal condition.
        message: Its message.
        start_time: When the job started (RFC 3339), if known.
        completion_time: When it ended (RFC 3339), if known.
        diagnosis: Why it failed, for a failed attempt.
        ref: The attempt's job reference as plain data (``JobRef.to_dict()``).
        recorded_at: When this entry was last written (Unix time).
    """

    attempt: int
    name: str
    uid: str
    phase: str = "Submitted"
    reason: str = ""
    message: str = ""
    start_time: str | None = None
    completion_time: str | None = None
    diagnosis: Diagnosis | None = None
    ref: dict[str, Any] | None = None
    recorded_at: float = 0.0

    @property
    def finished(self) -> bool:
        """Whether an end of this attempt was seen and recorded."""
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED)

    @property
    def succeeded(self) -> bool:
        """Whether it was seen succeeding."""
        return self.phase == Phase.SUCCEEDED

    def status(self) -> JobStatus:
        """The recorded end as a :class:`JobStatus` (replica counts are not kept)."""
        phase = Phase(self.phase) if self.finished else Phase.CREATED
        return JobStatus(
            phase=phase,
            reason=self.reason,
            message=self.message,
            start_time=self.start_time,
            completion_time=self.completion_time,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data."""
        return {
            "attempt": self.attempt,
            "name": self.name,
            "uid": self.uid,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "startTime": self.start_time,
            "completionTime": self.completion_time,
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis is not None else None,
            "ref": self.ref,
            "recordedAt": self.recorded_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptRecord:
        """Rebuild an entry written by :meth:`to_dict`."""
        diagnosis = data.get("diagnosis")
        return cls(
            attempt=int(data["attempt"]),
            name=str(data["name"]),
            uid=str(data.get("uid") or ""),
            phase=str(data.get("phase") or "Submitted"),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            start_time=data.get("startTime"),
            completion_time=data.get("completionTime"),
            diagnosis=Diagnosis.from_dict(diagnosis) if diagnosis else None,
            ref=dict(data["ref"]) if data.get("ref") else None,
            recorded_at=float(data.get("recordedAt") or 0.0),
        )


@dataclass(frozen=True)
class RunRecord:
    """Every attempt of one logical job ``(spec name, key)`` made from one spec.

    Args:
        spec_name: The spec's name.
        key: The caller's logical key.
        spec_hash: Hash of the spec the attempts were made from.
        attempts: One entry per attempt, by attempt number.
    """

    spec_name: str
    key: str
    spec_hash: str
    attempts: tuple[AttemptRecord, ...] = field(default=())

    @property
    def latest(self) -> AttemptRecord | None:
        """The attempt with the highest number, if any."""
        return max(self.attempts, key=lambda a: a.attempt, default=None)

    def get(self, attempt: int) -> AttemptRecord | None:
        """The entry of one attempt, if recorded."""
        return next((a for a in self.attempts if a.attempt == attempt), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, with its schema version."""
        return {
            "schemaVersion": RECORD_SCHEMA,
            "specName": self.spec_name,
            "key": self.key,
            "specHash": self.spec_hash,
            "attempts": [a.to_dict() for a in self.attempts],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Rebuild a record written by :meth:`to_dict`.

        Raises:
            KubeDLPrefectError: The data is of a newer layout than this version reads.
        """
        version = int(data.get("schemaVersion") or 0)
        if version > RECORD_SCHEMA:
            raise KubeDLPrefectError(
                f"the run record of {data.get('specName')!r} (key {data.get('key')!r}) has "
                f"layout version {version}; this kubedl-prefect reads up to {RECORD_SCHEMA}",
                hint="upgrade kubedl-prefect where this replay runs",
            )
        return cls(
            spec_name=str(data["specName"]),
            key=str(data["key"]),
            spec_hash=str(data["specHash"]),
            attempts=tuple(AttemptRecord.from_dict(a) for a in data.get("attempts") or []),
        )


@dataclass(frozen=True)
class ReplayStep:
    """Where a (re)started run of a logical job goes on.

    Args:
        action: ``start`` (nothing recorded: attempt 1), ``follow`` (adopt and follow
            ``attempt``, whose end nobody saw), ``next`` (the recorded ``previous`` failed and may
            be retried: submit ``attempt``), ``succeeded`` (return ``previous``'s recorded
            success), ``failed`` (raise ``previous``'s recorded failure).
        attempt: The attempt to submit or follow (for ``succeeded``/``failed``: ``previous``'s).
        previous: The recorded attempt the decision rests on.
    """

    action: Literal["start", "follow", "next", "succeeded", "failed"]
    attempt: int
    previous: AttemptRecord | None = None


def replay_step(record: RunRecord | None, *, max_attempts: int) -> ReplayStep:
    """Decide where a run of a logical job starts, from what was recorded of it.

    Args:
        record: The logical job's record, ``None`` when it never ran.
        max_attempts: The retry policy's limit on attempts in all.
    """
    latest = record.latest if record is not None else None
    if latest is None:
        return ReplayStep("start", 1)
    if not latest.finished:
        return ReplayStep("follow", latest.attempt, latest)
    if latest.succeeded:
        return ReplayStep("succeeded", latest.attempt, latest)
    retryable = latest.diagnosis is not None and latest.diagnosis.retryable
    if retryable and latest.attempt < max_attempts:
        return ReplayStep("next", latest.attempt + 1, latest)
    return ReplayStep("failed", latest.attempt, latest)


def recorded_failure(job: str, ended: AttemptRecord) -> JobFailedError:
    """The error that a recorded failed attempt raises again on a replay.

    Args:
        job: The job as messages name it (``PyTorchJob ml/mnist-...-a1``).
        ended: The attempt's recorded end.
    """
    diagnosis = ended.diagnosis
    summary = diagnosis.summary() if diagnosis is not None else ended.message or ended.reason
    return JobFailedError(
        f"{job} failed (recorded): {summary}",
        hint=diagnosis.hint if diagnosis is not None else None,
        retryable=diagnosis.retryable if diagnosis is not None else False,
        diagnosis=diagnosis,
        attempts=ended.attempt,
        ref=ended.ref,
    )


def other_spec(
    where: str, record: RunRecord, wanted_hash: str, remedy: str
) -> AdoptionRefusedError:
    """The refusal of a key whose record was made from another spec.

    Args:
        where: Where the record is (a namespace, a workspace).
        record: The record found.
        wanted_hash: The hash of the spec now asked for.
        remedy: What removes the old record (``delete the ConfigMap x``).
    """
    return AdoptionRefusedError(
        f"the logical job {record.spec_name!r} (key {record.key!r}) in {where} was run from "
        f"another spec (spec hash {record.spec_hash[:12]}, now {wanted_hash[:12]})",
        status=409,
        reason="AlreadyExists",
        hint=f"a changed spec needs a new key (or {remedy} that records the old runs)",
    )
