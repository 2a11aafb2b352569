"""KServe serving: the InferenceService of a model version, applied, awaited, rolled back.

:class:`InferenceServiceSpec` says what to serve (a ``storageUri`` the registry resolved, the
model format, runtime, protocol, resources, replicas, deployment mode, canary); its manifest
(:func:`render_inference_service`) validates against KServe's CRD schema;
:class:`InferenceServiceDeployer` applies it server-side, waits for Ready through the shared
watches and restores the previous spec when the new one fails; :func:`run_canary` (async:
:func:`arun_canary`) deploys a candidate as a canary, sends both models the same test traffic,
and promotes or rolls it back (:func:`canary_verdict` decides). This package does not import
MLflow: the registry's part of a rollback (the alias) comes in as a callback.
The names below load on first use.

Example:
    >>> from kubedl_prefect.serving import InferenceServiceSpec, render_inference_service
    >>> spec = InferenceServiceSpec(name="fraud", storage_uri="s3://ml/m-ab/artifacts")
    >>> render_inference_service(spec)["spec"]["predictor"]["model"]["protocolVersion"]
    'v2'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "InferenceServiceSpec": "kubedl_prefect.serving.spec",
    "Canary": "kubedl_prefect.serving.spec",
    "CanaryCheck": "kubedl_prefect.serving.canary",
    "CanaryVerdict": "kubedl_prefect.serving.canary",
    "canary_verdict": "kubedl_prefect.serving.canary",
    "CanaryOutcome": "kubedl_prefect.serving.release",
    "run_canary": "kubedl_prefect.serving.release",
    "arun_canary": "kubedl_prefect.serving.release",
    "ServingResources": "kubedl_prefect.serving.spec",
    "ModelLink": "kubedl_prefect.serving.spec",
    "DeploymentMode": "kubedl_prefect.serving.spec",
    "Protocol": "kubedl_prefect.serving.spec",
    "render_inference_service": "kubedl_prefect.serving.render",
    "Readiness": "kubedl_prefect.serving.readiness",
    "ServingState": "kubedl_prefect.serving.readiness",
    "readiness": "kubedl_prefect.serving.readiness",
    "InferenceServiceEvent": "kubedl_prefect.serving.events",
    "InferenceServiceDeployer": "kubedl_prefect.serving.deploy",
    "SyncInferenceServiceDeployer": "kubedl_prefect.serving.deploy",
    "ServingOutcome": "kubedl_prefect.serving.deploy",
}

__all__ = [
    "Canary",
    "CanaryCheck",
    "CanaryOutcome",
    "CanaryVerdict",
    "DeploymentMode",
    "InferenceServiceDeployer",
    "InferenceServiceEvent",
    "InferenceServiceSpec",
    "ModelLink",
    "Protocol",
    "Readiness",
    "ServingOutcome",
    "ServingResources",
    "ServingState",
    "SyncInferenceServiceDeployer",
    "arun_canary",
    "canary_verdict",
    "readiness",
    "render_inference_service",
    "run_canary",
]

if TYPE_CHECKING:
    from kubedl_prefect.serving.canary import CanaryCheck, CanaryVerdict, canary_verdict
    from kubedl_prefect.serving.deploy import (
        InferenceServiceDeployer,
        ServingOutcome,
        SyncInferenceServiceDeployer,
    )
    from kubedl_prefect.serving.events import InferenceServiceEvent
    from kubedl_prefect.serving.readiness import Readiness, ServingState, readiness
    from kubedl_prefect.serving.release import CanaryOutcome, arun_canary, run_canary
    from kubedl_prefect.serving.render import render_inference_service
    from kubedl_prefect.serving.spec import (
        Canary,
        DeploymentMode,
        InferenceServiceSpec,
        ModelLink,
        Protocol,
        ServingResources,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kubedl_prefect.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
