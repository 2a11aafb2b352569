"""Prefect events for training jobs, which automations can trigger on.

Names: ``kubedl.training-job.<what>`` with ``<what>`` one of :class:`JobEvent` (``created``,
``queued``, ``admitted``, ``running``, ``restarting``, ``succeeded``, ``failed``,
``cancelled``). Each attempt of a job is one resource, ``kubedl.training-job.<uid>``, labelled
with its namespace, name, uid, attempt, kind, dialect and cluster; the flow run, the task run and
the flow are related resources. The payload carries the phase, the replica counts per role and,
for ``queued`` and ``failed``, the one-line reason (and the diagnosis of a failure).

Event ids are derived from the job's uid, the event and the object's resourceVersion, so an event
emitted again (a flow re-attached after a crash sees the same changes) is the same event.

The model chain's events are the registry's and the serving layer's typed records, emitted as they
are (:func:`model_version_event`, :func:`inference_service_event`): ``kubedl.model-version.<what>``
(``registered``, ``ready``, ``promoted``, ``rejected``, ``alias-restored``), one resource per model
version, ``mlflow.model-version.<name>.<version>``; and ``kubedl.inference-service.<what>``
(``applied``, ``ready``, ``not-ready``, ``rolled-back``), one resource per InferenceService,
``kubernetes.inferenceservice.<namespace>.<name>``. Their ids are the records' deterministic ids;
the training job that made the model (:func:`training_job_related`) and, for a service, the model
version it serves are related resources besides the flow run and task run.

:func:`job_event` is pure; :func:`emit` sends through Prefect's events client, which queues and
never blocks the caller.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Final

from prefect.events import emit_event

from kubedl_prefect.errors import Diagnosis
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.registry.events import ModelVersionEvent
from kubedl_prefect.serving.events import InferenceServiceEvent

EVENT_PREFIX: Final = "kubedl.training-job"
"""The prefix of every event name, and of every job resource id."""

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
) -> EventSpec:
    """The event ``what`` of ``ref``'s job, from the phase update that shows it (if any).

    Example:
        >>> from kubedl_prefect.lifecycle.backend import JobRef
        >>> ref = JobRef(backend="kubernetes", cluster="https://10.0.0.1:6443", dialect="kubedl",
        ...              namespace="ml", name="mnist-x-a1", uid="0f1e",
        ...              api_version="training.kubedl.io/v1alpha1", kind="PyTorchJob",
        ...              key="nightly", attempt=1, spec_hash="ab12")
        >>> spec = job_event(ref, JobEvent.CREATED, at=0.0)
        >>> spec.event, spec.resource["prefect.resource.id"], spec.payload["phase"]
        ('kubedl.training-job.created', 'kubedl.training-job.0f1e', 'Created')
    """
    payload: dict[str, Any] = {"attempt": ref.attempt, "key": ref.key}
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
            if not reason and what == JobEvent.QUEUED:
                reason = update.admission.reason
                if update.admission.blocker is not None:
                    payload["blocker"] = str(update.admission.blocker)
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
    if reason and what in (JobEvent.QUEUED, JobEvent.FAILED, JobEvent.CANCELLED):
        payload["reason"] = reason.splitlines()[0][:500]
    when = dt.datetime.fromtimestamp(occurred, dt.UTC) if occurred is not None else _now()
    return EventSpec(
        event=what.event_name,
        resource=job_resource(ref),
        payload=payload,
        id=event_id(ref, what, version),
        occurred=when,
        related=list(related or []),
    )


def phase_event(
    ref: JobRef, update: PhaseUpdate, related: list[dict[str, str]] | None = None
) -> EventSpec | None:
    """The event a phase update tells, if any (``None`` for ``Created`` and ``Suspended``)."""
    what = PHASE_EVENTS.get(update.phase)
    if what is None:
        return None
    return job_event(ref, what, update=update, related=related)


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
        "prefect.resource.id": ModelVersionEvent("", model_name, version).resource_id,
        "prefect.resource.role": "model-version",
        "prefect.resource.name": f"{model_name} v{version}",
    }


def model_version_event(
    record: ModelVersionEvent, related: list[dict[str, str]] | None = None
) -> EventSpec:
    """The Prefect event of a registry record, with its resource and deterministic id.

    Example:
        >>> from kubedl_prefect.registry.events import PROMOTED, ModelVersionEvent
        >>> record = ModelVersionEvent(PROMOTED, "fraud", "3", {"reason": "better"})
        >>> spec = model_version_event(record)
        >>> spec.event, spec.resource["prefect.resource.id"], str(spec.id) == record.id
        ('kubedl.model-version.promoted', 'mlflow.model-version.fraud.3', True)
    """
    return EventSpec(
        event=record.event,
        resource={
            "prefect.resource.id": record.resource_id,
            "prefect.resource.name": f"{record.model_name} v{record.version}",
            "kubedl.model-name": record.model_name,
            "kubedl.model-version": record.version,
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

    Example:
        >>> from kubedl_prefect.serving.events import READY, InferenceServiceEvent
        >>> spec = inference_service_event(InferenceServiceEvent(READY, "ml", "fraud", "u1", "9",
        ...                                                      {"url": "http://fraud.ml"}))
        >>> spec.event, spec.resource["prefect.resource.id"], spec.payload["url"]
        ('kubedl.inference-service.ready', 'kubernetes.inferenceservice.ml.fraud', 'http://fraud.ml')
    """
    return EventSpec(
        event=record.event,
        resource={
            "prefect.resource.id": record.resource_id,
            "prefect.resource.name": record.name,
            "kubedl.namespace": record.namespace,
            "kubedl.name": record.name,
            "kubedl.uid": record.uid,
        },
        payload=dict(record.payload),
        id=uuid.UUID(record.id),
        occurred=_now(),
        related=list(related or []),
    )
