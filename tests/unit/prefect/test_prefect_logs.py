"""Log forwarding: labels, per-replica rate limits, what was held back (pure, fake clock)."""

from __future__ import annotations

import logging

import pytest

from kubedl_prefect.lifecycle.backend import LogLine
from kubedl_prefect.prefect.logs import LogForwarder, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def line(replica: str, text: str, attempt: int = 1) -> LogLine:
    return LogLine(replica, "pytorch", "2026-01-01T00:00:00Z", text, attempt)


def test_the_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, tokens=3.0, at=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5)  # one token back after half a second at 2/s
    assert not bucket.take(0.5)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]  # capped at 3


def test_lines_are_labelled_with_their_replica_and_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forward = LogForwarder(logging.getLogger("t.labels"))
    with caplog.at_level(logging.INFO, logger="t.labels"):
        forward(line("master-0", "epoch 1"))
        forward(line("worker-1", "epoch 1", attempt=2))
    assert [r.getMessage() for r in caplog.records] == [
        "master-0 | epoch 1",
        "worker-1 (attempt 2) | epoch 1",
    ]


def test_a_chatty_replica_is_held_back_and_says_how_much(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    forward = LogForwarder(logging.getLogger("t.rate"), rate=10.0, burst=5, clock=clock)
    with caplog.at_level(logging.INFO, logger="t.rate"):
        for i in range(1000):  # all at once
            forward(line("worker-0", f"spam {i}"))
        forward(line("master-0", "quiet replica"))  # its own bucket
        clock.now = 1.0
        forward(line("worker-0", "after a second"))
        for i in range(20):
            forward(line("worker-0", f"more {i}"))
        forward.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:5] == [f"worker-0 | spam {i}" for i in range(5)]
    assert "master-0 | quiet replica" in messages
    held = [m for m in messages if "held back" in m]
    assert held[0].startswith("worker-0 | held back 995 log lines")
    assert "worker-0 | after a second" in messages
    # A second at 10 lines/s refills the bucket to its burst of 5: 1 + 4 lines, 16 held.
    assert forward.replicas["worker-0"].sent == 5 + 5
    assert forward.held_total == 995 + 16
    assert held[-1].startswith("worker-0 | held back 16 log lines")
    assert forward.sent_total == forward.replicas["worker-0"].sent + 1


def test_the_cost_of_a_line_held_back_is_small() -> None:
    forward = LogForwarder(logging.getLogger("t.cost"), rate=1.0, burst=1, clock=lambda: 0.0)
    forward(line("worker-0", "first"))
    for i in range(10_000):
        forward(line("worker-0", str(i)))
    assert forward.replicas["worker-0"].held == 10_000


def test_each_replica_logs_under_a_logger_name_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_logger = logging.LoggerAdapter(logging.getLogger("t.names"), {"task_run_id": "t-1"})
    forward = LogForwarder(run_logger, rate=1.0, burst=1, clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="t.names"):
        forward(line("master-0", "epoch 1"))
        forward(line("worker-1", "epoch 1", attempt=2))
        forward(line("worker-1", "held", attempt=2))
        forward.flush()
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("kubedl.replica.master-0", "master-0 | epoch 1"),
        ("kubedl.replica.worker-1", "worker-1 (attempt 2) | epoch 1"),
        (
            "kubedl.replica.worker-1",
            "worker-1 (attempt 2) | held back 1 log line (more than 1 lines/s); "
            "read them with kubectl logs",
        ),
    ]
    # The run logger's extras (the run's ids) ride along: Prefect's API handler needs them.
    assert {getattr(r, "task_run_id", None) for r in caplog.records} == {"t-1"}


def test_the_replica_logger_name_is_what_the_prefect_api_stores() -> None:
    from uuid import uuid4

    from prefect.logging.handlers import APILogHandler

    flow_run_id, task_run_id = uuid4(), uuid4()
    records: list[logging.LogRecord] = []
    base = logging.getLogger("t.api")
    base.propagate = False
    base.setLevel(logging.INFO)
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    base.addHandler(handler)
    run_logger = logging.LoggerAdapter(
        base, {"flow_run_id": str(flow_run_id), "task_run_id": str(task_run_id)}
    )
    LogForwarder(run_logger)(line("worker-1", "loss 0.4"))
    sent = APILogHandler().prepare(records[0])
    assert sent["name"] == "kubedl.replica.worker-1"
    assert sent["message"] == "worker-1 | loss 0.4"
    assert str(sent["task_run_id"]) == str(task_run_id)


async def test_the_replica_logger_name_survives_a_real_prefect_server(
    prefect_server: dict[str, str],
) -> None:
    import asyncio
    import time

    from prefect import flow, get_run_logger, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    @task
    def replicas() -> None:
        forward = LogForwarder(get_run_logger())
        forward(line("master-0", "rank 0 ready"))
        forward(line("worker-1", "rank 1 ready"))

    @flow
    def training() -> None:
        replicas()

    state = await asyncio.to_thread(training, return_state=True)
    assert state.is_completed(), state.message
    flow_run_id = state.state_details.flow_run_id
    await asyncio.to_thread(APILogWorker.drain_all)
    names: dict[str, str] = {}
    deadline = time.monotonic() + 30
    async with get_client() as client:
        while len(names) < 2 and time.monotonic() < deadline:
            logs = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
            names = {log.message: log.name for log in logs if " | " in log.message}
            await asyncio.sleep(0.5)
    assert names == {
        "master-0 | rank 0 ready": "kubedl.replica.master-0",
        "worker-1 | rank 1 ready": "kubedl.replica.worker-1",
    }
    assert all(log.task_run_id is not None for log in logs if " | " in log.message)
