"""Prefect tasks for serving with KServe, each with an async twin named with an ``a`` in front.

========================================  ==========================================
sync                                      async
========================================  ==========================================
:func:`render_inference_service`          :func:`arender_inference_service`
:func:`deploy_inference_service`          :func:`adeploy_inference_service`
========================================  ==========================================

``render_inference_service`` checks an
:class:`~kubedl_prefect.serving.InferenceServiceSpec` (every problem, with its field and fix)
and returns the manifest that would be applied, sending nothing. ``deploy_inference_service``
applies it server-side, waits until it is Ready through the shared watches, and when it is not
restores the previous spec (or deletes the new service) and gives the champion alias back to the
previous version; it emits the ``kubedl.inference-service.*`` events with the model version and
the training job as related resources and writes the ``<service>-serving`` artifact (Ready with
its URL and runtime, or the rollback and its reason).

Both take the :class:`~kubedl_prefect.prefect.model_blocks.KServeServing` block (or the name it
was saved under), whose :meth:`~kubedl_prefect.prefect.model_blocks.KServeServing.service` makes
the spec of a resolved model.
"""

from __future__ import annotations

from prefect import task

from kubedl_prefect.errors import InferenceServiceNotReadyError
from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.prefect.artifacts import serving_markdown, web_link
from kubedl_prefect.prefect.chain import (
    TASK_OPTIONS,
    inference_service_sender,
    model_version_sender,
    write_link,
    write_markdown,
)
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import (
    inference_service_related,
    model_version_related,
    training_job_related,
)
from kubedl_prefect.prefect.model_blocks import (
    KServeServing,
    MlflowRegistry,
    aregistry_block,
    aserving_block,
)
from kubedl_prefect.prefect.sync import run_in_caller_context
from kubedl_prefect.registry.gate import GateDecision
from kubedl_prefect.serving.deploy import RollbackCallback, ServingOutcome
from kubedl_prefect.serving.render import render_inference_service as render_manifest
from kubedl_prefect.serving.spec import InferenceServiceSpec

ServingRef = KServeServing | str
"""A serving block, or the name it was saved under."""


def service_related(service: InferenceServiceSpec) -> list[dict[str, str]]:
    """The model version and training job a service serves, as related resources.

    Example:
        >>> from kubedl_prefect.serving import InferenceServiceSpec, ModelLink
        >>> spec = InferenceServiceSpec(name="fraud", storage_uri="s3://b/m",
        ...                             link=ModelLink("fraud", "3", "ml", "fraud-x-a1", "u1"))
        >>> [r["prefect.resource.role"] for r in service_related(spec)]
        ['model-version', 'training-job']
    """
    link = service.link
    if link is None:
        return []
    return [
        model_version_related(link.model_name, link.version),
        *training_job_related(link.job_uid, link.job_name),
    ]


def rollback_related(service: InferenceServiceSpec, namespace: str) -> list[dict[str, str]]:
    """The related resources of a model version's event in a rollout of ``service``.

    The endpoint the version was to be served by, and the training job that made the model.

    Example:
        >>> from kubedl_prefect.serving import InferenceServiceSpec, ModelLink
        >>> spec = InferenceServiceSpec(name="fraud", storage_uri="s3://b/m",
        ...                             link=ModelLink("fraud", "3", "ml", "fraud-x-a1", "u1"))
        >>> [r["prefect.resource.id"] for r in rollback_related(spec, "ml")]
        ['kubedl.inference-service.ml.fraud', 'kubedl.training-job.u1']
    """
    return [
        inference_service_related(namespace, service.name),
        *(r for r in service_related(service) if r["prefect.resource.role"] == "training-job"),
    ]


async def _render(service: InferenceServiceSpec, serving: ServingRef | None) -> KubeObject:
    namespace = None
    if serving is not None:
        namespace = (await aserving_block(serving)).resolved_namespace()
    return render_manifest(service, namespace=namespace)


async def _deploy(
    service: InferenceServiceSpec,
    serving: ServingRef,
    registry: MlflowRegistry | str | None,
    decision: GateDecision | None,
    timeout_s: float | None,
) -> ServingOutcome:
    ctx = RunContext.capture()
    block = await aserving_block(serving)
    namespace = service.namespace or block.resolved_namespace()
    related = ctx.related() + service_related(service)
    on_rollback: RollbackCallback | None = None
    if registry is not None and decision is not None and decision.promoted:
        registry_block = await aregistry_block(registry)
        version_events = ctx.related() + rollback_related(service, namespace)
        client = registry_block.registry(on_event=model_version_sender(ctx, version_events))
        promoted = decision

        def restore_alias() -> bool:
            return ctx.call(client.restore_alias, promoted)

        on_rollback = restore_alias
    deployer = block.deployer()
    try:
        outcome = await deployer.deploy(
            service,
            timeout_s=timeout_s if timeout_s is not None else block.ready_timeout_s,
            rollback_timeout_s=block.rollback_timeout_s,
            on_event=inference_service_sender(ctx, related),
            on_rollback=on_rollback,
        )
    except InferenceServiceNotReadyError as error:
        await write_markdown(
            ctx,
            service.name,
            "serving",
            serving_markdown(
                name=service.name,
                namespace=namespace,
                storage_uri=service.storage_uri,
                requested_runtime=service.runtime,
                error=error,
            ),
            f"Serving `{namespace}/{service.name}`: rolled back",
        )
        raise
    finally:
        await deployer.close()
    ctx.logger.info(
        "InferenceService %s/%s is Ready at %s (runtime %s)",
        outcome.namespace,
        outcome.name,
        outcome.url or "(no URL yet)",
        outcome.runtime or "not reported",
    )
    await write_markdown(
        ctx,
        service.name,
        "serving",
        serving_markdown(
            name=outcome.name,
            namespace=outcome.namespace,
            storage_uri=outcome.storage_uri,
            requested_runtime=service.runtime,
            outcome=outcome,
        ),
        f"Serving `{outcome.namespace}/{outcome.name}`: Ready",
    )
    await write_link(
        ctx,
        service.name,
        "endpoint",
        web_link(outcome.url),
        f"{outcome.namespace}/{outcome.name}",
        f"The endpoint of InferenceService `{outcome.namespace}/{outcome.name}`",
    )
    return outcome


@task(name="render-inference-service", **TASK_OPTIONS)
def render_inference_service(
    service: InferenceServiceSpec, serving: ServingRef | None = None
) -> KubeObject:
    """The InferenceService manifest ``service`` would be, checked; nothing is sent.

    Args:
        service: What to serve (e.g. ``KServeServing.service(name, resolved.storage_uri)``).
        serving: The serving block (or its name) whose namespace applies when ``service``
            names none.

    Raises:
        InferenceServiceSpecError: Every problem of ``service``, with its field and fix
            (a registry URI as ``storageUri``, a canary in Standard mode, a bad name...).

    Example:
        ::

            manifest = render_inference_service(serving.service("fraud", resolved.storage_uri))
    """
    return run_in_caller_context(lambda: _render(service, serving))


@task(name="render-inference-service", **TASK_OPTIONS)
async def arender_inference_service(
    service: InferenceServiceSpec, serving: ServingRef | None = None
) -> KubeObject:
    """Async :func:`render_inference_service`."""
    return await _render(service, serving)


@task(name="deploy-inference-service", **TASK_OPTIONS)
def deploy_inference_service(
    service: InferenceServiceSpec,
    serving: ServingRef,
    registry: MlflowRegistry | str | None = None,
    decision: GateDecision | None = None,
    timeout_s: float | None = None,
) -> ServingOutcome:
    """Apply the InferenceService, wait until it is Ready; roll back spec and alias if it is not.

    Args:
        service: What to serve.
        serving: The serving block (or its name): cluster, namespace, time limits.
        registry: The registry whose alias a rollback restores (with ``decision``).
        decision: The gate's decision that promoted the version being served.
        timeout_s: How long the new spec may take to be Ready (default: the block's).

    Returns:
        The service that is Ready: its URL, the runtime KServe chose, the generation.

    Raises:
        InferenceServiceNotReadyError: It failed or timed out; the previous spec was restored
            (or the new service deleted) and the alias given back (``rolled_back``, ``reason``).
        ServingError: A service of that name exists and is not managed by kubedl-prefect.
        KubeAPIError: The API server refused the apply (RBAC, schema).

    Example:
        ::

            outcome = deploy_inference_service(
                serving.service("fraud", resolved.storage_uri), serving, "mlflow", decision
            )
            print(outcome.url)
    """
    return run_in_caller_context(lambda: _deploy(service, serving, registry, decision, timeout_s))


@task(name="deploy-inference-service", **TASK_OPTIONS)
async def adeploy_inference_service(
    service: InferenceServiceSpec,
    serving: ServingRef,
    registry: MlflowRegistry | str | None = None,
    decision: GateDecision | None = None,
    timeout_s: float | None = None,
) -> ServingOutcome:
    """Async :func:`deploy_inference_service`."""
    return await _deploy(service, serving, registry, decision, timeout_s)
