"""One constructor for an attempt's run-record entry and one backend check, for both backends."""

from __future__ import annotations

import pytest

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.lifecycle.backend import (
    JobRef,
    attempt_ended,
    attempt_started,
    check_backend_of,
)
from kubedl_prefect.lifecycle.records import AttemptRecord
from kubedl_prefect.lifecycle.status import JobStatus, Phase


def ref(backend: str = "kubernetes") -> JobRef:
    return JobRef(
        backend=backend,
        cluster="https://127.0.0.1:6443",
        dialect="kubeflow",
        namespace="ml",
        name="mnist-abc-a2",
        uid="5f0c",
        api_version="kubeflow.org/v1",
        kind="PyTorchJob",
        key="nightly",
        attempt=2,
        spec_hash="h",
    )


def test_a_started_attempt_is_submitted_and_carries_its_reference() -> None:
    entry = attempt_started(ref())
    assert (entry.attempt, entry.name, entry.uid, entry.phase) == (
        2,
        "mnist-abc-a2",
        "5f0c",
        "Submitted",
    )
    assert not entry.finished
    assert entry.ref == ref().to_dict()


def test_an_ended_attempt_keeps_the_status_it_ended_with_through_the_record() -> None:
    status = JobStatus(
        phase=Phase.FAILED,
        reason="BackoffLimitExceeded",
        message="worker-1 exited 3",
        start_time="2026-12-02T10:00:00Z",
        completion_time="2026-12-02T10:05:00Z",
    )
    entry = attempt_ended(ref(), status, None)
    assert entry.finished
    read_back = AttemptRecord.from_dict(entry.to_dict())
    assert (read_back.phase, read_back.reason, read_back.message) == (
        "Failed",
        "BackoffLimitExceeded",
        "worker-1 exited 3",
    )
    assert (read_back.start_time, read_back.completion_time) == (
        "2026-12-02T10:00:00Z",
        "2026-12-02T10:05:00Z",
    )
    assert read_back.ref == ref().to_dict()


def test_a_reference_of_another_backend_is_refused_with_the_backend_to_use() -> None:
    check_backend_of(ref("kubernetes"), "kubernetes")
    with pytest.raises(KubeDLPrefectError, match="'local' backend, not 'kubernetes'") as caught:
        check_backend_of(ref("local"), "kubernetes")
    assert caught.value.hint == "attach it with a local backend"
