"""What happened to a model version, as records the Prefect surface turns into events. Pure.

The registry does not emit events itself (only the Prefect surface imports prefect); each of its
steps returns, or passes to a callback, a :class:`ModelVersionEvent` named
``kubedl.model-version.<what>``, with a resource id and a deterministic id: the same happening
recorded twice (a retried step) has the same id, so it is recognisably one event.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

REGISTERED: Final = "kubedl.model-version.registered"
"""A version was created, or found already made by an earlier try of the same step."""
READY: Final = "kubedl.model-version.ready"
"""The version is ``READY`` in the registry."""
PROMOTED: Final = "kubedl.model-version.promoted"
"""The gate moved the champion alias to the version."""
REJECTED: Final = "kubedl.model-version.rejected"
"""The gate left the alias where it was."""
ALIAS_RESTORED: Final = "kubedl.model-version.alias-restored"
"""A rollback gave the alias back to the previous champion (or removed it)."""

_NAMESPACE: Final = uuid.UUID("6f1c8a52-2b9d-4f53-9a8e-0d2f5c7b4e11")


def model_version_id(model_name: str, version: str) -> str:
    """``kubedl.model-version.<name>.<version>``: a model version's resource id (events).

    Example:
        >>> model_version_id("fraud", "3")
        'kubedl.model-version.fraud.3'
    """
    return f"kubedl.model-version.{model_name}.{version}"


@dataclass(frozen=True)
class ModelVersionEvent:
    """One thing that happened to a model version.

    Attributes:
        event: Its name, ``kubedl.model-version.<what>``.
        model_name: The registered model.
        version: The version.
        payload: What else is worth knowing (values, reasons, the alias), as text.
    """

    event: str
    model_name: str
    version: str
    payload: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def resource_id(self) -> str:
        """``kubedl.model-version.<name>.<version>``: the resource the event is about."""
        return model_version_id(self.model_name, self.version)

    @property
    def id(self) -> str:
        """A UUID derived from the event, the version and its payload."""
        basis = "\n".join(
            [self.event, self.model_name, self.version]
            + [f"{k}={v}" for k, v in sorted(self.payload.items())]
        )
        return str(uuid.uuid5(_NAMESPACE, basis))


ModelVersionCallback = Callable[[ModelVersionEvent], object]
"""Called with each :class:`ModelVersionEvent`, in order, on the calling thread."""
