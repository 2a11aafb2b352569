"""The Kubernetes backend: training jobs as KubeDL or Kubeflow custom resources.

:class:`KubernetesBackend` implements :class:`~kubedl_prefect.lifecycle.backend.TrainingBackend`
on a cluster, beside the local backend (:mod:`kubedl_prefect.lifecycle.local`). See
``docs/architecture.md`` for the modules of this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_BACKEND = "kubedl_prefect.lifecycle.kubernetes.backend"

_EXPORTS = {
    "KubernetesBackend": _BACKEND,
    "LABEL_MANAGED_BY": "kubedl_prefect.kube.labels",
    "MANAGED_BY": "kubedl_prefect.kube.labels",
    "LABEL_KEY_HASH": _BACKEND,
    "LABEL_ATTEMPT": _BACKEND,
    "LABEL_RECORD": _BACKEND,
    "ANNOTATION_KEY": _BACKEND,
    "ANNOTATION_SPEC_HASH": _BACKEND,
    "ANNOTATION_SPEC_NAME": _BACKEND,
    "attempt_data_key": _BACKEND,
    "record_object": _BACKEND,
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
    from kubedl_prefect.lifecycle.kubernetes.backend import (
        ANNOTATION_KEY,
        ANNOTATION_SPEC_HASH,
        ANNOTATION_SPEC_NAME,
        LABEL_ATTEMPT,
        LABEL_KEY_HASH,
        LABEL_RECORD,
        KubernetesBackend,
        attempt_data_key,
        record_object,
    )


def __getattr__(name: str) -> Any:
    # Loaded on first use, so that importing one module of the wing (its pure decisions) does
    # not load the backend and its I/O.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
