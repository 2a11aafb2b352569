"""The backend-neutral lifecycle interface.

A backend runs training jobs somewhere: on Kubernetes through an operator
(:class:`~kubedl_prefect.lifecycle.kubernetes.KubernetesBackend`), or as local processes under the
same environment contract (the embedded default). Everything above this layer — retries, the
Prefect surface — talks to :class:`TrainingBackend` only.

Every method is a coroutine. Sync callers use :class:`SyncBackend`, which runs the same coroutines
on the process-wide Kubernetes runtime loop: one implementation, two faces.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.diagnosis import Diagnosis
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.spec import TrainingJobSpec

T = TypeVar("T")


def checkpoint_location(spec: TrainingJobSpec, key: str) -> str | None:
    """Where every attempt of the logical job ``(spec.name, key)`` keeps its checkpoints.

    ``<spec.checkpoint.location>/<name>-<16 hex of sha256(key)>``: the same for every attempt of
    one key, so a retry resumes; different for two keys, so two jobs never share one.
    """
    if spec.checkpoint is None:
        return None
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return f"{spec.checkpoint.location.rstrip('/')}/{spec.name}-{digest}"


@dataclass(frozen=True)
class JobRef:
    """Everything needed to find a submitted job again, even from another process.

    It is plain data (see :meth:`to_dict`), so a flow can persist it and a restarted flow can
    re-attach to the job instead of launching a duplicate.

    Args:
        backend: Which backend runs it (``kubernetes``, ``local``).
        namespace: Where it runs (a Kubernetes namespace, or the local backend's workspace).
        name: The job's name in the cluster (deterministic from the key and attempt).
        uid: The uid the cluster gave it; tells a re-created job of the same name apart.
        api_version: ``apiVersion`` of the job object.
        kind: ``kind`` of the job object.
        key: The caller's logical key (a flow run, a schedule slot).
        attempt: The attempt number, from 1.
        spec_hash: Hash of the spec it was made from.
    """

    backend: str
    namespace: str
    name: str
    uid: str
    api_version: str
    kind: str
    key: str
    attempt: int
    spec_hash: str

    def to_dict(self) -> dict[str, Any]:
        """The reference as plain data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRef:
        """Rebuild a reference saved with :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class WaitTimeouts:
    """Time limits for each waiting phase, in seconds (``None``: no limit).

    Deadlines are measured on a monotonic clock from the start of each phase.

    Args:
        admission_s: From submission until every replica is scheduled.
        startup_s: From admission until the job is Running.
        completion_s: From Running until Succeeded or Failed.
        cancel_s: How long a cancellation waits for pods and PodGroups to be gone.
    """

    admission_s: float | None = 600.0
    startup_s: float | None = 600.0
    completion_s: float | None = None
    cancel_s: float = 120.0


@dataclass(frozen=True)
class PhaseUpdate:
    """One observed change of a job's phase (or of its replica counts).

    Args:
        phase: The phase now.
        status: The job's status behind it.
        admission: The admission state, while queued or just admitted.
        observed_at: When we saw it (Unix time, seconds).
    """

    phase: Phase
    status: JobStatus
    admission: AdmissionState | None
    observed_at: float


@dataclass(frozen=True)
class LogLine:
    """One line of one replica's container log.

    Args:
        replica: ``master-0``, ``worker-1``...
        container: The container's name.
        timestamp: The RFC 3339 time the runtime recorded it at.
        text: The line, without its newline.
        attempt: The attempt of the job it belongs to.
    """

    replica: str
    container: str
    timestamp: str
    text: str
    attempt: int = 1


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended: its final status, and the diagnosis when it failed."""

    ref: JobRef
    status: JobStatus
    diagnosis: Diagnosis | None = None
    history: tuple[PhaseUpdate, ...] = field(default=())

    @property
    def succeeded(self) -> bool:
        """Whether the job succeeded."""
        return self.status.phase == Phase.SUCCEEDED


PhaseCallback = Callable[[PhaseUpdate], None]
LogCallback = Callable[[LogLine], None]


@runtime_checkable
class TrainingBackend(Protocol):
    """Runs training jobs. Implemented by the Kubernetes and the local-process backends."""

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        """Create the job for ``(key, attempt)``, or adopt it if it exists and is ours."""
        ...

    async def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        """Wait until every replica is scheduled; raise ``AdmissionTimeoutError`` otherwise."""
        ...

    async def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        """Follow the job to Succeeded or Failed; failures come back diagnosed, not raised."""
        ...

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        """Deliver every replica's log lines until the job ends."""
        ...

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        """Delete the job and wait until its pods (and PodGroups) are gone. Idempotent."""
        ...

    async def close(self) -> None:
        """Release the backend's connections (jobs are not touched)."""
        ...


class SyncBackend:
    """The blocking face of a :class:`TrainingBackend`, for sync code (Prefect sync tasks).

    Each method has the same signature as its async twin and runs it on the process-wide
    :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop.
    """

    def __init__(self, backend: TrainingBackend):
        self.backend = backend

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return KubeRuntime.get().run_sync(coro)

    def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        """Blocking :meth:`TrainingBackend.submit`."""
        return self._run(self.backend.submit(spec, key=key, attempt=attempt, dry_run=dry_run))

    def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        """Blocking :meth:`TrainingBackend.wait_admitted`."""
        return self._run(self.backend.wait_admitted(ref, timeout_s=timeout_s, on_phase=on_phase))

    def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        """Blocking :meth:`TrainingBackend.wait_completed`."""
        return self._run(self.backend.wait_completed(ref, timeouts=timeouts, on_phase=on_phase))

    def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        """Blocking :meth:`TrainingBackend.follow_logs`."""
        return self._run(self.backend.follow_logs(ref, on_line))

    def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        """Blocking :meth:`TrainingBackend.cancel`."""
        return self._run(self.backend.cancel(ref, timeout_s=timeout_s))

    def close(self) -> None:
        """Blocking :meth:`TrainingBackend.close`."""
        return self._run(self.backend.close())
