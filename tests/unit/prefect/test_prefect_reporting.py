"""What the reporter tells Prefect for a sequence of phase updates (events captured)."""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any

import pytest

from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.status import JobStatus, Phase, ReplicaCounts
from kubedl_prefect.prefect import reporting
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import EventSpec

REF = JobRef(
    backend="kubernetes",
    cluster="https://k:6443",
    dialect="kubedl",
    namespace="ml",
    name="mnist-abc-a1",
    uid="u1",
    api_version="training.kubedl.io/v1alpha1",
    kind="PyTorchJob",
    key="k",
    attempt=1,
    spec_hash="h",
)


class NoReplicas:
    """A backend that cannot list replicas (the reporter then keeps no table)."""


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[EventSpec]:
    captured: list[EventSpec] = []

    def emit(spec: EventSpec) -> bool:
        captured.append(spec)
        return True

    monkeypatch.setattr(reporting, "emit", emit)
    return captured


def reporter() -> reporting.JobReporter:
    ctx = RunContext(
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        logging.getLogger("t"),
        contextvars.copy_context(),
    )
    made = reporting.JobReporter(ctx, NoReplicas(), "mnist-abc")  # type: ignore[arg-type]
    made.attempt(REF)
    return made


def update(phase: Phase, rv: str, active: int = 0, reason: str = "") -> PhaseUpdate:
    admission = AdmissionState(False, AdmissionBlocker.INSUFFICIENT_GPU, reason) if reason else None
    status = JobStatus(
        phase=phase, replicas={"worker": ReplicaCounts(active=active)}, resource_version=rv
    )
    return PhaseUpdate(phase, status, admission, time.time())


def names(sent: list[EventSpec]) -> list[str]:
    return [e.event.removeprefix("kubedl.training-job.") for e in sent]


def test_one_event_per_phase_and_per_queue_reason(sent: list[EventSpec]) -> None:
    report = reporter()
    for item in (
        update(Phase.QUEUING, "1", reason="0/2 nodes: Insufficient nvidia.com/gpu"),
        update(Phase.QUEUING, "2", reason="0/2 nodes: Insufficient nvidia.com/gpu"),
        update(Phase.QUEUING, "3", reason="PodGroup waiting in Queue default"),
        update(Phase.ADMITTED, "4"),
        update(Phase.RUNNING, "5", active=1),
        update(Phase.RUNNING, "6", active=2),
        update(Phase.SUCCEEDED, "7"),
    ):
        report._phase(item)
    assert names(sent) == ["created", "queued", "queued", "admitted", "running", "succeeded"]


def test_a_job_first_seen_running_is_still_told_admitted(sent: list[EventSpec]) -> None:
    report = reporter()
    report._phase(update(Phase.RUNNING, "5", active=2))
    report._phase(update(Phase.SUCCEEDED, "6"))
    assert names(sent) == ["created", "admitted", "running", "succeeded"]
    admitted: dict[str, Any] = sent[1].payload
    assert admitted["phase"] == "Admitted"
