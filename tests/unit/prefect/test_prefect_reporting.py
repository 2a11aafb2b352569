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


def test_task_runs_are_named_after_the_spec() -> None:
    from pathlib import Path

    from kubedl_prefect.prefect.blocks import LocalCluster, TrainingJob
    from kubedl_prefect.prefect.tasks import (
        arun_training_job,
        run_training_job,
        submit_training_job,
        watch_completion,
    )

    spec = Path(__file__).resolve().parents[3] / "examples" / "pytorch-mnist.yaml"
    job = TrainingJob.from_spec_file(str(spec), cluster=LocalCluster())
    name = job.training_spec().name
    for task in (run_training_job, arun_training_job, watch_completion):
        assert callable(task.task_run_name)
        assert task.task_run_name(parameters={"job": job}) == f"train {name}"
    assert submit_training_job.task_run_name(parameters={"job": job}) == f"submit {name}"
    # A block given by name is named by it until the spec is known (see below).
    assert run_training_job.task_run_name(parameters={"job": "nightly"}) == "train nightly"


def test_a_training_task_run_is_renamed_at_each_later_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace
    from uuid import uuid4

    renamed: list[tuple[Any, str]] = []

    class Client:
        def __enter__(self) -> Client:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def set_task_run_name(self, task_run_id: Any, name: str) -> None:
            renamed.append((task_run_id, name))

    import prefect.client.orchestration

    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda **_: Client())
    monkeypatch.setattr(reporting, "emit", lambda _: True)
    task_run_id = uuid4()
    ctx = RunContext(
        uuid4(),
        "r",
        None,
        None,
        None,
        task_run_id,
        "train mnist",
        "run-training-job",
        logging.getLogger("t"),
        contextvars.copy_context(),
    )
    made = reporting.JobReporter(ctx, NoReplicas(), "train-mnist", spec_name="mnist")  # type: ignore[arg-type]
    made.attempt(REF)  # the name is right already: no request
    made.attempt(replace(REF, attempt=2, uid="u2", name="mnist-abc-a2"))
    made.attempt(replace(REF, attempt=2, uid="u2", name="mnist-abc-a2"))  # the same: none
    assert renamed == [(task_run_id, "train mnist (attempt 2)")]
    assert made.calls.task_run_names == 1
    related = {r["prefect.resource.role"]: r for r in made.ctx.related()}
    assert related["task-run"]["prefect.resource.name"] == "train mnist (attempt 2)"
    # A block given by name: the run is renamed after the spec at the first attempt.
    byname = reporting.JobReporter(
        replace(ctx, task_run_name="train nightly"),
        NoReplicas(),  # type: ignore[arg-type]
        "train-mnist",
        spec_name="mnist",
    )
    byname.attempt(REF)
    assert renamed[-1] == (task_run_id, "train mnist")


def test_progress_a_trainjob_reported_to_trainer_reaches_the_progress_artifact(
    sent: list[EventSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubedl_prefect.lifecycle.status import TrainerProgress
    from kubedl_prefect.prefect.artifacts import Progress

    shown: list[tuple[Progress, str]] = []
    report = reporter()
    monkeypatch.setattr(report.artifacts, "progress", lambda p, job: shown.append((p, job)))

    def running(rv: str, percent: int | None, loss: str = "0.5") -> PhaseUpdate:
        status = JobStatus(
            phase=Phase.RUNNING,
            replicas={"node": ReplicaCounts(active=1)},
            resource_version=rv,
            trainer=TrainerProgress(percent=percent, metrics={"epoch": "1", "loss": loss}),
        )
        return PhaseUpdate(Phase.RUNNING, status, None, time.time())

    report._phase(running("1", None))  # nothing reported yet
    report._phase(running("2", 40))
    report._phase(running("3", 40))  # the same report again: no second request
    report._phase(running("4", 60, loss="0.25"))
    assert [(p.percent, p.epoch, p.metrics, job) for p, job in shown] == [
        (40.0, 1.0, (("loss", 0.5),), "mnist-abc-a1"),
        (60.0, 1.0, (("loss", 0.25),), "mnist-abc-a1"),
    ]


def test_the_artifact_and_reporting_docstring_examples_run() -> None:
    import doctest

    from kubedl_prefect.prefect import artifacts

    for module in (artifacts, reporting):
        result = doctest.testmod(module, raise_on_error=False)
        assert result.failed == 0, module.__name__
    assert doctest.testmod(artifacts, raise_on_error=False).attempted > 0
