"""The waiting machinery: deadlines, the active deadline, phase tracking (no cluster)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

from kubedl_prefect.errors import AdmissionTimeoutError, FailureCategory
from kubedl_prefect.kube.deadline import Deadline
from kubedl_prefect.kube.watch import EventQueue, WatchEvent
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.status import JobStatus, Phase, ReplicaCounts
from kubedl_prefect.lifecycle.waiting import (
    ACTIVE_DEADLINE_GRACE_S,
    PhaseTracker,
    past_active_deadline,
    seconds_until_overdue,
)

STARTED = "2026-12-01T10:00:00Z"
T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC).timestamp()


def job(deadline: int | None, *, nested: bool = False) -> dict[str, object]:
    policy = {} if deadline is None else {"activeDeadlineSeconds": deadline}
    return {"spec": {"runPolicy": policy} if nested else policy}


RUNNING = JobStatus(phase=Phase.RUNNING, start_time=STARTED)


@pytest.mark.parametrize("nested", [False, True])
def test_the_active_deadline_is_read_inline_or_nested_and_allows_a_grace(nested: bool) -> None:
    spec = job(60, nested=nested)
    assert seconds_until_overdue(spec, RUNNING, now=T0) == 60 + ACTIVE_DEADLINE_GRACE_S
    assert past_active_deadline(spec, RUNNING, now=T0 + 60) is None
    overdue = past_active_deadline(spec, RUNNING, now=T0 + 60 + ACTIVE_DEADLINE_GRACE_S)
    assert overdue is not None
    assert overdue.category == FailureCategory.DEADLINE_EXCEEDED
    assert not overdue.retryable
    assert seconds_until_overdue(spec, RUNNING, now=T0 + 1000) == 0.0


def test_no_deadline_or_no_start_time_means_never_overdue() -> None:
    assert seconds_until_overdue(job(None), RUNNING, now=T0) is None
    assert past_active_deadline(job(60), JobStatus(phase=Phase.CREATED), now=T0 + 1e6) is None


async def test_a_deadline_raises_its_error_when_no_event_comes_in_time() -> None:
    queue: EventQueue = asyncio.Queue()
    error = AdmissionTimeoutError("late", timeout_s=0.05)
    deadline = Deadline(0.05)
    started = time.monotonic()
    with pytest.raises(AdmissionTimeoutError):
        await deadline.wait(queue, error)
    assert time.monotonic() - started < 1.0
    with pytest.raises(AdmissionTimeoutError):  # once passed, at once
        await deadline.wait(queue, error)


async def test_a_deadline_returns_on_the_next_event() -> None:
    queue: EventQueue = asyncio.Queue()
    queue.put_nowait(WatchEvent("ADDED", {"metadata": {"name": "x"}}))
    await Deadline(5).wait(queue, AdmissionTimeoutError("late", timeout_s=5))
    queue.put_nowait(WatchEvent("ADDED", {"metadata": {"name": "x"}}))
    await Deadline(None).wait(queue, AdmissionTimeoutError("never", timeout_s=0))


def test_the_tracker_reports_each_change_once_and_new_queue_reasons_too() -> None:
    seen = []
    tracker = PhaseTracker(seen.append)
    waiting = AdmissionState(admitted=False, blocker=AdmissionBlocker.INSUFFICIENT_GPU, reason="a")
    created = JobStatus(phase=Phase.CREATED)
    assert tracker.observe(created, waiting) is not None
    assert tracker.observe(created, waiting) is None
    other = AdmissionState(admitted=False, blocker=AdmissionBlocker.INSUFFICIENT_GPU, reason="b")
    assert tracker.observe(created, other) is not None
    tracker.observe(created, AdmissionState(admitted=True))
    running = JobStatus(phase=Phase.RUNNING, replicas={"worker": ReplicaCounts(active=2)})
    tracker.observe(running, AdmissionState(admitted=True))
    tracker.observe(running, AdmissionState(admitted=True))
    assert [u.phase for u in seen] == [Phase.QUEUING, Phase.QUEUING, Phase.ADMITTED, Phase.RUNNING]
    assert seen[0].admission is not None
    assert seen[0].admission.reason == "a"
    assert seen == tracker.history
