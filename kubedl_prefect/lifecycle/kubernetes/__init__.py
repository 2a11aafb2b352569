"""The Kubernetes backend: training jobs as KubeDL or Kubeflow custom resources.

:class:`KubernetesBackend` implements :class:`~kubedl_prefect.lifecycle.backend.TrainingBackend`
on a cluster, beside the local backend (:mod:`kubedl_prefect.lifecycle.local`). See
``docs/architecture.md`` for the modules of this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_BACKEND = "kubedl_prefect.lifecycle.kubernetes.backend"
_OWNERSHIP = "kubedl_prefect.lifecycle.kubernetes.ownership"
_RECORD_STORE = "kubedl_prefect.lifecycle.kubernetes.record_store"

_EXPORTS = {
    "KubernetesBackend": _BACKEND,
    "LABEL_MANAGED_BY": "kubedl_prefect.kube.labels",
    "MANAGED_BY": "kubedl_prefect.kube.labels",
    "LABEL_KEY_HASH": _OWNERSHIP,
    "LABEL_ATTEMPT": _OWNERSHIP,
    "LABEL_RECORD": _OWNERSHIP,
    "ANNOTATION_KEY": _OWNERSHIP,
    "ANNOTATION_SPEC_HASH": _OWNERSHIP,
    "ANNOTATION_SPEC_NAME": _OWNERSHIP,
    "attempt_data_key": _RECORD_STORE,
    "record_object": _RECORD_STORE,
}

__all__ = [
    "ANNOTATION_KEY",
    "ANNOTATION_SPEC_HASH",
    "ANNOTATION_SPEC_NAME",
    "LABEL_ATTEMPT",
    "LABEL_KEY_HASH",
    "LABEL_MANAGED_BY",
    "LABEL_RECORD",
    "MANAGED_BY",
    "KubernetesBackend",
    "attempt_data_key",
    "record_object",
]

if TYPE_CHECKING:
    from kubedl_prefect.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
    from kubedl_prefect.lifecycle.kubernetes.backend import KubernetesBackend
    from kubedl_prefect.lifecycle.kubernetes.ownership import (
        ANNOTATION_KEY,
        ANNOTATION_SPEC_HASH,
        ANNOTATION_SPEC_NAME,
        LABEL_ATTEMPT,
        LABEL_KEY_HASH,
        LABEL_RECORD,
    )
    from kubedl_prefect.lifecycle.kubernetes.record_store import attempt_data_key, record_object


def __getattr__(name: str) -> Any:
    # Loaded on first use, so that importing one module of the wing (its pure decisions) does
    # not load the backend and its I/O.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
