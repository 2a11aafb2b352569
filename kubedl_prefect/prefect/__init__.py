"""The Prefect surface of kubedl-prefect: blocks, tasks, flow hooks, events and artifacts.

Everything a flow needs, importable from here::

    from prefect import flow
    from kubedl_prefect.prefect import CLEANUP_HOOKS, TrainingJob, run_training_job

    @flow(**CLEANUP_HOOKS)
    def nightly() -> None:
        run_training_job(TrainingJob.load("mnist"))

Names are loaded on first use. The blocks register with a Prefect server through the
``prefect.collections`` entry point (:mod:`kubedl_prefect.prefect.blocks`) or with
``prefect block register -m kubedl_prefect.prefect.blocks``. See ``docs/prefect.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # blocks
    "KubernetesCluster": "kubedl_prefect.prefect.blocks",
    "TrainingJob": "kubedl_prefect.prefect.blocks",
    "RetrySettings": "kubedl_prefect.prefect.blocks",
    "WaitSettings": "kubedl_prefect.prefect.blocks",
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
    "wait_for_admission": "kubedl_prefect.prefect.tasks",
    "await_for_admission": "kubedl_prefect.prefect.tasks",
    "wait_for_completion": "kubedl_prefect.prefect.tasks",
    "await_for_completion": "kubedl_prefect.prefect.tasks",
    "run_training_job": "kubedl_prefect.prefect.tasks",
    "arun_training_job": "kubedl_prefect.prefect.tasks",
    "cancel_training_job": "kubedl_prefect.prefect.tasks",
    "acancel_training_job": "kubedl_prefect.prefect.tasks",
    "retry_if_retryable": "kubedl_prefect.prefect.tasks",
    # clean-up
    "CLEANUP_HOOKS": "kubedl_prefect.prefect.cleanup",
    "delete_jobs_on_cancellation": "kubedl_prefect.prefect.cleanup",
    "delete_jobs_on_crash": "kubedl_prefect.prefect.cleanup",
    "delete_flow_run_jobs": "kubedl_prefect.prefect.cleanup",
    "rollback_training_job": "kubedl_prefect.prefect.cleanup",
    # keys and events
    "schedule_slot_key": "kubedl_prefect.prefect.context",
    "JobEvent": "kubedl_prefect.prefect.events",
}

__all__ = [
    "CLEANUP_HOOKS",
    "AttemptSummary",
    "JobEvent",
    "KubernetesCluster",
    "RetrySettings",
    "SyncTrainingJobRun",
    "TrainingJob",
    "TrainingJobRun",
    "TrainingResult",
    "WaitSettings",
    "acancel_training_job",
    "arender_training_job",
    "arun_training_job",
    "asubmit_training_job",
    "avalidate_training_job",
    "await_for_admission",
    "await_for_completion",
    "cancel_training_job",
    "delete_flow_run_jobs",
    "delete_jobs_on_cancellation",
    "delete_jobs_on_crash",
    "render_training_job",
    "retry_if_retryable",
    "rollback_training_job",
    "run_training_job",
    "schedule_slot_key",
    "submit_training_job",
    "validate_training_job",
    "wait_for_admission",
    "wait_for_completion",
]

if TYPE_CHECKING:
    from kubedl_prefect.prefect.blocks import (
        KubernetesCluster,
        RetrySettings,
        TrainingJob,
        WaitSettings,
    )
    from kubedl_prefect.prefect.cleanup import (
        CLEANUP_HOOKS,
        delete_flow_run_jobs,
        delete_jobs_on_cancellation,
        delete_jobs_on_crash,
        rollback_training_job,
    )
    from kubedl_prefect.prefect.context import schedule_slot_key
    from kubedl_prefect.prefect.events import JobEvent
    from kubedl_prefect.prefect.results import AttemptSummary, TrainingResult
    from kubedl_prefect.prefect.runs import SyncTrainingJobRun, TrainingJobRun
    from kubedl_prefect.prefect.tasks import (
        acancel_training_job,
        arender_training_job,
        arun_training_job,
        asubmit_training_job,
        avalidate_training_job,
        await_for_admission,
        await_for_completion,
        cancel_training_job,
        render_training_job,
        retry_if_retryable,
        run_training_job,
        submit_training_job,
        validate_training_job,
        wait_for_admission,
        wait_for_completion,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kubedl_prefect.prefect' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
