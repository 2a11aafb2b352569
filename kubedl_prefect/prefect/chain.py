"""What the model-chain tasks share: task options, event senders and the markdown artifacts.

The registry tasks (:mod:`.registry_tasks`) and the serving tasks (:mod:`.serving_tasks`) are
written once, as coroutines; their sync faces run them with :func:`~.sync.run_in_caller_context`, as
the training tasks do. The registry's and the serving layer's typed records become Prefect events
here, bound to the Prefect run that called the task (their callbacks run on other threads), with the
training job and the model version as related resources.
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import acreate_link_artifact, acreate_markdown_artifact
from prefect.cache_policies import NO_CACHE

from kubedl_prefect.prefect.artifacts import artifact_key
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import (
    emit,
    inference_service_event,
    model_version_event,
)
from kubedl_prefect.prefect.tasks import retry_if_retryable
from kubedl_prefect.registry.events import ModelVersionCallback, ModelVersionEvent
from kubedl_prefect.serving.events import InferenceServiceEvent, ServingCallback

TASK_OPTIONS: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "retries": 2,
    "retry_delay_seconds": [5, 30],
    "retry_condition_fn": retry_if_retryable,
}
"""Options of every model-chain task: no cache; retry twice what is retryable (a tracking server
or API server that was down), never a refusal or a failed rollout."""


def model_version_sender(ctx: RunContext, related: list[dict[str, str]]) -> ModelVersionCallback:
    """A registry ``on_event`` callback emitting each record in ``ctx``'s Prefect run."""

    def send(record: ModelVersionEvent) -> None:
        emit(model_version_event(record, related))

    return ctx.bind(send)


def inference_service_sender(ctx: RunContext, related: list[dict[str, str]]) -> ServingCallback:
    """A deployer ``on_event`` callback emitting each record in ``ctx``'s Prefect run."""

    def send(record: InferenceServiceEvent) -> None:
        emit(inference_service_event(record, related))

    return ctx.bind(send)


async def write_markdown(ctx: RunContext, stem: str, what: str, markdown: str, title: str) -> None:
    """Create the markdown artifact ``<stem>-<what>`` of the calling task run (never raises).

    A Prefect API that refuses the artifact is logged: the model chain goes on without it.
    """
    if ctx.flow_run_id is None and ctx.task_run_id is None:
        return
    try:
        await acreate_markdown_artifact(
            markdown=markdown, key=artifact_key(stem, what), description=title
        )
    except Exception as exc:
        ctx.logger.warning("could not write the %s artifact of %s: %s", what, stem, exc)


async def write_link(
    ctx: RunContext, stem: str, what: str, link: str | None, text: str, title: str
) -> None:
    """Create the link artifact ``<stem>-<what>`` of the calling task run (never raises).

    Nothing is written without a link (:func:`~.artifacts.web_link` made none: not an
    ``http(s)`` server) or outside a Prefect run.
    """
    if link is None or (ctx.flow_run_id is None and ctx.task_run_id is None):
        return
    try:
        await acreate_link_artifact(
            link=link, link_text=text, key=artifact_key(stem, what), description=title
        )
    except Exception as exc:
        ctx.logger.warning("could not write the %s link of %s: %s", what, stem, exc)
