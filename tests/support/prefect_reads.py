"""What tests read from and do to the session's Prefect server, for flow runs they started.

Every flow test reads its run's logs, waits for its final state, starts a deployment's run or
cancels one the way the UI does; these helpers are that, once, for all of them. Reads are
filtered by the flow run, so that tests sharing the server stay apart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.responses import SetStateStatus
from prefect.states import Cancelling, Scheduled

#: How many log lines one read asks for.
LOG_PAGE = 200


async def logs_of(flow_run_id: UUID) -> list[str]:
    """Every log message of the flow run so far, oldest first (read page by page)."""
    messages: list[str] = []
    async with get_client() as client:
        while True:
            page = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                limit=LOG_PAGE,
                offset=len(messages),
            )
            messages += [log.message for log in page]
            if len(page) < LOG_PAGE:
                return messages


async def wait_for_logs(flow_run_id: UUID, needles: list[str], timeout_s: float = 20) -> list[str]:
    """The flow run's messages once each needle is in one of them, or when ``timeout_s`` ends.

    Logs reach the server in batches, after the run; the caller asserts on what comes back.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        messages = await logs_of(flow_run_id)
        if all(any(n in m for m in messages) for n in needles) or time.monotonic() > deadline:
            return messages
        await asyncio.sleep(0.5)


async def link_artifacts(flow_run_id: UUID) -> dict[str, str]:
    """The link artifacts of a flow run: key -> the URL its markdown links to.

    Prefect stores a link artifact as markdown (``[text](link)``), typed ``markdown``.
    """
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    links = {}
    for artifact in found:
        match = re.fullmatch(r"\[[^\]]*\]\((.*)\)", str(artifact.data))
        if match is not None:
            links[str(artifact.key)] = match.group(1)
    return links


async def read_flow_run(flow_run_id: UUID) -> FlowRun:
    async with get_client() as client:
        return await client.read_flow_run(flow_run_id)


def wait_for_final_state(flow_run_id: UUID, *, timeout_s: float) -> Any:
    """The flow run's final state; the test fails if it is not final within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = asyncio.run(read_flow_run(flow_run_id)).state
        if state is not None and state.is_final():
            return state
        if time.monotonic() > deadline:
            pytest.fail(f"flow run {flow_run_id} still {state} after {timeout_s:g}s")
        time.sleep(1.0)


def run_deployment(
    name: str, parameters: dict[str, Any], *, scheduled_time: dt.datetime | None = None
) -> UUID:
    """Create a run of deployment ``name`` (``flow/deployment``); wait up to 90 s for it to exist.

    A served deployment appears a moment after ``serve`` starts, hence the wait.
    """

    async def create() -> UUID:
        deadline = time.monotonic() + 90
        async with get_client() as client:
            while True:
                try:
                    deployment = await client.read_deployment_by_name(name)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            state = Scheduled(scheduled_time=scheduled_time) if scheduled_time else None
            run = await client.create_flow_run_from_deployment(
                deployment.id, parameters=parameters, state=state
            )
            return run.id

    return asyncio.run(create())


async def cancel_flow_run(flow_run_id: UUID) -> None:
    """Cancel as the UI and `prefect flow-run cancel` do: not forced, refused once final."""
    async with get_client() as client:
        answer = await client.set_flow_run_state(flow_run_id, Cancelling())
    assert answer.status == SetStateStatus.ACCEPT, answer.details
