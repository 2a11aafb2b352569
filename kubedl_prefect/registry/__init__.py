"""The MLflow model registry: from a training job's model to a version worth serving.

The handoff contract (:mod:`kubedl_prefect.spec.handoff`) gets the job's model into an MLflow
run; :class:`ModelRegistry` registers it with its lineage, gates it against the champion,
resolves it to a location KServe can load and checks that the serving runtime can load it.
Only this package imports MLflow; its pure parts (:mod:`.lineage`, :mod:`.gate`, :mod:`.uris`,
:mod:`.compat`, :mod:`.events`) load without it, and the names below load on first use.

Example:
    >>> from kubedl_prefect.registry import GatePolicy, judge
    >>> judge(GatePolicy("accuracy"), candidate=0.91, champion=0.90).promote
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "ModelRegistry": "kubedl_prefect.registry.mlflow_registry",
    "AsyncModelRegistry": "kubedl_prefect.registry.mlflow_registry",
    "RegisteredVersion": "kubedl_prefect.registry.mlflow_registry",
    "ResolvedModel": "kubedl_prefect.registry.mlflow_registry",
    "GatePolicy": "kubedl_prefect.registry.gate",
    "GateDecision": "kubedl_prefect.registry.gate",
    "NoChampion": "kubedl_prefect.registry.gate",
    "Verdict": "kubedl_prefect.registry.gate",
    "judge": "kubedl_prefect.registry.gate",
    "Lineage": "kubedl_prefect.registry.lineage",
    "lineage_tags": "kubedl_prefect.registry.lineage",
    "ModelUri": "kubedl_prefect.registry.uris",
    "parse_model_uri": "kubedl_prefect.registry.uris",
    "storage_uri": "kubedl_prefect.registry.uris",
    "ModelFacts": "kubedl_prefect.registry.compat",
    "RuntimeProfile": "kubedl_prefect.registry.compat",
    "CompatibilityIssue": "kubedl_prefect.registry.compat",
    "KSERVE_MLSERVER": "kubedl_prefect.registry.compat",
    "check": "kubedl_prefect.registry.compat",
    "ModelVersionEvent": "kubedl_prefect.registry.events",
}

__all__ = [
    "KSERVE_MLSERVER",
    "AsyncModelRegistry",
    "CompatibilityIssue",
    "GateDecision",
    "GatePolicy",
    "Lineage",
    "ModelFacts",
    "ModelRegistry",
    "ModelUri",
    "ModelVersionEvent",
    "NoChampion",
    "RegisteredVersion",
    "ResolvedModel",
    "RuntimeProfile",
    "Verdict",
    "check",
    "judge",
    "lineage_tags",
    "parse_model_uri",
    "storage_uri",
]

if TYPE_CHECKING:
    from kubedl_prefect.registry.compat import (
        KSERVE_MLSERVER,
        CompatibilityIssue,
        ModelFacts,
        RuntimeProfile,
        check,
    )
    from kubedl_prefect.registry.events import ModelVersionEvent
    from kubedl_prefect.registry.gate import GateDecision, GatePolicy, NoChampion, Verdict, judge
    from kubedl_prefect.registry.lineage import Lineage, lineage_tags
    from kubedl_prefect.registry.mlflow_registry import (
        AsyncModelRegistry,
        ModelRegistry,
        RegisteredVersion,
        ResolvedModel,
    )
    from kubedl_prefect.registry.uris import ModelUri, parse_model_uri, storage_uri


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kubedl_prefect.registry' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
