"""The embedded default backend: a training job's replicas as processes of this machine.

:class:`LocalBackend` implements :class:`~kubedl_prefect.lifecycle.backend.TrainingBackend` like
the Kubernetes backend does, under the environment the operators give replicas
(:mod:`.contract`), so that a flow written for a cluster runs on a laptop with only the backend
changed. See ``docs/local.md``.

- :mod:`.contract`: each replica's command line and environment (pure);
- :mod:`.capacity`: whether the machine fits the job, and why not (pure);
- :mod:`.state`: the job's files and what follows from them: phase, admission, diagnosis (pure);
- :mod:`.layout`: where the files of a workspace are, and how they are read and written;
- :mod:`.supervisor`: the process that runs one job's replicas, detached from the caller;
- :mod:`.backend`: :class:`LocalBackend`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LocalBackend": "kubedl_prefect.lifecycle.local.backend",
    "default_workspace": "kubedl_prefect.lifecycle.local.backend",
    "LocalCapacity": "kubedl_prefect.lifecycle.local.capacity",
    "machine_capacity": "kubedl_prefect.lifecycle.local.capacity",
}

__all__ = ["LocalBackend", "LocalCapacity", "default_workspace", "machine_capacity"]

if TYPE_CHECKING:
    from kubedl_prefect.lifecycle.local.backend import LocalBackend, default_workspace
    from kubedl_prefect.lifecycle.local.capacity import LocalCapacity, machine_capacity


def __getattr__(name: str) -> Any:
    # Loaded on first use: the supervisor, a module of this package, starts without the backend.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
