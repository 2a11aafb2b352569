"""kubedl-prefect: distributed training on Kubernetes as first-class Prefect flows.

The names most programs need, importable from the package itself::

    from kubedl_prefect import KubernetesBackend, load_spec, run_to_completion_sync

    backend = KubernetesBackend(namespace="ml", dialect="kubedl")
    outcome = run_to_completion_sync(
        backend, load_spec("examples/pytorch-mnist.yaml"), key="nightly-2026-12-01"
    )

They are loaded on first use, so ``import kubedl_prefect`` (and the ``kubedl-prefect validate``
command) stays quick and does not load the Kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # the spec
    "TrainingJobSpec": "kubedl_prefect.spec",
    "Dialect": "kubedl_prefect.spec",
    "load_spec": "kubedl_prefect.spec",
    "loads_spec": "kubedl_prefect.spec",
    "parse_spec": "kubedl_prefect.spec",
    "render": "kubedl_prefect.spec",
    "validate": "kubedl_prefect.spec",
    # reaching a cluster
    "KubeconfigFile": "kubedl_prefect.kube.credentials",
    "KubeconfigContent": "kubedl_prefect.kube.credentials",
    "InCluster": "kubedl_prefect.kube.credentials",
    "BearerToken": "kubedl_prefect.kube.credentials",
    # backends and the lifecycle
    "TrainingBackend": "kubedl_prefect.lifecycle.backend",
    "SyncBackend": "kubedl_prefect.lifecycle.backend",
    "JobRef": "kubedl_prefect.lifecycle.backend",
    "JobOutcome": "kubedl_prefect.lifecycle.backend",
    "PhaseUpdate": "kubedl_prefect.lifecycle.backend",
    "LogLine": "kubedl_prefect.lifecycle.backend",
    "WaitTimeouts": "kubedl_prefect.lifecycle.backend",
    "KubernetesBackend": "kubedl_prefect.lifecycle.kubernetes",
    "LocalBackend": "kubedl_prefect.lifecycle.local.backend",
    "LocalCapacity": "kubedl_prefect.lifecycle.local.capacity",
    "RetryPolicy": "kubedl_prefect.lifecycle.retry",
    "run_to_completion": "kubedl_prefect.lifecycle.retry",
    "run_to_completion_sync": "kubedl_prefect.lifecycle.retry",
    "attach": "kubedl_prefect.lifecycle.run",
    "TrainingRun": "kubedl_prefect.lifecycle.run",
    "RunRecord": "kubedl_prefect.lifecycle.records",
    # results
    "Phase": "kubedl_prefect.lifecycle.status",
    "JobStatus": "kubedl_prefect.lifecycle.status",
    "AdmissionState": "kubedl_prefect.lifecycle.admission",
    "Diagnosis": "kubedl_prefect.errors",
    "FailureCategory": "kubedl_prefect.errors",
    # errors
    "KubeDLPrefectError": "kubedl_prefect.errors",
    "SpecError": "kubedl_prefect.errors",
    "JobFailedError": "kubedl_prefect.errors",
    "WaitTimeoutError": "kubedl_prefect.errors",
}

__all__ = [
    "AdmissionState",
    "BearerToken",
    "Diagnosis",
    "Dialect",
    "FailureCategory",
    "InCluster",
    "JobFailedError",
    "JobOutcome",
    "JobRef",
    "JobStatus",
    "KubeDLPrefectError",
    "KubeconfigContent",
    "KubeconfigFile",
    "KubernetesBackend",
    "LocalBackend",
    "LocalCapacity",
    "LogLine",
    "Phase",
    "PhaseUpdate",
    "RetryPolicy",
    "RunRecord",
    "SpecError",
    "SyncBackend",
    "TrainingBackend",
    "TrainingJobSpec",
    "TrainingRun",
    "WaitTimeoutError",
    "WaitTimeouts",
    "__version__",
    "attach",
    "load_spec",
    "loads_spec",
    "parse_spec",
    "render",
    "run_to_completion",
    "run_to_completion_sync",
    "validate",
]

if TYPE_CHECKING:
    from kubedl_prefect.errors import (
        Diagnosis,
        FailureCategory,
        JobFailedError,
        KubeDLPrefectError,
        SpecError,
        WaitTimeoutError,
    )
    from kubedl_prefect.kube.credentials import (
        BearerToken,
        InCluster,
        KubeconfigContent,
        KubeconfigFile,
    )
    from kubedl_prefect.lifecycle.admission import AdmissionState
    from kubedl_prefect.lifecycle.backend import (
        JobOutcome,
        JobRef,
        LogLine,
        PhaseUpdate,
        SyncBackend,
        TrainingBackend,
        WaitTimeouts,
    )
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
    from kubedl_prefect.lifecycle.local.backend import LocalBackend
    from kubedl_prefect.lifecycle.local.capacity import LocalCapacity
    from kubedl_prefect.lifecycle.records import RunRecord
    from kubedl_prefect.lifecycle.retry import (
        RetryPolicy,
        run_to_completion,
        run_to_completion_sync,
    )
    from kubedl_prefect.lifecycle.run import TrainingRun, attach
    from kubedl_prefect.lifecycle.status import JobStatus, Phase
    from kubedl_prefect.spec import (
        Dialect,
        TrainingJobSpec,
        load_spec,
        loads_spec,
        parse_spec,
        render,
        validate,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kubedl_prefect' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
