"""The waiting machinery shared by every wait of the Kubernetes backend. Pure but for the clock.

- :class:`PhaseTracker` turns the states a wait observes into phase updates,
  reporting each change once;
- :class:`ReasonKeeper` keeps the most specific reason a job waits for, so that a vaguer message
  seen later (an event that expired, a PodGroup condition rewritten) does not replace it;
- the active deadline (``activeDeadlineSeconds``), which some operator versions never enforce;
- the timeout errors of each phase, with the last reason seen and a hint.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kubedl_prefect.errors import (
    AdmissionTimeoutError,
    CompletionTimeoutError,
    StartupTimeoutError,
    WaitTimeoutError,
)
from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import GENERIC_BLOCKERS, AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate, WaitTimeouts
from kubedl_prefect.lifecycle.diagnosis import Diagnosis, FailureCategory
from kubedl_prefect.lifecycle.status import JobStatus, Phase

_NOT_QUEUING = frozenset(
    {None, AdmissionBlocker.NOT_CREATED, AdmissionBlocker.OPERATOR_NOT_RUNNING}
)
_UNATTENDED = frozenset({AdmissionBlocker.OPERATOR_NOT_RUNNING})


class PhaseTracker:
    """Turns observed states into phase updates, reporting each change once."""

    def __init__(self, callback: Callable[[PhaseUpdate], object] | None):
        self.callback = callback
        self.history: list[PhaseUpdate] = []
        self._last: tuple[Phase, str, Any, int | None] | None = None

    def observe(self, status: JobStatus, admission: AdmissionState) -> PhaseUpdate | None:
        """Record what a wait sees now; return the update if it is news, else ``None``."""
        phase = status.phase
        # The queue's word comes first: a job its queue evicted is not admitted while its old
        # pods, still bound to their nodes, are stopping.
        held = status.queue is not None and not status.queue.admitted
        if phase in (Phase.CREATED, Phase.QUEUING):
            if admission.admitted and not held:
                phase = Phase.ADMITTED
            elif admission.blocker not in _NOT_QUEUING:
                phase = Phase.QUEUING
        # While queued, a new reason is news too: it is what the user waits on. A job no operator
        # has acted on stays Created, but that is news as well.
        unattended = phase == Phase.CREATED and admission.blocker in _UNATTENDED
        reason = admission.reason if phase == Phase.QUEUING or unattended else ""
        # A TrainJob's reported progress is news too (status.trainerStatus, whole percents).
        percent = status.trainer.percent if status.trainer is not None else None
        key = (phase, reason, tuple(sorted(status.replicas.items())), percent)
        if key == self._last:
            return None
        self._last = key
        update = PhaseUpdate(
            phase=phase,
            status=status,
            admission=admission if phase in (Phase.QUEUING, Phase.ADMITTED) or unattended else None,
            observed_at=time.time(),
        )
        self.history.append(update)
        if self.callback is not None:
            self.callback(update)
        return update


class ReasonKeeper:
    """Keeps a specific reason while the job makes no progress and later words are vaguer.

    A job refused by a quota says so in an event; an hour later the event has expired and only
    "pod group is not ready" is left. What the user waits on has not changed, so the specific
    reason is kept until the job moves (more pods created or scheduled) or another specific
    reason comes.
    """

    def __init__(self) -> None:
        self._kept: AdmissionState | None = None

    def keep(self, admission: AdmissionState) -> AdmissionState:
        """``admission``, or the specific state it would replace with a vaguer one."""
        if admission.admitted:
            self._kept = None
            return admission
        if admission.blocker not in GENERIC_BLOCKERS:
            self._kept = admission
            return admission
        kept = self._kept
        progress = (admission.scheduled, admission.pods, admission.expected)
        if kept is not None and (kept.scheduled, kept.pods, kept.expected) == progress:
            return replace(kept, recheck_in_s=admission.recheck_in_s)
        self._kept = None
        return admission


ACTIVE_DEADLINE_GRACE_S = 15.0
"""How long past ``activeDeadlineSeconds`` we wait for the operator before failing the job."""


def active_deadline_at(job: KubeObject, status: JobStatus) -> float | None:
    """Wall-clock time by which the operator should have failed the job, if it has a deadline."""
    spec = job.get("spec") or {}
    seconds = spec.get("activeDeadlineSeconds") or (spec.get("runPolicy") or {}).get(
        "activeDeadlineSeconds"
    )
    if not seconds or not status.start_time:
        return None
    started = dt.datetime.fromisoformat(status.start_time.replace("Z", "+00:00")).timestamp()
    return started + float(seconds) + ACTIVE_DEADLINE_GRACE_S


def seconds_until_overdue(
    job: KubeObject, status: JobStatus, *, now: float | None = None
) -> float | None:
    """Seconds until the job is overdue (0 when it is), ``None`` without an active deadline."""
    at = active_deadline_at(job, status)
    return None if at is None else max(at - (time.time() if now is None else now), 0.0)


def past_active_deadline(
    job: KubeObject, status: JobStatus, *, now: float | None = None
) -> Diagnosis | None:
    """A job the operator left running past its active deadline (some versions never fail it)."""
    at = active_deadline_at(job, status)
    if at is None or (time.time() if now is None else now) < at:
        return None
    return Diagnosis(
        category=FailureCategory.DEADLINE_EXCEEDED,
        retryable=False,
        replica=None,
        exit_code=None,
        message=f"the job ran past activeDeadlineSeconds (started {status.start_time}) and the "
        "operator did not stop it; kubedl-prefect deleted it",
        hint="raise activeDeadlineSeconds or make the run shorter",
    )


def admission_hint(admission: AdmissionState) -> str:
    """What to do about what holds the gang back."""
    if admission.hint:
        return admission.hint
    hints = {
        AdmissionBlocker.INSUFFICIENT_GPU: "ask for fewer GPUs per replica or fewer replicas, or "
        "wait for GPUs to free up",
        AdmissionBlocker.INSUFFICIENT_RESOURCES: "lower the replicas' CPU/memory requests",
        AdmissionBlocker.UNBOUND_PVC: "create the PersistentVolumeClaim or fix its storage class",
        AdmissionBlocker.UNTOLERATED_TAINT: "add a toleration for the nodes' taint to the spec",
        AdmissionBlocker.QUOTA: "raise the namespace's ResourceQuota or the Volcano queue's "
        "capability",
    }
    default = "describe the job's pods and PodGroups"
    return hints.get(admission.blocker, default) if admission.blocker else default


def admission_timeout(
    ref: JobRef, timeout_s: float | None, admission: AdmissionState
) -> AdmissionTimeoutError:
    """The error of an admission wait that ran out of time, with the last reason seen."""
    return AdmissionTimeoutError(
        f"{ref.kind} {ref.namespace}/{ref.name} was not admitted within {timeout_s or 0:g}s: "
        f"{admission.reason}",
        timeout_s=timeout_s or 0.0,
        last_reason=admission.reason,
        hint=admission_hint(admission),
        blocker=str(admission.blocker) if admission.blocker is not None else None,
        subject=admission.subject or None,
    )


def phase_timeout(
    ref: JobRef, stage: str, timeouts: WaitTimeouts, status: JobStatus, admission: AdmissionState
) -> WaitTimeoutError:
    """The error of a wait that ran out of time in ``stage`` (admission, startup, completion)."""
    where = f"{ref.kind} {ref.namespace}/{ref.name}"
    if stage == "admission":
        return admission_timeout(ref, timeouts.admission_s, admission)
    if stage == "startup":
        return StartupTimeoutError(
            f"{where} was admitted but did not start within {timeouts.startup_s or 0:g}s "
            f"(phase {status.phase})",
            timeout_s=timeouts.startup_s or 0.0,
            last_reason=status.message or str(status.phase),
        )
    return CompletionTimeoutError(
        f"{where} did not finish within {timeouts.completion_s or 0:g}s (phase {status.phase})",
        timeout_s=timeouts.completion_s or 0.0,
        last_reason=status.message or str(status.phase),
    )
