"""Deleting what a flow run created when it is cancelled or crashes, and rolling a job back.

Every job a flow run submits carries the label ``kubedl-prefect.io/flow-run-id: <its id>``, and
before the first submission to a cluster and namespace the flow run records *where* on itself:
a Prefect label ``kubedl-prefect.io/cleanup-<digest>`` whose value names the cluster (the saved
block's document id, or a kubeconfig path / in-cluster: never a secret) and the namespace. That
is all a clean-up needs, in the flow run's own process (``on_crashed``, or a cancellation the
engine handles) or in the runner's process, which runs ``on_cancellation`` hooks after killing a
deployment's flow run: it lists the jobs of that label in each recorded place and deletes them
with their pods and PodGroups. A job this flow run did not create — one it adopted from an
earlier run of the same key, anyone else's — lacks the label and is never touched.

Use :data:`CLEANUP_HOOKS` on a flow (``@flow(**CLEANUP_HOOKS)``) or the hooks one by one. A
cluster block that holds a secret (kubeconfig content, a token) must be saved for another
process to find it; within the flow's process the block in memory is used.

:func:`rollback_training_job` is a task ``on_rollback`` hook: inside a Prefect
``transaction()``, when a later step fails, it deletes the job of a task that asked for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from kubedl_prefect.deprecation import renamed
from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import CancelReason, JobEvent, emit, job_event
from kubedl_prefect.prefect.sync import run_in_caller_context

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun, State
    from prefect.flows import Flow
    from prefect.transactions import Transaction

    from kubedl_prefect.prefect.blocks import ClusterBlock, TrainingJob

logger = logging.getLogger(__name__)

FLOW_RUN_LABEL: Final = "kubedl-prefect.io/flow-run-id"
"""The job label naming the Prefect flow run that created the job."""

CLEANUP_LABEL_PREFIX: Final = "kubedl-prefect.io/cleanup-"
"""Prefix of the flow-run labels that record where the flow run created jobs."""

ROLLBACK_KEY: Final = "kubedl-prefect.training-job"
"""Where a task keeps its job in the current transaction, for :func:`rollback_training_job`."""

# In-process: flow run id -> digest -> (cluster block, namespace). Covers unsaved blocks with
# secrets, which the flow run's labels cannot name.
_TRACKED: dict[UUID, dict[str, tuple[ClusterBlock, str]]] = {}


def job_labels(ctx: RunContext) -> dict[str, str]:
    """The labels of the jobs a flow run submits (none outside a flow run)."""
    if ctx.flow_run_id is None:
        return {}
    return {FLOW_RUN_LABEL: str(ctx.flow_run_id)}


def _target(reference: dict[str, Any] | None, namespace: str) -> tuple[str, str]:
    value = json.dumps({**(reference or {"unsaved": True}), "namespace": namespace}, sort_keys=True)
    return hashlib.sha256(value.encode()).hexdigest()[:12], value


async def track(ctx: RunContext, cluster: ClusterBlock, namespace: str) -> None:
    """Record on the flow run that it creates jobs in ``cluster``'s ``namespace``.

    Idempotent; nothing outside a flow run. A failure to write the label is logged: clean-up in
    this process still works, only the runner's would miss this place.
    """
    if ctx.flow_run_id is None:
        return
    reference = cluster.cleanup_reference()
    digest, value = _target(reference, namespace)
    places = _TRACKED.setdefault(ctx.flow_run_id, {})
    if digest in places:
        return
    places[digest] = (cluster, namespace)
    if reference is None:
        ctx.logger.warning(
            "the cluster block is not saved and holds a secret: if this flow run is cancelled "
            "from another process, its jobs in %s cannot be found; save the block",
            namespace,
        )
        return
    from prefect.client.orchestration import get_client

    try:
        async with get_client() as client:
            await client.update_flow_run_labels(
                ctx.flow_run_id, {f"{CLEANUP_LABEL_PREFIX}{digest}": value}
            )
    except Exception as exc:
        ctx.logger.warning("could not record the clean-up place on the flow run: %s", exc)


async def _places(flow_run_id: UUID) -> list[tuple[ClusterBlock, str]]:
    """Every (cluster, namespace) a flow run recorded, in this process or on the flow run."""
    from prefect.client.orchestration import get_client

    from kubedl_prefect.prefect.blocks import KubernetesCluster

    found = dict(_TRACKED.get(flow_run_id, {}))
    try:
        async with get_client() as client:
            flow_run = await client.read_flow_run(flow_run_id)
        labels = dict(flow_run.labels or {})
    except Exception as exc:
        logger.warning("cannot read the labels of flow run %s: %s", flow_run_id, exc)
        labels = {}
    for key, value in labels.items():
        if not key.startswith(CLEANUP_LABEL_PREFIX):
            continue
        digest = key.removeprefix(CLEANUP_LABEL_PREFIX)
        if digest in found:
            continue
        try:
            data = json.loads(str(value))
            cluster = await KubernetesCluster.from_cleanup_reference(data)
        except Exception as exc:
            logger.warning("cannot find the cluster of clean-up label %s: %s", key, exc)
            continue
        found[digest] = (cluster, str(data["namespace"]))
    return list(found.values())


async def adelete_flow_run_jobs(
    flow_run_id: UUID,
    *,
    reason: str,
    ctx: RunContext | None = None,
    category: CancelReason = CancelReason.CANCELLED,
) -> list[JobRef]:
    """Delete every job the flow run created (with pods and PodGroups); return their refs.

    Jobs are found by their flow-run label in each place the flow run recorded; deletions wait
    until the pods and PodGroups are gone. A place that cannot be reached is logged and skipped.
    Each deletion is told as a ``cancelled`` event whose ``kubedl.reason`` is ``category``.
    """
    deleted: list[JobRef] = []
    related = ctx.related() if ctx is not None else _flow_run_related(flow_run_id)
    for cluster, namespace in await _places(flow_run_id):
        backend = cluster.backend(namespace=namespace)
        try:
            find = getattr(backend, "find_jobs", None)
            if find is None:
                continue
            refs: list[JobRef] = await find({FLOW_RUN_LABEL: str(flow_run_id)})
            for ref in refs:
                await backend.cancel(ref)
                deleted.append(ref)
                emit(
                    job_event(
                        ref, JobEvent.CANCELLED, reason=reason, related=related, category=category
                    )
                )
                logger.info("deleted training job %s/%s (%s)", ref.namespace, ref.name, reason)
        except KubeDLPrefectError as exc:
            logger.warning("clean-up of flow run %s in %s failed: %s", flow_run_id, namespace, exc)
        finally:
            await backend.close()
    _TRACKED.pop(flow_run_id, None)
    return deleted


def _flow_run_related(flow_run_id: UUID) -> list[dict[str, str]]:
    return [
        {
            "prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
            "prefect.resource.role": "flow-run",
        }
    ]


def delete_jobs_on_cancellation(flow: Flow[..., Any], flow_run: FlowRun, state: State) -> None:
    """Flow ``on_cancellation`` hook: delete the jobs this flow run created."""
    ctx = RunContext.of_flow_run(flow_run, flow.name)
    refs = run_in_caller_context(
        lambda: adelete_flow_run_jobs(
            flow_run.id,
            reason="flow run cancelled",
            ctx=ctx,
            category=CancelReason.FLOW_RUN_CANCELLED,
        )
    )
    logger.info("flow run %s cancelled: deleted %d training job(s)", flow_run.id, len(refs))


def delete_jobs_on_crash(flow: Flow[..., Any], flow_run: FlowRun, state: State) -> None:
    """Flow ``on_crashed`` hook: delete the jobs this flow run created."""
    ctx = RunContext.of_flow_run(flow_run, flow.name)
    refs = run_in_caller_context(
        lambda: adelete_flow_run_jobs(
            flow_run.id,
            reason="flow run crashed",
            ctx=ctx,
            category=CancelReason.FLOW_RUN_CRASHED,
        )
    )
    logger.info("flow run %s crashed: deleted %d training job(s)", flow_run.id, len(refs))


CLEANUP_HOOKS: Final[dict[str, Any]] = {
    "on_cancellation": [delete_jobs_on_cancellation],
    "on_crashed": [delete_jobs_on_crash],
}
"""``@flow(**CLEANUP_HOOKS)``: delete the flow run's jobs when it is cancelled or crashes."""


def remember_for_rollback(job: TrainingJob, ref: JobRef) -> None:
    """Keep ``ref`` in the current transaction, for :func:`rollback_training_job`."""
    from prefect.transactions import get_transaction

    transaction = get_transaction()
    if transaction is not None:
        transaction.set(ROLLBACK_KEY, {"job": job, "ref": ref.to_dict()})


def rollback_training_job(transaction: Transaction) -> None:
    """Task ``on_rollback`` hook: delete the job its task ran (a later step failed).

    The training tasks call :func:`remember_for_rollback` when asked (``rollback=True``).
    """
    saved = transaction.get(ROLLBACK_KEY, None)
    if not saved:
        return
    job: TrainingJob = saved["job"]
    ref = JobRef.from_dict(saved["ref"])

    async def delete() -> None:
        backend = job.cluster.backend(dialect=ref.dialect, namespace=ref.namespace)
        try:
            await backend.cancel(ref, timeout_s=job.timeouts.cancel_s)
        finally:
            await backend.close()
        emit(
            job_event(
                ref,
                JobEvent.CANCELLED,
                reason="rolled back: a later step failed",
                related=RunContext.capture().related(),
                category=CancelReason.ROLLED_BACK,
            )
        )

    run_in_caller_context(delete)
    logger.info("rolled back training job %s/%s", ref.namespace, ref.name)


_RENAMED = {"delete_flow_run_jobs": "adelete_flow_run_jobs"}


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, _RENAMED)
