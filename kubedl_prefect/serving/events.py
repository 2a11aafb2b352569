"""What happened to an InferenceService, as records the Prefect surface turns into events. Pure.

:class:`~kubedl_prefect.serving.deploy.InferenceServiceDeployer` passes each
:class:`InferenceServiceEvent` to its callback; the surface emits them as
``kubedl.inference-service.<what>`` events. The id is derived from the object's uid, the event
and its resourceVersion, so a re-emitted event is recognisably the same one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

APPLIED: Final = "kubedl.inference-service.applied"
"""A spec was applied (created or changed; ``changed`` says which)."""
READY: Final = "kubedl.inference-service.ready"
"""The applied spec is being served."""
NOT_READY: Final = "kubedl.inference-service.not-ready"
"""The applied spec failed or ran out of time (``reason``)."""
ROLLED_BACK: Final = "kubedl.inference-service.rolled-back"
"""The previous spec was restored (or the new service deleted: nothing served before)."""

_NAMESPACE: Final = uuid.UUID("2d7e3b1a-5c4f-4e8a-b6d9-1f0a9c3e7b52")


def inference_service_id(namespace: str, name: str) -> str:
    """``kubedl.inference-service.<namespace>.<name>``: an InferenceService's resource id (events).

    Example:
        >>> inference_service_id("ml", "fraud")
        'kubedl.inference-service.ml.fraud'
    """
    return f"kubedl.inference-service.{namespace}.{name}"


@dataclass(frozen=True)
class InferenceServiceEvent:
    """One thing that happened to an InferenceService.

    Attributes:
        event: Its name, ``kubedl.inference-service.<what>``.
        namespace: The service's namespace.
        name: Its name.
        uid: Its uid (empty once deleted before it had one).
        resource_version: The resourceVersion the event is about.
        payload: What else is worth knowing (reason, URL, runtime, storage URI), as text.
    """

    event: str
    namespace: str
    name: str
    uid: str
    resource_version: str
    payload: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def resource_id(self) -> str:
        """``kubedl.inference-service.<namespace>.<name>``: the resource the event is about."""
        return inference_service_id(self.namespace, self.name)

    @property
    def id(self) -> str:
        """A UUID derived from the uid, the event and the resourceVersion."""
        basis = "\n".join(
            (self.uid or f"{self.namespace}/{self.name}", self.event, self.resource_version)
        )
        return str(uuid.uuid5(_NAMESPACE, basis))


ServingCallback = Callable[[InferenceServiceEvent], object]
"""Called with each :class:`InferenceServiceEvent`, in order, on a thread of its own."""
