"""Re-attaching to a submitted job from any process: :func:`areattach` and :class:`TrainingRun`.

A :class:`~.backend.JobRef` is plain data a flow keeps (in a Prefect result, a database, a file).
In another process — a flow run retried after a crash, a monitoring script — :func:`areattach` turns
it back into a handle on the job, with a backend for the reference's cluster, namespace and
dialect, whatever defaults that process has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubedl_prefect.deprecation import renamed
from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.kube.credentials import Credentials
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    LogCallback,
    PhaseCallback,
    TrainingBackend,
    WaitTimeouts,
)
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend


@dataclass
class TrainingRun:
    """A handle on one submitted job: its reference and a backend that can reach it.

    Args:
        backend: The backend that follows the job.
        ref: The job's reference.
        owns_backend: Whether :meth:`close` closes the backend (it was made for this handle).
    """

    backend: TrainingBackend
    ref: JobRef
    owns_backend: bool = False

    async def wait_admitted(
        self, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        """:meth:`TrainingBackend.wait_admitted` for this job."""
        return await self.backend.wait_admitted(self.ref, timeout_s=timeout_s, on_phase=on_phase)

    async def wait_completed(
        self, *, timeouts: WaitTimeouts = WaitTimeouts(), on_phase: PhaseCallback | None = None
    ) -> JobOutcome:
        """:meth:`TrainingBackend.wait_completed` for this job."""
        return await self.backend.wait_completed(self.ref, timeouts=timeouts, on_phase=on_phase)

    async def follow_logs(self, on_line: LogCallback) -> None:
        """:meth:`TrainingBackend.follow_logs` for this job."""
        await self.backend.follow_logs(self.ref, on_line)

    async def cancel(self, *, timeout_s: float = 120.0) -> None:
        """:meth:`TrainingBackend.cancel` for this job."""
        await self.backend.cancel(self.ref, timeout_s=timeout_s)

    async def close(self) -> None:
        """Release the backend if this handle made it (the job is not touched)."""
        if self.owns_backend:
            await self.backend.close()


def as_ref(ref: JobRef | Mapping[str, Any] | str) -> JobRef:
    """A :class:`JobRef` from itself, its plain data or its JSON."""
    if isinstance(ref, JobRef):
        return ref
    if isinstance(ref, str):
        return JobRef.from_json(ref)
    if isinstance(ref, Mapping):
        return JobRef.from_dict(ref)
    raise KubeDLPrefectError(
        f"cannot attach to a {type(ref).__name__}",
        hint="pass a JobRef, JobRef.to_dict() or JobRef.to_json()",
    )


async def areattach(
    ref: JobRef | Mapping[str, Any] | str,
    *,
    backend: TrainingBackend | None = None,
    credentials: Credentials | None = None,
) -> TrainingRun:
    """Re-attach to the job of a saved reference, from any process.

    Args:
        ref: The reference, as a :class:`JobRef`, its ``to_dict()`` or its ``to_json()``.
        backend: The backend to follow it with; by default a Kubernetes backend made for the
            reference's namespace and dialect with ``credentials``.
        credentials: How to reach the reference's cluster (default: as
            :class:`KubernetesBackend` finds them).

    Raises:
        KubeDLPrefectError: The reference is malformed, or of another cluster or backend.
        JobCancelledError: The job is gone and its end was never recorded.

    Example:
        >>> async def report(saved: str) -> None:
        ...     run = await areattach(saved)
        ...     try:
        ...         outcome = await run.wait_completed()
        ...         print(outcome.status.phase)
        ...     finally:
        ...         await run.close()
    """
    job = as_ref(ref)
    owns = backend is None
    if backend is None:
        if job.backend != KubernetesBackend.name:
            raise KubeDLPrefectError(
                f"job reference {job.name} is of the {job.backend!r} backend",
                hint=f"pass backend= a {job.backend} backend to attach it",
            )
        backend = KubernetesBackend(
            namespace=job.namespace, dialect=job.dialect, credentials=credentials
        )
    try:
        current = await backend.attach(job)
    except BaseException:
        if owns:
            await backend.close()
        raise
    return TrainingRun(backend, current, owns_backend=owns)


_RENAMED = {"attach": "areattach"}


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, _RENAMED)
