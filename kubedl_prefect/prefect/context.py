"""The Prefect run a training job belongs to, captured once and carried to callback threads.

Phase and log callbacks run on threads of their own (see :mod:`kubedl_prefect.kube.delivery`)
where Prefect's context variables — the flow run, the task run, the settings a test harness or a
profile set — are not visible. :class:`RunContext` captures them where a task or flow calls us,
and :meth:`RunContext.bind` runs a callback inside a copy of that context, so events, artifacts
and log lines land on the right run of the right server.

It also decides the default idempotency key (:meth:`RunContext.default_key`): the flow run's id
and the task run's name, which a Prefect task retry and a re-run of the same flow run keep; and
:func:`schedule_slot_key`, the key of a deployment's scheduled run.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.logging import get_logger, get_run_logger

from kubedl_prefect.errors import KubeDLPrefectError

T = TypeVar("T")

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


@dataclass(frozen=True)
class RunContext:
    """The flow run and task run a training job is run from (all ``None`` outside Prefect).

    Args:
        flow_run_id: The flow run's id.
        flow_run_name: Its name.
        flow_id: The flow's id.
        flow_name: The flow's name.
        deployment_id: The deployment the flow run belongs to, if any.
        task_run_id: The task run's id, inside a task.
        task_run_name: Its name (``train mnist``: see the tasks' ``task_run_name``).
        task_name: The task's name (``run-training-job``).
        logger: The run's logger (lines reach the Prefect UI), else a plain one.
        context: The context variables at capture time.
        deployment_name: The deployment's name, when known without a request.
        work_pool_id: The work pool the flow run was submitted through, if any.
        work_pool_name: Its name.
        work_queue_id: The work queue, if any.
        work_queue_name: Its name.
        tags: The flow run's tags.
    """

    flow_run_id: UUID | None
    flow_run_name: str | None
    flow_id: UUID | None
    flow_name: str | None
    deployment_id: UUID | None
    task_run_id: UUID | None
    task_run_name: str | None
    task_name: str | None
    logger: Logger
    context: contextvars.Context
    deployment_name: str | None = None
    work_pool_id: UUID | None = None
    work_pool_name: str | None = None
    work_queue_id: UUID | None = None
    work_queue_name: str | None = None
    tags: tuple[str, ...] = ()

    @classmethod
    def capture(cls) -> RunContext:
        """The context of the calling flow run or task run (empty outside Prefect)."""
        flow_ctx = FlowRunContext.get()
        task_ctx = TaskRunContext.get()
        flow_run = flow_ctx.flow_run if flow_ctx is not None else None
        task_run = task_ctx.task_run if task_ctx is not None else None
        logger: Logger
        try:
            logger = get_run_logger()
        except MissingContextError:
            logger = get_logger("kubedl_prefect")
        flow_run_id = flow_run.id if flow_run is not None else None
        if flow_run_id is None and task_run is not None:
            flow_run_id = task_run.flow_run_id
        return cls(
            flow_run_id=flow_run_id,
            flow_run_name=flow_run.name if flow_run is not None else None,
            flow_id=flow_run.flow_id if flow_run is not None else None,
            flow_name=flow_ctx.flow.name if flow_ctx is not None and flow_ctx.flow else None,
            deployment_id=flow_run.deployment_id if flow_run is not None else None,
            task_run_id=task_run.id if task_run is not None else None,
            task_run_name=task_run.name if task_run is not None else None,
            task_name=task_ctx.task.name if task_ctx is not None else None,
            logger=logger,
            context=contextvars.copy_context(),
            **_placement(flow_run),
        )

    @classmethod
    def of_flow_run(cls, flow_run: FlowRun, flow_name: str | None = None) -> RunContext:
        """The context of a flow run known by its record (a flow run hook, another process)."""
        return cls(
            flow_run_id=flow_run.id,
            flow_run_name=flow_run.name,
            flow_id=flow_run.flow_id,
            flow_name=flow_name,
            deployment_id=flow_run.deployment_id,
            task_run_id=None,
            task_run_name=None,
            task_name=None,
            logger=get_logger("kubedl_prefect"),
            context=contextvars.copy_context(),
            **_placement(flow_run),
        )

    def default_key(self, spec_name: str) -> str:
        """The key a job gets when the caller gives none.

        ``<flow run id>/<task name>`` in a task, ``<flow run id>/<spec name>`` in a flow outside
        tasks: a task's retries and a re-run of the same flow run keep both. With the spec's
        name (part of every logical job) that names one job per spec and task in a flow run:
        calling the task twice with the same spec in one flow run is the same job, run once;
        pass ``key=`` (a seed, a date) to train it twice.

        Raises:
            KubeDLPrefectError: Outside a flow run, where nothing stable names the run.
        """
        if self.flow_run_id is None:
            raise KubeDLPrefectError(
                f"no key for training job {spec_name!r}: not in a Prefect flow run",
                hint="pass key= (a schedule slot, a date: the same key adopts the same job)",
            )
        return f"{self.flow_run_id}/{self.task_name or spec_name}"

    def deployment_label(self) -> str | None:
        """The deployment the run belongs to, by name (by id when its name is not known)."""
        if self.deployment_id is None:
            return None
        return self.deployment_name or str(self.deployment_id)

    def related(self) -> list[dict[str, str]]:
        """The Prefect objects of the run, as related resources of an event.

        The flow run, task run, flow, deployment, work pool, work queue and tags, with the ids
        and roles Prefect gives them itself (``prefect.deployment.<id>``, role ``deployment``),
        so that an automation matches them as it matches Prefect's own events. Prefect's events
        worker adds what is missing when the event is sent inside the run; these are there
        also when it is not (a flow run hook, a callback thread).
        """
        related: list[dict[str, str]] = []

        def add(kind: str, ident: object, name: str | None) -> None:
            if ident is not None:
                resource = {
                    "prefect.resource.id": f"prefect.{kind}.{ident}",
                    "prefect.resource.role": kind,
                }
                if name:
                    resource["prefect.resource.name"] = name
                related.append(resource)

        add("flow-run", self.flow_run_id, self.flow_run_name or "")
        add("task-run", self.task_run_id, self.task_run_name or "")
        add("flow", self.flow_id, self.flow_name or "")
        add("deployment", self.deployment_id, self.deployment_name)
        add("work-pool", self.work_pool_id, self.work_pool_name)
        add("work-queue", self.work_queue_id, self.work_queue_name)
        for tag in sorted(set(self.tags)):
            add("tag", tag, None)
        return related

    def bind(self, callback: Callable[[T], object]) -> Callable[[T], None]:
        """``callback`` run inside a copy of the captured context, from whatever thread.

        Each bound callback has a copy of its own: a context cannot be entered by two threads
        at once, and each callback thread of the lifecycle runs one callback at a time.
        """
        context = self.context.copy()

        def run(item: T) -> None:
            context.run(callback, item)

        return run

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` inside a fresh copy of the captured context."""
        return self.context.copy().run(function, *args)


def _placement(flow_run: FlowRun | None) -> dict[str, Any]:
    """Where a flow run runs: its deployment's name (if cached), work pool, queue and tags."""
    if flow_run is None:
        return {}
    return {
        "deployment_name": _deployment_name(flow_run.deployment_id),
        "work_pool_id": flow_run.work_pool_id,
        "work_pool_name": flow_run.work_pool_name,
        "work_queue_id": flow_run.work_queue_id,
        "work_queue_name": flow_run.work_queue_name,
        "tags": tuple(flow_run.tags or ()),
    }


def _deployment_name(deployment_id: UUID | None) -> str | None:
    """The deployment's name, read once per process (Prefect's runtime caches it)."""
    if deployment_id is None:
        return None
    try:
        from prefect.runtime import deployment

        if deployment.id != str(deployment_id):
            return None  # another run's deployment: its name would cost a request
        name = deployment.name
    except Exception:  # the name is cosmetic: an API that does not answer leaves it out
        return None
    return str(name) if name else None


def schedule_slot_key(default: str | None = None) -> str:
    """The key of a deployment's run: ``<deployment>@<scheduled start, UTC>``.

    Two flow runs of one schedule slot (a duplicate, a late retry) get the same key, so they
    adopt the same job. Outside a deployment's run, ``default`` is returned (or an error).

    Raises:
        KubeDLPrefectError: Not in a deployment's flow run and no default given.
    """
    from prefect.runtime import deployment

    flow_ctx = FlowRunContext.get()
    flow_run = flow_ctx.flow_run if flow_ctx is not None else None
    if flow_run is None or flow_run.deployment_id is None or flow_run.expected_start_time is None:
        if default is not None:
            return default
        raise KubeDLPrefectError(
            "no schedule slot: this flow run is not a deployment's",
            hint="pass a key, or run the flow from its deployment",
        )
    slot = flow_run.expected_start_time.astimezone(dt.UTC)
    return f"{deployment.name or flow_run.deployment_id}@{slot:%Y-%m-%dT%H:%M:%SZ}"
