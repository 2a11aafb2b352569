"""Artifact builders and the timeline behind the result (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubedl_prefect.errors import Diagnosis, FailureCategory
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.records import AttemptRecord, RunRecord
from kubedl_prefect.lifecycle.replicas import replica_states
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.prefect.artifacts import (
    ArtifactWriter,
    Progress,
    artifact_key,
    artifact_stem,
    parse_progress,
    progress_description,
    progress_row,
    replica_rows,
    summary_markdown,
)
from kubedl_prefect.prefect.results import Timeline, job_commands, training_result

REF = JobRef(
    backend="kubernetes",
    cluster="https://k:6443",
    dialect="kubeflow",
    namespace="ml",
    name="mnist-abc-a1",
    uid="u1",
    api_version="kubeflow.org/v1",
    kind="PyTorchJob",
    key="nightly",
    attempt=1,
    spec_hash="h",
)


@pytest.mark.parametrize(
    ("text", "percent"),
    [
        ('{"step": 25, "total": 100}', 25.0),
        ('  {"step": 3, "total": 4, "epoch": 1, "loss": 0.2} ', 75.0),
        ('{"step": 200, "total": 100}', 100.0),
        ('{"step": 1.5, "total": 3}', 50.0),
    ],
)
def test_progress_lines_are_json_objects_with_step_and_total(text: str, percent: float) -> None:
    progress = parse_progress(text)
    assert progress is not None
    assert progress.percent == percent


@pytest.mark.parametrize(
    "text",
    [
        "step 25 of 100",
        '{"step": 25}',
        '{"step": 25, "total": 0}',
        '{"step": true, "total": 10}',
        '{"step": "25", "total": 100}',
        '["step", 1]',
        '{"step": 1, "total": 2',
        '{"step": NaN, "total": 2}',
    ],
)
def test_anything_else_is_no_progress(text: str) -> None:
    assert parse_progress(text) is None


def pod(name: str, role: str, index: int, **status: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "training.kubeflow.org/replica-type": role,
                "training.kubeflow.org/replica-index": str(index),
            },
        },
        "spec": {"nodeName": "node-1"} if status.pop("scheduled", True) else {},
        "status": status,
    }


def test_the_replica_table_lists_coordinators_first_then_by_index() -> None:
    pods = [
        pod("j-worker-1", "Worker", 1, phase="Pending", scheduled=False),
        pod("j-worker-0", "Worker", 0, phase="Running", containerStatuses=[{"restartCount": 2}]),
        pod("j-master-0", "Master", 0, phase="Running"),
    ]
    rows = replica_rows(replica_states(pods))
    assert [(r["role"], r["index"]) for r in rows] == [("master", 0), ("worker", 0), ("worker", 1)]
    assert rows[1] == {
        "role": "worker",
        "index": 0,
        "pod": "j-worker-0",
        "node": "node-1",
        "phase": "Running",
        "restarts": 2,
    }
    assert rows[2]["node"] == "(not scheduled)"


def test_artifact_keys_are_lower_case_dashes() -> None:
    assert artifact_key("MNIST_v2-abc", "replicas") == "mnist-v2-abc-replicas"


def at(phase: Phase, t: float, reason: str = "") -> PhaseUpdate:
    admission = AdmissionState(admitted=phase is Phase.ADMITTED, reason=reason) if reason else None
    return PhaseUpdate(phase, JobStatus(phase=phase), admission, t)


def test_the_timeline_adds_up_queueing_and_running_over_attempts() -> None:
    timeline = Timeline()
    timeline.submitted(REF, at=100.0)
    for update in (
        at(Phase.QUEUING, 101.0, "Insufficient nvidia.com/gpu"),
        at(Phase.ADMITTED, 130.0),
        at(Phase.RUNNING, 131.0),
        at(Phase.FAILED, 200.0),
    ):
        timeline.observe(update)
    second = JobRef.from_dict({**REF.to_dict(), "attempt": 2, "name": "mnist-abc-a2"})
    timeline.submitted(second, at=210.0)
    timeline.submitted(second, at=999.0)  # adopted again: still the same attempt
    for update in (at(Phase.RUNNING, 215.0), at(Phase.SUCCEEDED, 300.0)):
        timeline.observe(update)
    assert timeline.queued_s() == 30.0 + 5.0
    assert timeline.running_s() == 69.0 + 85.0
    assert timeline.admission_reason() == "Insufficient nvidia.com/gpu"


def test_the_result_and_its_summary_say_what_happened_and_how_to_look() -> None:
    diagnosis = Diagnosis(FailureCategory.EVICTED, True, "worker-0", None, "evicted", "resume")
    record = RunRecord(
        "mnist",
        "nightly",
        "h",
        (
            AttemptRecord(1, "mnist-abc-a1", "u1", phase="Failed", diagnosis=diagnosis),
            AttemptRecord(2, "mnist-abc-a2", "u2", phase="Succeeded", reason="JobSucceeded"),
        ),
    )
    timeline = Timeline()
    timeline.submitted(REF, at=0.0)
    timeline.observe(at(Phase.QUEUING, 1.0, "2 Insufficient nvidia.com/gpu"))
    timeline.observe(at(Phase.RUNNING, 75.0))
    timeline.observe(at(Phase.SUCCEEDED, 3675.0))
    result = training_result(
        spec_name="mnist",
        key="nightly",
        ref=REF,
        phase="Succeeded",
        timeline=timeline,
        record=record,
        started_at=0.0,
        ended_at=3700.0,
        checkpoint="s3://ckpt/mnist-0123",
    )
    assert result.succeeded
    assert [a.retryable for a in result.attempts] == [True, None]
    text = summary_markdown(result)
    assert "# Training job `mnist`: Succeeded" in text
    assert "| admission wait | 1m 15s |" in text
    assert "| waited for | 2 Insufficient nvidia.com/gpu |" in text
    assert "| running | 1h 00m 00s |" in text
    assert "| attempts | 2 |" in text
    assert "s3://ckpt/mnist-0123" in text
    assert "| 1 | `mnist-abc-a1` | Failed | Evicted on worker-0: evicted |" in text
    for command in job_commands(REF):
        assert command in text
    assert job_commands(REF)[2] == (
        "kubectl logs -n ml -l training.kubeflow.org/job-name=mnist-abc-a1 --prefix "
        "--all-containers --tail=-1"
    )


def test_a_failed_result_shows_the_failure_and_what_to_do() -> None:
    diagnosis = Diagnosis(FailureCategory.USER_CODE, False, "worker-1", 1, "exit 1", "read logs")
    result = training_result(
        spec_name="mnist",
        key="k",
        ref=REF,
        phase="Failed",
        timeline=Timeline(),
        record=None,
        started_at=0.0,
        ended_at=1.0,
        checkpoint=None,
        diagnosis=diagnosis,
    )
    assert result.failure() == diagnosis
    text = summary_markdown(result)
    assert "**Failure**: UserCodeError on worker-1 (exit code 1): exit 1" in text
    assert "What to do: read logs" in text
    assert "(none in the spec)" in text


def test_a_progress_line_keeps_its_epoch_and_latest_metrics() -> None:
    line = '{"step": 250, "total": 1000, "epoch": 3, "loss": 0.41, "accuracy": 0.9, "lr": true}'
    progress = parse_progress(line)
    assert progress is not None
    assert progress.epoch == 3.0
    assert progress.metrics == (("loss", 0.41), ("accuracy", 0.9))  # booleans are no metric
    assert progress_row(progress) == {
        "step": 250,
        "total": 1000,
        "epoch": 3,
        "loss": 0.41,
        "accuracy": 0.9,
    }
    description = progress_description(progress, "mnist-abc-a1")
    assert description == (
        "Training progress of `mnist-abc-a1`: step 250 of 1000, epoch 3 — loss 0.41, accuracy 0.9"
    )
    assert progress.done().percent == 100.0
    assert progress.done().metrics == progress.metrics


class Recorder:
    """A Prefect client that keeps every artifact request."""

    def __init__(self) -> None:
        self.created: list[Any] = []
        self.updated: list[tuple[Any, Any]] = []

    def create_artifact(self, artifact: Any) -> Any:
        self.created.append(artifact)
        return type("Created", (), {"id": artifact.key})()

    def update_artifact(self, artifact_id: Any, update: Any) -> None:
        self.updated.append((artifact_id, update))


def test_the_progress_bar_has_its_metrics_table_beside_it() -> None:
    client = Recorder()
    writer = ArtifactWriter(artifact_stem("mnist", "retrain", "nightly"), None, None)
    writer._open = client
    for step in (1, 2, 10, 11):  # 1 % only moves at 10 of 1000
        writer.progress(Progress(float(step), 1000.0, 0.0, (("loss", 1.0 / step),)), "mnist-abc-a1")
    assert [(a.key, a.type) for a in client.created] == [
        ("retrain-nightly-mnist-progress", "progress"),
        ("retrain-nightly-mnist-metrics", "table"),
    ]
    assert client.created[0].description.endswith("step 1 of 1000, epoch 0 — loss 1")
    (bar, bar_update), (table, table_update) = client.updated
    assert (bar, table) == ("retrain-nightly-mnist-progress", "retrain-nightly-mnist-metrics")
    assert bar_update.data == 1.0
    assert "step 10 of 1000, epoch 0 — loss 0.1" in bar_update.description
    assert json.loads(table_update.data) == [{"step": 10, "total": 1000, "epoch": 0, "loss": 0.1}]
    assert writer.latest is not None
    assert writer.latest.step == 11.0  # kept for the end of the run, though not sent


def test_artifact_keys_name_the_deployment_and_the_spec_never_the_run_key() -> None:
    # Two scheduled runs of one deployment (two slots: two keys) write the same keys.
    assert artifact_stem("mnist", "retrain", "nightly") == "retrain-nightly-mnist"
    assert artifact_stem("mnist", "train") == "train-mnist"
    assert artifact_stem("mnist") == "mnist"
    writer = ArtifactWriter(artifact_stem("MNIST_v2", "retrain", "nightly"), None, None)
    assert writer.key("progress") == "retrain-nightly-mnist-v2-progress"


def test_a_run_keys_its_artifacts_by_its_deployment_and_spec() -> None:
    import contextvars
    import logging
    from uuid import uuid4

    from kubedl_prefect.prefect.blocks import LocalCluster, TrainingJob
    from kubedl_prefect.prefect.context import RunContext
    from kubedl_prefect.prefect.runs import TrainingJobRun
    from kubedl_prefect.spec import load_spec

    spec = load_spec("examples/pytorch-mnist.yaml")
    job = TrainingJob(spec_file="examples/pytorch-mnist.yaml", cluster=LocalCluster())
    stems = set()
    for slot in ("nightly@2026-12-01T02:00:00Z", "nightly@2026-12-02T02:00:00Z"):
        ctx = RunContext(
            flow_run_id=uuid4(),
            flow_run_name="r",
            flow_id=uuid4(),
            flow_name="retrain",
            deployment_id=uuid4(),
            task_run_id=None,
            task_run_name=None,
            task_name=None,
            logger=logging.getLogger("t"),
            context=contextvars.copy_context(),
            deployment_name="nightly",
        )
        run = TrainingJobRun(job, spec, slot, job.cluster.backend(), ctx, None, None)  # type: ignore[arg-type]
        stems.add(run.reporter.artifacts.key("summary"))
    assert stems == {f"retrain-nightly-{spec.name}-summary"}


def test_the_summary_shows_the_real_admission_wait_with_its_reason_and_category() -> None:
    timeline = Timeline()
    timeline.submitted(REF, at=0.0)
    admission = AdmissionState(
        admitted=False,
        blocker=AdmissionBlocker.INSUFFICIENT_GPU,
        reason="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    )
    timeline.observe(PhaseUpdate(Phase.QUEUING, JobStatus(phase=Phase.QUEUING), admission, 1.0))
    timeline.observe(at(Phase.ADMITTED, 125.0))
    timeline.observe(at(Phase.SUCCEEDED, 200.0))
    result = training_result(
        spec_name="mnist",
        key="nightly",
        ref=REF,
        phase="Succeeded",
        timeline=timeline,
        record=None,
        started_at=0.0,
        checkpoint=None,
        ended_at=200.0,
    )
    assert result.admission_blocker == "InsufficientGPU"
    text = summary_markdown(result)
    assert "| admission wait | 2m 05s |" in text
    assert (
        "| waited for | 0/2 nodes are available: 2 Insufficient nvidia.com/gpu. "
        "(InsufficientGPU) |" in text
    )


def test_a_wait_seen_only_from_a_later_task_is_not_called_no_wait() -> None:
    # wait-for-completion attaches after wait-for-admission saw the queue: it saw no reason,
    # but the job did wait.
    late = Timeline()
    late.submitted(REF, at=0.0)
    late.observe(at(Phase.RUNNING, 90.0))
    late.observe(at(Phase.SUCCEEDED, 200.0))
    result = training_result(
        spec_name="mnist",
        key="nightly",
        ref=REF,
        phase="Succeeded",
        timeline=late,
        record=None,
        started_at=0.0,
        checkpoint=None,
        ended_at=200.0,
    )
    text = summary_markdown(result)
    assert "| admission wait | 1m 30s |" in text
    assert "admitted at once" not in text
    assert "not seen: the job was admitted before this task run looked" in text


def test_a_saved_run_carries_its_submission_time_to_the_tasks_that_attach() -> None:
    import time

    from kubedl_prefect.prefect.blocks import LocalCluster, TrainingJob
    from kubedl_prefect.prefect.runs import TrainingJobRun

    job = TrainingJob(spec_file="examples/pytorch-mnist.yaml", cluster=LocalCluster())
    name = job.training_spec().name
    ref = JobRef.from_dict(
        {**REF.to_dict(), "backend": "local", "dialect": "local", "namespace": "/tmp/ws"}
    )
    submitted = time.time() - 600.0  # ten minutes ago, by the submit task
    saved = {"specName": name, "key": ref.key, "ref": ref.to_dict(), "submittedAt": submitted}
    run = TrainingJobRun.from_saved(job, saved)
    current = run.reporter.timeline.current
    assert current is not None
    assert current.submitted_at == submitted
    assert run.to_dict()["submittedAt"] == submitted  # and passes it on
