"""The record of a logical job's attempts, and where a replay starts from it (pure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubedl_prefect.errors import Diagnosis, FailureCategory, KubeDLPrefectError
from kubedl_prefect.lifecycle.records import (
    RECORD_SCHEMA,
    AttemptRecord,
    RunRecord,
    replay_step,
)
from kubedl_prefect.lifecycle.status import Phase


def failure(category: FailureCategory, *, retryable: bool) -> Diagnosis:
    return Diagnosis(
        category=category,
        retryable=retryable,
        replica="worker-1",
        exit_code=137,
        message="the pod was evicted",
        hint="it resumes",
    )


EVICTED = failure(FailureCategory.EVICTED, retryable=True)
USER_CODE = failure(FailureCategory.USER_CODE, retryable=False)


def record(*attempts: AttemptRecord) -> RunRecord:
    """A record as the backend keeps it: the last entry written for each attempt."""
    latest = {entry.attempt: entry for entry in attempts}
    return RunRecord(
        spec_name="mnist",
        key="nightly",
        spec_hash="h",
        attempts=tuple(latest[n] for n in sorted(latest)),
    )


def submitted(attempt: int, uid: str = "") -> AttemptRecord:
    return AttemptRecord(attempt=attempt, name=f"mnist-x-a{attempt}", uid=uid or f"u{attempt}")


def ended(attempt: int, phase: Phase, diagnosis: Diagnosis | None = None) -> AttemptRecord:
    return AttemptRecord(
        attempt=attempt,
        name=f"mnist-x-a{attempt}",
        uid=f"u{attempt}",
        phase=str(phase),
        reason="JobFailed" if phase == Phase.FAILED else "JobSucceeded",
        diagnosis=diagnosis,
        ref={"name": f"mnist-x-a{attempt}"},
    )


def test_nothing_recorded_starts_at_attempt_one() -> None:
    assert replay_step(None, max_attempts=3).action == "start"
    assert replay_step(record(), max_attempts=3).attempt == 1


def test_an_attempt_whose_end_nobody_saw_is_followed() -> None:
    step = replay_step(
        record(submitted(1), ended(1, Phase.FAILED, EVICTED), submitted(2)), max_attempts=3
    )
    assert (step.action, step.attempt) == ("follow", 2)


def test_a_recorded_success_is_returned_not_trained_again() -> None:
    step = replay_step(record(submitted(1), ended(1, Phase.SUCCEEDED)), max_attempts=3)
    assert (step.action, step.attempt) == ("succeeded", 1)
    assert step.previous is not None
    assert step.previous.status().phase == Phase.SUCCEEDED


def test_a_recorded_retryable_failure_goes_on_with_the_next_attempt() -> None:
    step = replay_step(record(ended(1, Phase.FAILED, EVICTED)), max_attempts=3)
    assert (step.action, step.attempt) == ("next", 2)


def test_a_recorded_permanent_failure_or_the_last_allowed_attempt_is_raised_again() -> None:
    assert replay_step(record(ended(1, Phase.FAILED, USER_CODE)), max_attempts=3).action == "failed"
    exhausted = record(*(ended(n, Phase.FAILED, EVICTED) for n in (1, 2, 3)))
    step = replay_step(exhausted, max_attempts=3)
    assert (step.action, step.attempt) == ("failed", 3)


def test_a_record_of_a_newer_layout_is_refused() -> None:
    data = record(submitted(1)).to_dict() | {"schemaVersion": RECORD_SCHEMA + 1}
    with pytest.raises(KubeDLPrefectError, match="layout version"):
        RunRecord.from_dict(data)


phases = st.sampled_from([Phase.SUCCEEDED, Phase.FAILED, None])
diagnoses = st.sampled_from([EVICTED, USER_CODE, None])


@given(st.lists(st.tuples(st.integers(1, 5), phases, diagnoses), max_size=8))
def test_records_round_trip_through_json(
    entries: list[tuple[int, Phase | None, Diagnosis | None]],
) -> None:
    run = record(
        *(
            submitted(n) if phase is None else ended(n, phase, diagnosis)
            for n, phase, diagnosis in entries
        )
    )
    again = RunRecord.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again == run
    assert [a.attempt for a in again.attempts] == sorted({n for n, _, _ in entries})
