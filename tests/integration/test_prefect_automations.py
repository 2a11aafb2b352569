"""An automation from docs/prefect.md fires on the events a training run sends (a real server).

The documented automation — act when a training job has been queued for GPUs for ten minutes —
is created as ``prefect automation create`` would (with ``within`` shortened to the ten seconds
Prefect allows at least), for the flow run of a deployment on a work pool. The run's reporter
then tells a job queued for ``InsufficientGPU`` (and another attempt queued on a quota, which the
trigger must not match), through Prefect's own events client. The server's proactive trigger
fires for the first attempt only, and its action cancels the flow run it finds among the
event's related resources. The stored event carries the labels and the related deployment and
work pool the automation can match.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import StateType
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventRelatedFilter,
    EventResourceFilter,
)
from prefect.events.schemas.automations import AutomationCore
from prefect.states import Running

from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.reporting import JobReporter

DOCS = Path(__file__).resolve().parents[2] / "docs" / "prefect.md"


def documented(name: str) -> dict[str, Any]:
    """The automation ``name`` as docs/prefect.md shows it."""
    text = DOCS.read_text(encoding="utf-8")
    for block in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        data = yaml.safe_load(block)
        if isinstance(data, dict) and data.get("name") == name:
            return data
    raise AssertionError(f"docs/prefect.md shows no automation {name!r}")


class NoReplicas:
    """The reporter's backend: only the events matter here."""


def job(attempt: int) -> JobRef:
    return JobRef(
        backend="kubernetes",
        cluster="https://10.0.0.1:6443",
        dialect="kubedl",
        namespace="ml",
        name=f"mnist-x7k2m9q4ab3c-a{attempt}",
        uid=str(uuid.uuid4()),
        api_version="training.kubedl.io/v1alpha1",
        kind="PyTorchJob",
        key="nightly",
        attempt=attempt,
        spec_hash="ab12",
    )


def queued(blocker: AdmissionBlocker, reason: str) -> PhaseUpdate:
    admission = AdmissionState(False, blocker, reason, scheduled=0, expected=3)
    status = JobStatus(phase=Phase.QUEUING, resource_version="7")
    return PhaseUpdate(Phase.QUEUING, status, admission, time.time())


async def test_the_documented_automation_acts_on_a_job_queued_for_gpus(
    prefect_server: dict[str, str],
) -> None:
    suffix = uuid.uuid4().hex[:8]
    data = documented("kubedl-queued-for-gpus")
    assert data["trigger"]["within"] == 600  # ten minutes, as the page says
    data = {**data, "name": f"{data['name']}-{suffix}"}
    data["trigger"] = {**data["trigger"], "within": 10}
    async with get_client() as client:
        pool = f"gpu-pool-{suffix}"
        await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = await client.create_flow_from_name(f"retrain-{suffix}")
        deployment_id = await client.create_deployment(
            flow_id=flow_id, name="nightly", work_pool_name=pool
        )
        # Running, as a worker's run is: a Scheduled one is cancelled at once, not asked to stop.
        flow_run = await client.create_flow_run_from_deployment(deployment_id, state=Running())
        automation_id = await client.create_automation(AutomationCore.model_validate(data))
    try:
        assert flow_run.work_pool_id is not None
        reporter = JobReporter(RunContext.of_flow_run(flow_run, "retrain"), NoReplicas(), "m")  # type: ignore[arg-type]
        on_phase = reporter.on_phase()
        gpus, quota = job(1), job(2)
        reporter.attempt(quota)
        on_phase(queued(AdmissionBlocker.QUOTA, "exceeded quota: gpu"))
        reporter.attempt(gpus)
        on_phase(
            queued(AdmissionBlocker.INSUFFICIENT_GPU, "0/2 nodes: Insufficient nvidia.com/gpu")
        )

        state = await state_of(flow_run.id, until={StateType.CANCELLING, StateType.CANCELLED})
        assert state in (StateType.CANCELLING, StateType.CANCELLED), state

        executed = await events_of(
            lambda: EventFilter(
                event=EventNameFilter(name=["prefect.automation.action.executed"]),
                resource=EventResourceFilter(id=[f"prefect.automation.{automation_id}"]),
            )
        )
        stored = await events_of(
            lambda: EventFilter(
                event=EventNameFilter(name=["kubedl.training-job.queued"]),
                related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run.id}"]),
            ),
            at_least=2,
        )
        by_uid = {e.resource["kubedl.uid"]: e for e in stored}
        event = by_uid[gpus.uid]
        assert event.resource["kubedl.blocker"] == "InsufficientGPU"
        assert event.resource["kubedl.reason"] == "InsufficientGPU"
        assert event.resource["kubedl.dialect"] == "kubedl"
        roles = {r.role: r.id for r in event.related}
        assert roles["deployment"] == f"prefect.deployment.{deployment_id}"
        assert roles["work-pool"] == f"prefect.work-pool.{flow_run.work_pool_id}"
        assert by_uid[quota.uid].resource["kubedl.blocker"] == "QuotaExceeded"
        assert executed, "the automation's action never ran"
        triggering = {r.id for e in executed for r in e.related if r.role == "triggering-event"}
        assert triggering == {f"prefect.event.{event.id}"}  # the GPU job's, not the quota's
    finally:
        async with get_client() as client:
            await client.delete_automation(automation_id)


async def events_of(
    which: Callable[[], EventFilter], at_least: int = 1, timeout_s: float = 30
) -> list[Any]:
    """The stored events ``which()`` selects, once there are ``at_least`` (or at the timeout).

    The filter is made anew each time: its default time window ends when it is made.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        async with get_client() as client:
            page = await client.read_events(filter=which(), limit=20)
        if len(page.events) >= at_least or time.monotonic() > deadline:
            return list(page.events)
        await asyncio.sleep(1)


async def state_of(flow_run_id: uuid.UUID, until: set[StateType], timeout_s: float = 90) -> Any:
    """The flow run's state type once it is one of ``until`` (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
        kind = run.state.type if run.state is not None else None
        if kind in until or time.monotonic() > deadline:
            return kind
        await asyncio.sleep(1)
