"""Prefect events for training jobs, which automations can trigger on.

Names: ``kubedl.training-job.<what>`` with ``<what>`` one of :class:`JobEvent` (``created``,
``queued``, ``admitted``, ``running``, ``restarting``, ``succeeded``, ``failed``,
``cancelled``, and for a job its queue (Kueue) evicted after admitting it, ``preempted`` and
``requeued``: :func:`eviction_events`). Each attempt of a job is one resource,
``kubedl.training-job.<uid>``, labelled with its namespace, name, uid, attempt, kind, dialect and
cluster, and with what an automation matches on (:data:`LABEL_REASON`, :data:`LABEL_BLOCKER`,
:data:`LABEL_DIAGNOSIS`, :data:`LABEL_RETRYABLE`, :data:`LABEL_REPLICA`, :data:`LABEL_EXIT_CODE`):
Prefect's triggers match resource labels, never the payload, as Prefect's own Kubernetes
integration labels its pod events ``kubernetes.reason`` and ``kubernetes.diagnosis``. Label
values are the stable categories (:class:`~kubedl_prefect.lifecycle.admission.AdmissionBlocker`,
:class:`~kubedl_prefect.errors.FailureCategory`, :class:`CancelReason`). The flow run, the task
run, the flow, the deployment, its work pool and work queue are related resources
(:meth:`~kubedl_prefect.prefect.context.RunContext.related`). The payload carries the phase, the
replica counts per role and, for ``queued``, ``requeued``, ``preempted``, ``failed`` and
``cancelled``, the one-line reason (and the diagnosis of a failure).

Event ids are derived from the job's uid, the event and the object's resourceVersion, so an event
emitted again (a flow re-attached after a crash sees the same changes) is the same event.

The model chain's events are the registry's and the serving layer's typed records
(:func:`model_version_event`, :func:`inference_service_event`): ``kubedl.model-version.<what>``
(``registered``, ``ready``, ``promoted``, ``rejected``, ``alias-restored``), one resource per model
version, ``kubedl.model-version.<name>.<version>``; and ``kubedl.inference-service.<what>``
(``applied``, ``ready``, ``not-ready``, ``rolled-back``), one resource per InferenceService,
``kubedl.inference-service.<namespace>.<name>``. Their ids are the records' deterministic ids;
the training job that made the model (:func:`training_job_related`) and, for a service, the model
version it serves are related resources besides the flow run and task run.

:func:`job_event` is pure; :func:`emit` sends through Prefect's events client, which queues and
never blocks the caller.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Final

from prefect.events import emit_event

from kubedl_prefect.errors import Diagnosis
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.registry.events import ModelVersionEvent, model_version_id
from kubedl_prefect.registry.gate import TAG_DECISION
from kubedl_prefect.serving.events import InferenceServiceEvent, inference_service_id

EVENT_PREFIX: Final = "kubedl.training-job"
"""The prefix of every event name, and of every job resource id."""

LABEL_REASON: Final = "kubedl.reason"
"""Why a ``queued``, ``requeued``, ``preempted``, ``failed`` or ``cancelled`` event happened, as a
category: the blocker (``InsufficientQuota``), the eviction (``Preempted``, ``PodsReadyTimeout``),
the preemption (``InClusterQueue``, ``InCohortReclamation``), the failure's category, or the
:class:`CancelReason`."""
LABEL_BLOCKER: Final = "kubedl.blocker"
"""What holds the attempt back (``queued``), or what it last waited for (its later events)."""
LABEL_DIAGNOSIS: Final = "kubedl.diagnosis"
"""The failure's :class:`~kubedl_prefect.errors.FailureCategory` (``failed``)."""
LABEL_RETRYABLE: Final = "kubedl.retryable"
"""``true`` or ``false``: whether running the spec again may succeed (``failed``)."""
LABEL_REPLICA: Final = "kubedl.replica"
"""The replica that showed the failure (``worker-1``), when one did."""
LABEL_EXIT_CODE: Final = "kubedl.exit-code"
"""Its container's exit code, when it exited."""

_ID_NAMESPACE: Final = uuid.UUID("6f1d0f7e-8b1e-4c55-9a4e-2f4b6b8c0d11")


class JobEvent(StrEnum):
    """What happened to a training job (the last part of the event name; a stable contract)."""

    CREATED = "created"
    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    """Its queue evicted the admitted job and queues the same job again."""
    PREEMPTED = "preempted"
    """Its queue evicted it to make room for another workload (told before ``requeued``)."""

    @property
    def event_name(self) -> str:
        """The full event name, ``kubedl.training-job.<value>``."""
        return f"{EVENT_PREFIX}.{self.value}"


PHASE_EVENTS: Final = {
    Phase.QUEUING: JobEvent.QUEUED,
    Phase.ADMITTED: JobEvent.ADMITTED,
    Phase.RUNNING: JobEvent.RUNNING,
    Phase.RESTARTING: JobEvent.RESTARTING,
    Phase.SUCCEEDED: JobEvent.SUCCEEDED,
    Phase.FAILED: JobEvent.FAILED,
}
"""The event of each phase change (``Created`` is told by :attr:`JobEvent.CREATED` at submission,
``Suspended`` by none)."""


class CancelReason(StrEnum):
    """Why a job was deleted: the :data:`LABEL_REASON` of ``cancelled`` (a stable contract)."""

    CANCELLED = "Cancelled"
    """The flow cancelled it (``run.cancel()``, ``cancel_training_job``)."""
    FLOW_RUN_CANCELLED = "FlowRunCancelled"
    """Its flow run was cancelled (the clean-up hook)."""
    FLOW_RUN_CRASHED = "FlowRunCrashed"
    """Its flow run crashed (the clean-up hook)."""
    ROLLED_BACK = "RolledBack"
    """A later step of its transaction failed."""
    ADMISSION_TIMEOUT = "AdmissionTimeout"
    """It was not admitted in time (the job is deleted)."""
    STARTUP_TIMEOUT = "StartupTimeout"
    """Its replicas did not start in time (the job is deleted)."""
    COMPLETION_TIMEOUT = "CompletionTimeout"
    """It did not end in time (the job is deleted)."""
    DELETED = "Deleted"
    """Someone else deleted it."""

    @classmethod
    def of_timeout(cls, phase: str) -> CancelReason:
        """The reason of a wait that ran out of time in ``phase`` (``admission``...)."""
        return {
            "admission": cls.ADMISSION_TIMEOUT,
            "startup": cls.STARTUP_TIMEOUT,
        }.get(phase, cls.COMPLETION_TIMEOUT)


@dataclass(frozen=True)
class EventSpec:
    """One event, ready to emit."""

    event: str
    resource: dict[str, str]
    payload: dict[str, Any]
    id: uuid.UUID
    occurred: dt.datetime
    related: list[dict[str, str]] = field(default_factory=list)


def job_resource(ref: JobRef) -> dict[str, str]:
    """The event resource of one attempt's job (no credential: the cluster is its URL)."""
    return {
        "prefect.resource.id": f"{EVENT_PREFIX}.{ref.uid or f'{ref.namespace}.{ref.name}'}",
        "prefect.resource.name": ref.name,
        "kubedl.namespace": ref.namespace,
        "kubedl.name": ref.name,
        "kubedl.uid": ref.uid,
        "kubedl.attempt": str(ref.attempt),
        "kubedl.kind": ref.kind,
        "kubedl.dialect": ref.dialect,
        "kubedl.cluster": ref.cluster,
    }


def diagnosis_labels(diagnosis: Diagnosis) -> dict[str, str]:
    """A diagnosis as resource labels: category, retryable and, where known, replica, exit code.

    Example:
        >>> from kubedl_prefect.errors import FailureCategory
        >>> diagnosis_labels(Diagnosis(FailureCategory.OUT_OF_MEMORY, False, "worker-1", 137,
        ...                            "OOMKilled", "ask for more memory"))
        {'kubedl.diagnosis': 'OutOfMemory', 'kubedl.retryable': 'false', \
'kubedl.replica': 'worker-1', 'kubedl.exit-code': '137'}
    """
    labels = {
        LABEL_DIAGNOSIS: str(diagnosis.category),
        LABEL_RETRYABLE: "true" if diagnosis.retryable else "false",
    }
    if diagnosis.replica:
        labels[LABEL_REPLICA] = diagnosis.replica
    if diagnosis.exit_code is not None:
        labels[LABEL_EXIT_CODE] = str(diagnosis.exit_code)
    return labels


def event_id(ref: JobRef, what: JobEvent, version: str) -> uuid.UUID:
    """The deterministic id of event ``what`` of ``ref``'s job at resourceVersion ``version``."""
    return uuid.uuid5(_ID_NAMESPACE, f"{ref.uid or ref.name}/{what.value}/{version}")


def job_event(
    ref: JobRef,
    what: JobEvent,
    *,
    update: PhaseUpdate | None = None,
    reason: str = "",
    diagnosis: Diagnosis | None = None,
    related: list[dict[str, str]] | None = None,
    at: float | None = None,
    category: str = "",
    blocker: str = "",
) -> EventSpec:
    """The event ``what`` of ``ref``'s job, from the phase update that shows it (if any).

    Args:
        ref: The attempt's job.
        what: What happened.
        update: The phase update that shows it.
        reason: The one-line reason (default: the admission's, the status's or the diagnosis').
        diagnosis: A failure's diagnosis: in the payload and as labels.
        related: The related resources (the Prefect run).
        at: When it happened (default: the update's time, else now).
        category: The :data:`LABEL_REASON` (default: the blocker of ``queued``, the diagnosis'
            category of ``failed``, :attr:`CancelReason.CANCELLED` for ``cancelled``).
        blocker: The :data:`LABEL_BLOCKER`: what the attempt waited for (default: the
            update's, while queued).

    Example:
        >>> from kubedl_prefect.lifecycle.backend import JobRef
        >>> ref = JobRef(backend="kubernetes", cluster="https://10.0.0.1:6443", dialect="kubedl",
        ...              namespace="ml", name="mnist-x-a1", uid="0f1e",
        ...              api_version="training.kubedl.io/v1alpha1", kind="PyTorchJob",
        ...              key="nightly", attempt=1, spec_hash="ab12")
        >>> spec = job_event(ref, JobEvent.CREATED, at=0.0)
        >>> spec.event, spec.resource["prefect.resource.id"], spec.payload["phase"]
        ('kubedl.training-job.created', 'kubedl.training-job.0f1e', 'Created')
        >>> spec = job_event(ref, JobEvent.CANCELLED, reason="not admitted in 600 s", at=0.0,
        ...                  category=CancelReason.ADMISSION_TIMEOUT, blocker="InsufficientGPU")
        >>> spec.resource["kubedl.reason"], spec.resource["kubedl.blocker"]
        ('AdmissionTimeout', 'InsufficientGPU')
    """
    payload: dict[str, Any] = {"attempt": ref.attempt, "key": ref.key}
    labels: dict[str, str] = {}
    version = ""
    occurred = at
    if update is not None:
        status = update.status
        payload["phase"] = str(update.phase)
        payload["replicas"] = {
            role: asdict(counts) for role, counts in sorted(status.replicas.items())
        }
        if update.admission is not None:
            payload["scheduled"] = update.admission.scheduled
            payload["expected"] = update.admission.expected
            if what == JobEvent.QUEUED:
                if update.admission.blocker is not None:
                    payload["blocker"] = str(update.admission.blocker)
                    blocker = str(update.admission.blocker)
                if not reason:
                    reason = update.admission.reason
        if not reason and what == JobEvent.FAILED:
            reason = status.message or status.reason
        version = f"{status.resource_version}/{reason}"
        occurred = update.observed_at if occurred is None else occurred
    else:
        payload["phase"] = {
            JobEvent.CREATED: str(Phase.CREATED),
            JobEvent.CANCELLED: "Cancelled",
            JobEvent.FAILED: str(Phase.FAILED),
            JobEvent.SUCCEEDED: str(Phase.SUCCEEDED),
        }.get(what, what.value.capitalize())
        version = reason
    if diagnosis is not None:
        payload["diagnosis"] = diagnosis.to_dict()
        reason = reason or diagnosis.summary()
        labels.update(diagnosis_labels(diagnosis))
    if reason and what in _REASONED:
        payload["reason"] = reason.splitlines()[0][:500]
    if not category:
        if what == JobEvent.QUEUED:
            category = blocker or "Waiting"
        elif what == JobEvent.FAILED:
            category = str(diagnosis.category) if diagnosis is not None else "Unknown"
        elif what == JobEvent.CANCELLED:
            category = CancelReason.CANCELLED
    if category:
        labels[LABEL_REASON] = str(category)
    if blocker:
        labels[LABEL_BLOCKER] = blocker
    when = dt.datetime.fromtimestamp(occurred, dt.UTC) if occurred is not None else _now()
    return EventSpec(
        event=what.event_name,
        resource={**job_resource(ref), **labels},
        payload=payload,
        id=event_id(ref, what, version),
        occurred=when,
        related=list(related or []),
    )


def phase_event(
    ref: JobRef,
    update: PhaseUpdate,
    related: list[dict[str, str]] | None = None,
    *,
    blocker: str = "",
    diagnosis: Diagnosis | None = None,
) -> EventSpec | None:
    """The event a phase update tells, if any (``None`` for ``Created`` and ``Suspended``).

    ``blocker`` is what the attempt last waited for (a label of every later event of it).
    """
    what = PHASE_EVENTS.get(update.phase)
    if what is None:
        return None
    return job_event(
        ref, what, update=update, related=related, blocker=blocker, diagnosis=diagnosis
    )


def eviction_events(
    ref: JobRef,
    update: PhaseUpdate,
    related: list[dict[str, str]] | None = None,
    *,
    blocker: str = "",
) -> list[EventSpec]:
    """The ``preempted`` and ``requeued`` events of an update showing the job's queue evicted it.

    None unless the update's status says its queue requeued it (:attr:`JobStatus.queue
    <kubedl_prefect.lifecycle.status.JobStatus.queue>`); the caller tells them once per
    eviction. ``requeued``'s :data:`LABEL_REASON` is the eviction (``Preempted``,
    ``PodsReadyTimeout``, ``NodeFailures``), ``preempted``'s the preemption Kueue named
    (``InClusterQueue``, ``InCohortReclamation``...) or ``Preempted``; both carry the blocker
    the job now waits for and, in the payload, the eviction, its message and the requeue count.

    Example:
        >>> from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
        >>> from kubedl_prefect.lifecycle.status import JobStatus, Phase, QueueHold
        >>> ref = JobRef(backend="kubernetes", cluster="https://10.0.0.1:6443",
        ...              dialect="kubeflow", namespace="ml", name="mnist-x-a1", uid="0f1e",
        ...              api_version="kubeflow.org/v1", kind="PyTorchJob", key="nightly",
        ...              attempt=1, spec_hash="ab12")
        >>> hold = QueueHold(False, True, "Preempted", "Preempted to accommodate a workload",
        ...                  requeues=1, preemption="InClusterQueue")
        >>> status = JobStatus(Phase.QUEUING, reason="Requeued", message="requeued: Preempted",
        ...                    resource_version="9", queue=hold)
        >>> events = eviction_events(ref, PhaseUpdate(Phase.QUEUING, status, None, 0.0),
        ...                          blocker="Requeued")
        >>> [(e.event, e.resource["kubedl.reason"]) for e in events]
        [('kubedl.training-job.preempted', 'InClusterQueue'), \
('kubedl.training-job.requeued', 'Preempted')]
        >>> events[1].payload["requeues"], events[1].resource["kubedl.blocker"]
        (1, 'Requeued')
    """
    hold = update.status.queue
    if hold is None or not hold.requeued:
        return []
    told = [(JobEvent.REQUEUED, hold.reason or "Evicted")]
    if hold.reason == "Preempted":
        told.insert(0, (JobEvent.PREEMPTED, hold.preemption or "Preempted"))
    events = []
    for what, category in told:
        event = job_event(
            ref,
            what,
            update=update,
            reason=update.status.message or f"requeued: {hold.reason}",
            related=related,
            category=category,
            blocker=blocker,
        )
        event.payload.update(
            evicted=hold.reason, eviction_message=hold.message[:500], requeues=hold.requeues
        )
        events.append(event)
    return events


def emit(spec: EventSpec) -> bool:
    """Send one event to Prefect (queued; never blocks). Whether events are on at all."""
    sent = emit_event(
        event=spec.event,
        resource=spec.resource,
        related=spec.related,
        payload=spec.payload,
        id=spec.id,
        occurred=spec.occurred,
    )
    return sent is not None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


_REASONED: Final = frozenset(
    {JobEvent.QUEUED, JobEvent.REQUEUED, JobEvent.PREEMPTED, JobEvent.FAILED, JobEvent.CANCELLED}
)
"""The events whose payload carries the one-line reason."""


# -- the model chain: model versions and InferenceServices ----------------------------------


def training_job_related(uid: str | None, name: str | None = None) -> list[dict[str, str]]:
    """The training job that made a model, as a related resource (none without its uid).

    Example:
        >>> training_job_related("0f1e", "mnist-x-a1")[0]["prefect.resource.id"]
        'kubedl.training-job.0f1e'
        >>> training_job_related("")
        []
    """
    if not uid:
        return []
    return [
        {
            "prefect.resource.id": f"{EVENT_PREFIX}.{uid}",
            "prefect.resource.role": "training-job",
            "prefect.resource.name": name or "",
        }
    ]


def model_version_related(model_name: str, version: str) -> dict[str, str]:
    """A model version as a related resource (of the InferenceService that serves it)."""
    return {
        "prefect.resource.id": model_version_id(model_name, version),
        "prefect.resource.role": "model-version",
        "prefect.resource.name": f"{model_name} v{version}",
    }


def inference_service_related(namespace: str, name: str) -> dict[str, str]:
    """An InferenceService as a related resource (of the model version it serves)."""
    return {
        "prefect.resource.id": inference_service_id(namespace, name),
        "prefect.resource.role": "inference-service",
        "prefect.resource.name": name,
    }


def _category_label(payload: Mapping[str, Any], key: str) -> dict[str, str]:
    """``{LABEL_REASON: payload[key]}`` when that value is a category (``ModelLoadFailed``)."""
    value = payload.get(key)
    if isinstance(value, str) and _CATEGORY.fullmatch(value):
        return {LABEL_REASON: value}
    return {}


_CATEGORY: Final = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")


def model_version_event(
    record: ModelVersionEvent, related: list[dict[str, str]] | None = None
) -> EventSpec:
    """The Prefect event of a registry record, with its resource and deterministic id.

    A gate's decision is the :data:`LABEL_REASON` of ``promoted`` and ``rejected``.

    Example:
        >>> from kubedl_prefect.registry.events import PROMOTED, ModelVersionEvent
        >>> record = ModelVersionEvent(PROMOTED, "fraud", "3", {"reason": "better"})
        >>> spec = model_version_event(record)
        >>> spec.event, spec.resource["prefect.resource.id"], str(spec.id) == record.id
        ('kubedl.model-version.promoted', 'kubedl.model-version.fraud.3', True)
    """
    return EventSpec(
        event=record.event,
        resource={
            "prefect.resource.id": model_version_id(record.model_name, record.version),
            "prefect.resource.name": f"{record.model_name} v{record.version}",
            "kubedl.model-name": record.model_name,
            "kubedl.model-version": record.version,
            **_category_label(record.payload, TAG_DECISION),
        },
        payload=dict(record.payload),
        id=uuid.UUID(record.id),
        occurred=_now(),
        related=list(related or []),
    )


def inference_service_event(
    record: InferenceServiceEvent, related: list[dict[str, str]] | None = None
) -> EventSpec:
    """The Prefect event of a serving record, with its resource and deterministic id.

    The reason of ``not-ready`` (``ModelLoadFailed``...) is its :data:`LABEL_REASON`.

    Example:
        >>> from kubedl_prefect.serving.events import NOT_READY, InferenceServiceEvent
        >>> spec = inference_service_event(InferenceServiceEvent(
        ...     NOT_READY, "ml", "fraud", "u1", "9", {"reason": "ModelLoadFailed"}))
        >>> spec.resource["prefect.resource.id"], spec.resource["kubedl.reason"]
        ('kubedl.inference-service.ml.fraud', 'ModelLoadFailed')
    """
    return EventSpec(
        event=record.event,
        resource={
            "prefect.resource.id": inference_service_id(record.namespace, record.name),
            "prefect.resource.name": record.name,
            "kubedl.namespace": record.namespace,
            "kubedl.name": record.name,
            "kubedl.uid": record.uid,
            **_category_label(record.payload, "reason"),
        },
        payload=dict(record.payload),
        id=uuid.UUID(record.id),
        occurred=_now(),
        related=list(related or []),
    )
