"""The last artifacts of a run are sent in the background, and none is lost.

A training task returns once its job's outcome is known; the summary and the progress bar at
100% go to the process's outbox (kubedl_prefect.prefect.outbox). These tests hold its threads
busy so that every write is still queued when the caller goes on, and check that the caller did
not wait, that a flush waits, and that a process exiting with writes queued sends them first.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
from uuid import uuid4

import pytest

from kubedl_prefect.prefect.outbox import Outbox


def ignore(hook: object) -> None:
    """No exit hook: these outboxes are flushed by the test itself."""


EXITING = """
import json, sys, threading, time

from kubedl_prefect.lifecycle.backend import JobRef, LogLine
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.outbox import WORKERS, before_prefect_exits, outbox
from kubedl_prefect.prefect.reporting import JobReporter
from kubedl_prefect.prefect.results import TrainingResult

stem, jobs = sys.argv[1], int(sys.argv[2])
# Every thread of the outbox waits until the process exits: whatever the runs hand over stays
# queued until then. Exit handlers run last registered first: the gate opens, then the outbox's
# own handler sends what is queued.
gate = threading.Event()
for _ in range(WORKERS):
    outbox().submit("a write that waits for the exit", gate.wait)
before_prefect_exits(gate.set)

started = time.monotonic()
for n in range(jobs):
    ref = JobRef(backend="kubernetes", cluster="https://k:6443", dialect="kubedl",
                 namespace="ml", name=f"mnist-{n}-a1", uid=f"u{n}",
                 api_version="training.kubedl.io/v1alpha1", kind="PyTorchJob", key=f"k{n}",
                 attempt=1, spec_hash="h")
    reporter = JobReporter(RunContext.capture(), object(), f"{stem}-{n}")
    reporter.attempt(ref)
    # A progress line while it runs (sent at once), then the end: the bar at 100% and the
    # summary go to the outbox.
    reporter.on_line()(LogLine("master-0", "pytorch", "", '{"step": 50, "total": 100}'))
    reporter.finished(TrainingResult(spec_name="mnist", key=f"k{n}", phase="Succeeded",
                                     ref=ref.to_dict(), queued_s=1.0, running_s=5.0))
print(json.dumps({"pending": outbox().pending, "finished_s": time.monotonic() - started}))
"""


def test_a_process_that_exits_right_after_its_runs_ended_sends_their_last_artifacts(
    prefect_server: dict[str, str],
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from kubedl_prefect.prefect.outbox import WORKERS

    stem, jobs = f"exit-{uuid4().hex[:8]}", 5
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXITING), stem, str(jobs)],
        env=prefect_server,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    # The runs handed their last writes over and went on: all still queued when it exited.
    assert said["pending"] == WORKERS + jobs, said

    keys = [f"{stem}-{n}-{what}" for n in range(jobs) for what in ("summary", "progress")]
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)), limit=100
        )
    latest = {str(a.key): a for a in sorted(found, key=lambda a: a.created or 0)}
    assert sorted(latest) == sorted(keys), done.stderr[-3000:]
    for n in range(jobs):
        assert latest[f"{stem}-{n}-progress"].data == 100.0
        summary = str(latest[f"{stem}-{n}-summary"].data)
        assert "# Training job `mnist`: Succeeded" in summary
        assert f"`ml/mnist-{n}-a1`" in summary

    # Prefect's client emits an event for each artifact it creates: sent too, before Prefect's
    # events worker stopped.
    assert "Error emitting event" not in done.stderr, done.stderr[-3000:]
    summaries = [f"prefect.artifact.{latest[f'{stem}-{n}-summary'].id}" for n in range(jobs)]
    deadline = time.monotonic() + 60
    while True:
        with get_client(sync_client=True) as client:
            page = client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(name=["prefect.artifact.created"]),
                    resource=EventResourceFilter(id=summaries),
                ),
                limit=50,
            )
        told = {event.resource.id for event in page.events}
        if told == set(summaries) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert told == set(summaries)


def test_a_flush_waits_for_every_write_handed_over() -> None:
    box = Outbox(workers=2, on_exit=ignore)
    gate = threading.Event()
    sent: list[int] = []
    for n in range(5):
        box.submit(f"write {n}", lambda n=n: (gate.wait(), sent.append(n)))
    started = time.monotonic()
    assert box.pending == 5
    assert time.monotonic() - started < 1.0  # handing over never waits for the writes
    assert box.flush(timeout_s=0.2) is False  # held: not all sent in time
    gate.set()
    assert box.flush(timeout_s=30) is True
    assert sorted(sent) == [0, 1, 2, 3, 4]
    assert box.pending == 0
    assert box.sent == 5


def test_a_write_that_raises_is_logged_and_the_others_are_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    box = Outbox(workers=1, on_exit=ignore)
    sent: list[str] = []

    def broken() -> None:
        raise RuntimeError("the API said no")

    with caplog.at_level(logging.ERROR, logger="kubedl_prefect.prefect.outbox"):
        box.submit("the summary of mnist-1-a1", broken)
        box.submit("the summary of mnist-2-a1", lambda: sent.append("mnist-2-a1"))
        assert box.flush(timeout_s=30)
    assert sent == ["mnist-2-a1"]
    assert box.sent == 2
    assert "could not send the summary of mnist-1-a1" in caplog.text
    assert "the API said no" in caplog.text


def test_one_thread_sends_writes_in_the_order_they_were_handed_over() -> None:
    box = Outbox(workers=1, on_exit=ignore)
    sent: list[int] = []
    for n in range(50):
        box.submit(f"write {n}", lambda n=n: sent.append(n))
    assert box.flush(timeout_s=30)
    assert sent == list(range(50))


def test_an_outbox_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        Outbox(workers=0, on_exit=ignore)


def test_a_line_delivered_after_the_end_moves_no_artifact(
    prefect_server: dict[str, str],
) -> None:
    """The last writes wait in the outbox; a late progress line (a callback thread's late item)
    sends nothing meanwhile, and the bar ends at 100%."""
    import contextvars

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from kubedl_prefect.lifecycle.backend import JobRef, LogLine
    from kubedl_prefect.prefect.context import RunContext
    from kubedl_prefect.prefect.outbox import WORKERS, outbox
    from kubedl_prefect.prefect.reporting import JobReporter
    from kubedl_prefect.prefect.results import TrainingResult

    stem = f"late-{uuid4().hex[:8]}"
    ref = JobRef(
        backend="kubernetes",
        cluster="https://k:6443",
        dialect="kubedl",
        namespace="ml",
        name="mnist-late-a1",
        uid="u-late",
        api_version="training.kubedl.io/v1alpha1",
        kind="PyTorchJob",
        key="k",
        attempt=1,
        spec_hash="h",
    )
    ctx = RunContext(
        None, None, None, None, None, None, None, None,
        logging.getLogger("t"), contextvars.copy_context(),
    )  # fmt: skip
    reporter = JobReporter(ctx, object(), stem)  # type: ignore[arg-type]
    reporter.attempt(ref)
    line = reporter.on_line()
    line(LogLine("master-0", "pytorch", "", '{"step": 50, "total": 100}'))
    assert reporter.artifacts.requests == 2  # the bar and its metrics table

    gate = threading.Event()
    for _ in range(WORKERS):
        outbox().submit("a write that waits for the test", gate.wait)
    try:
        reporter.finished(TrainingResult(spec_name="mnist", key="k", phase="Succeeded",
                                         ref=ref.to_dict()))  # fmt: skip
        line(LogLine("master-0", "pytorch", "", '{"step": 30, "total": 100}'))
        assert reporter.artifacts.requests == 2  # nothing sent: neither the end nor the line
    finally:
        gate.set()
    assert outbox().flush(timeout_s=120)
    assert reporter.artifacts.requests == 5  # the bar and metrics at 100%, the summary
    with get_client(sync_client=True) as client:
        (bar,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{stem}-progress"]))
        )
    assert bar.data == 100.0
