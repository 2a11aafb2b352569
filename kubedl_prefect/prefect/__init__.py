"""The Prefect surface of kubedl-prefect: blocks, tasks, flow hooks, events and artifacts.

Everything a flow needs, importable from here::

    from prefect import flow
    from kubedl_prefect.prefect import CLEANUP_HOOKS, TrainingJob, run_training_job

    @flow(**CLEANUP_HOOKS)
    def nightly() -> None:
        run_training_job(TrainingJob.load("mnist"))

The model chain (register, gate, resolve, serve) has its blocks in
:mod:`~kubedl_prefect.prefect.model_blocks` and its tasks in
:mod:`~kubedl_prefect.prefect.registry_tasks` and :mod:`~kubedl_prefect.prefect.serving_tasks`.

Names are loaded on first use. The blocks register with a Prefect server through the
``prefect.collections`` entry point (:mod:`kubedl_prefect.prefect.collection`, which imports
every block type) or with ``prefect block register -m kubedl_prefect.prefect.collection``. See
``docs/prefect.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # blocks
    "KubernetesCluster": "kubedl_prefect.prefect.blocks",
    "LocalCluster": "kubedl_prefect.prefect.blocks",
    "TrainingJob": "kubedl_prefect.prefect.blocks",
    "RetrySettings": "kubedl_prefect.prefect.blocks",
    "WaitSettings": "kubedl_prefect.prefect.blocks",
    "MlflowRegistry": "kubedl_prefect.prefect.model_blocks",
    "KServeServing": "kubedl_prefect.prefect.model_blocks",
    # runs and results
    "TrainingJobRun": "kubedl_prefect.prefect.runs",
    "SyncTrainingJobRun": "kubedl_prefect.prefect.runs",
    "TrainingResult": "kubedl_prefect.prefect.results",
    "AttemptSummary": "kubedl_prefect.prefect.results",
    # tasks
    "validate_training_job": "kubedl_prefect.prefect.tasks",
    "avalidate_training_job": "kubedl_prefect.prefect.tasks",
    "render_training_job": "kubedl_prefect.prefect.tasks",
    "arender_training_job": "kubedl_prefect.prefect.tasks",
    "submit_training_job": "kubedl_prefect.prefect.tasks",
    "asubmit_training_job": "kubedl_prefect.prefect.tasks",
    "watch_admission": "kubedl_prefect.prefect.tasks",
    "awatch_admission": "kubedl_prefect.prefect.tasks",
    "watch_completion": "kubedl_prefect.prefect.tasks",
    "awatch_completion": "kubedl_prefect.prefect.tasks",
    "run_training_job": "kubedl_prefect.prefect.tasks",
    "arun_training_job": "kubedl_prefect.prefect.tasks",
    "cancel_training_job": "kubedl_prefect.prefect.tasks",
    "acancel_training_job": "kubedl_prefect.prefect.tasks",
    "retry_if_retryable": "kubedl_prefect.prefect.tasks",
    # function tasks
    "distributed_task": "kubedl_prefect.prefect.functions",
    "adistributed_task": "kubedl_prefect.prefect.functions",
    "distributed_job": "kubedl_prefect.prefect.functions",
    "current_replica": "kubedl_prefect.prefect.replica",
    # model registry and serving tasks
    "start_model_run": "kubedl_prefect.prefect.registry_tasks",
    "astart_model_run": "kubedl_prefect.prefect.registry_tasks",
    "register_model": "kubedl_prefect.prefect.registry_tasks",
    "aregister_model": "kubedl_prefect.prefect.registry_tasks",
    "resolve_model_version": "kubedl_prefect.prefect.registry_tasks",
    "aresolve_model_version": "kubedl_prefect.prefect.registry_tasks",
    "gate_model_version": "kubedl_prefect.prefect.registry_tasks",
    "agate_model_version": "kubedl_prefect.prefect.registry_tasks",
    "render_inference_service": "kubedl_prefect.prefect.serving_tasks",
    "arender_inference_service": "kubedl_prefect.prefect.serving_tasks",
    "deploy_inference_service": "kubedl_prefect.prefect.serving_tasks",
    "adeploy_inference_service": "kubedl_prefect.prefect.serving_tasks",
    # clean-up
    "CLEANUP_HOOKS": "kubedl_prefect.prefect.cleanup",
    "delete_jobs_on_cancellation": "kubedl_prefect.prefect.cleanup",
    "delete_jobs_on_crash": "kubedl_prefect.prefect.cleanup",
    "adelete_flow_run_jobs": "kubedl_prefect.prefect.cleanup",
    "rollback_training_job": "kubedl_prefect.prefect.cleanup",
    # keys and events
    "schedule_slot_key": "kubedl_prefect.prefect.context",
    "JobEvent": "kubedl_prefect.prefect.events",
    # artifacts sent in the background
    "flush_artifacts": "kubedl_prefect.prefect.outbox",
    "aflush_artifacts": "kubedl_prefect.prefect.outbox",
}

__all__ = [
    "CLEANUP_HOOKS",
    "AttemptSummary",
    "JobEvent",
    "KServeServing",
    "KubernetesCluster",
    "LocalCluster",
    "MlflowRegistry",
    "RetrySettings",
    "SyncTrainingJobRun",
    "TrainingJob",
    "TrainingJobRun",
    "TrainingResult",
    "WaitSettings",
    "acancel_training_job",
    "adelete_flow_run_jobs",
    "adeploy_inference_service",
    "adistributed_task",
    "aflush_artifacts",
    "agate_model_version",
    "aregister_model",
    "arender_inference_service",
    "arender_training_job",
    "aresolve_model_version",
    "arun_training_job",
    "astart_model_run",
    "asubmit_training_job",
    "avalidate_training_job",
    "awatch_admission",
    "awatch_completion",
    "cancel_training_job",
    "current_replica",
    "delete_jobs_on_cancellation",
    "delete_jobs_on_crash",
    "deploy_inference_service",
    "distributed_job",
    "distributed_task",
    "flush_artifacts",
    "gate_model_version",
    "register_model",
    "render_inference_service",
    "render_training_job",
    "resolve_model_version",
    "retry_if_retryable",
    "rollback_training_job",
    "run_training_job",
    "schedule_slot_key",
    "start_model_run",
    "submit_training_job",
    "validate_training_job",
    "watch_admission",
    "watch_completion",
]

if TYPE_CHECKING:
    from kubedl_prefect.prefect.blocks import (
        KubernetesCluster,
        LocalCluster,
        RetrySettings,
        TrainingJob,
        WaitSettings,
    )
    from kubedl_prefect.prefect.cleanup import (
        CLEANUP_HOOKS,
        adelete_flow_run_jobs,
        delete_jobs_on_cancellation,
        delete_jobs_on_crash,
        rollback_training_job,
    )
    from kubedl_prefect.prefect.context import schedule_slot_key
    from kubedl_prefect.prefect.events import JobEvent
    from kubedl_prefect.prefect.functions import (
        adistributed_task,
        distributed_job,
        distributed_task,
    )
    from kubedl_prefect.prefect.model_blocks import KServeServing, MlflowRegistry
    from kubedl_prefect.prefect.outbox import aflush_artifacts, flush_artifacts
    from kubedl_prefect.prefect.registry_tasks import (
        agate_model_version,
        aregister_model,
        aresolve_model_version,
        astart_model_run,
        gate_model_version,
        register_model,
        resolve_model_version,
        start_model_run,
    )
    from kubedl_prefect.prefect.replica import current_replica
    from kubedl_prefect.prefect.results import AttemptSummary, TrainingResult
    from kubedl_prefect.prefect.runs import SyncTrainingJobRun, TrainingJobRun
    from kubedl_prefect.prefect.serving_tasks import (
        adeploy_inference_service,
        arender_inference_service,
        deploy_inference_service,
        render_inference_service,
    )
    from kubedl_prefect.prefect.tasks import (
        acancel_training_job,
        arender_training_job,
        arun_training_job,
        asubmit_training_job,
        avalidate_training_job,
        awatch_admission,
        awatch_completion,
        cancel_training_job,
        render_training_job,
        retry_if_retryable,
        run_training_job,
        submit_training_job,
        validate_training_job,
        watch_admission,
        watch_completion,
    )


# Old names, answered for one release with a DeprecationWarning (kubedl_prefect.deprecation).
_RENAMED: dict[str, str] = {
    "wait_for_admission": "watch_admission",
    "await_for_admission": "awatch_admission",
    "wait_for_completion": "watch_completion",
    "await_for_completion": "awatch_completion",
    "delete_flow_run_jobs": "adelete_flow_run_jobs",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        from kubedl_prefect.deprecation import renamed

        return renamed(__name__, name, _RENAMED)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
