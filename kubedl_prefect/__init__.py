"""kubedl-prefect: distributed training on Kubernetes as first-class Prefect flows.

The names most programs need, importable from the package itself::

    from kubedl_prefect import KubernetesBackend, load_spec, run_to_completion

    backend = KubernetesBackend(namespace="ml", dialect="kubedl")
    outcome = run_to_completion(
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
    "SyncTrainingBackend": "kubedl_prefect.lifecycle.backend",
    "JobRef": "kubedl_prefect.lifecycle.backend",
    "JobOutcome": "kubedl_prefect.lifecycle.backend",
    "PhaseUpdate": "kubedl_prefect.lifecycle.backend",
    "LogLine": "kubedl_prefect.lifecycle.backend",
    "WaitTimeouts": "kubedl_prefect.lifecycle.backend",
    "KubernetesBackend": "kubedl_prefect.lifecycle.kubernetes",
    "LocalBackend": "kubedl_prefect.lifecycle.local.backend",
    "LocalCapacity": "kubedl_prefect.lifecycle.local.capacity",
    "RetryPolicy": "kubedl_prefect.lifecycle.retry",
    "arun_to_completion": "kubedl_prefect.lifecycle.retry",
    "run_to_completion": "kubedl_prefect.lifecycle.retry",
    "areattach": "kubedl_prefect.lifecycle.run",
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
    "SyncTrainingBackend",
    "TrainingBackend",
    "TrainingJobSpec",
    "TrainingRun",
    "WaitTimeoutError",
    "WaitTimeouts",
    "__version__",
    "areattach",
    "arun_to_completion",
    "load_spec",
    "loads_spec",
    "parse_spec",
    "render",
    "run_to_completion",
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
        SyncTrainingBackend,
        TrainingBackend,
        WaitTimeouts,
    )
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
    from kubedl_prefect.lifecycle.local.backend import LocalBackend
    from kubedl_prefect.lifecycle.local.capacity import LocalCapacity
    from kubedl_prefect.lifecycle.records import RunRecord
    from kubedl_prefect.lifecycle.retry import (
        RetryPolicy,
        arun_to_completion,
        run_to_completion,
    )
    from kubedl_prefect.lifecycle.run import TrainingRun, areattach
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


# Old names, answered for one release with a DeprecationWarning (kubedl_prefect.deprecation).
_RENAMED: dict[str, str] = {
    "run_to_completion_sync": "run_to_completion",
    "attach": "areattach",
    "SyncBackend": "SyncTrainingBackend",
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
