"""The run context: default keys, related resources, callbacks in the caller's context.

And run_in_caller_context, the helper behind every sync face.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import uuid

import pytest

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.prefect.context import RunContext, schedule_slot_key
from kubedl_prefect.prefect.sync import run_in_caller_context

FLOW_RUN = uuid.UUID("0b6a2b8e-2f7a-4b7e-9d5e-5b0f2f1d3c11")
TASK_RUN = uuid.UUID("1c7b3c9f-3a8b-4c8f-8e6f-6c1f3a2e4d22")
MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="unset")


def context(task: str | None = "run-training-job") -> RunContext:
    return RunContext(
        flow_run_id=FLOW_RUN,
        flow_run_name="brave-otter",
        flow_id=None,
        flow_name="train",
        deployment_id=None,
        task_run_id=TASK_RUN if task else None,
        task_run_name=f"{task}-3f1" if task else None,
        task_name=task,
        logger=logging.getLogger("t"),
        context=contextvars.copy_context(),
    )


def test_the_default_key_is_the_flow_run_and_the_task_name() -> None:
    assert context().default_key("mnist") == f"{FLOW_RUN}/run-training-job"
    assert context(task=None).default_key("mnist") == f"{FLOW_RUN}/mnist"
    outside = RunContext.capture()
    assert outside.flow_run_id is None
    with pytest.raises(KubeDLPrefectError, match="pass key="):
        outside.default_key("mnist")


def test_events_relate_to_the_flow_run_and_the_task_run() -> None:
    roles = {r["prefect.resource.role"]: r["prefect.resource.id"] for r in context().related()}
    assert roles == {
        "flow-run": f"prefect.flow-run.{FLOW_RUN}",
        "task-run": f"prefect.task-run.{TASK_RUN}",
    }


def test_a_bound_callback_runs_in_the_captured_context_on_any_thread() -> None:
    token = MARK.set("the caller's")
    try:
        ctx = context()
    finally:
        MARK.reset(token)
    seen: list[str] = []
    bound = ctx.bind(lambda _: seen.append(MARK.get()))
    threads = [threading.Thread(target=bound, args=(None,)) for _ in range(2)]
    for thread in threads:
        thread.start()
        thread.join()
    assert seen == ["the caller's", "the caller's"]


def test_run_sync_runs_a_coroutine_in_the_callers_context_even_inside_a_loop() -> None:
    async def read() -> str:
        return MARK.get()

    MARK.set("outer")
    assert run_in_caller_context(read) == "outer"

    async def nested() -> str:
        return run_in_caller_context(read)  # a sync call from code that runs in a loop

    assert run_in_caller_context(nested) == "outer"

    async def fail() -> None:
        raise KubeDLPrefectError("boom")

    with pytest.raises(KubeDLPrefectError, match="boom"):
        run_in_caller_context(fail)


def test_outside_a_deployment_the_schedule_slot_is_the_default() -> None:
    assert schedule_slot_key(default="manual") == "manual"
    with pytest.raises(KubeDLPrefectError, match="not a deployment"):
        schedule_slot_key()
