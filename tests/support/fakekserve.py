"""KServe's controller played against the in-memory API server, for the serving unit tests.

:class:`FakeKserve` reports each applied generation of the InferenceServices of a namespace
Ready, with ``status.canaryStatuses`` for a canary, as KServe v0.20 does; it can play a canary
that never gets ready and a model that fails as the stable predictor. The real controller runs in
``tests/integration/test_serving_rollout.py`` and, with real pods, in
``tests/integration/process_node/test_process_kserve.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kubedl_prefect.kube.resources import INFERENCE_SERVICES
from tests.support.fakeapi import FakeKubeAPI


@dataclass
class FakeKserve:
    """Writes each new generation's status: Ready, or what the settings below make of it."""

    api: FakeKubeAPI
    namespace: str = "ml"
    canary_ready: bool = True
    """Whether a canary reports ready (``CanaryPredictorReady``)."""
    failing_stable_uri: str | None = None
    """A model that fails as the stable predictor (``ReconcileFailed``), whatever its canary."""
    specs: list[dict[str, Any]] = field(default_factory=list)
    """Every generation's spec, in the order they were seen."""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FakeKserve]:
        """Play the controller (on the current loop) while the block runs."""
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        seen: dict[str, int] = {}
        while True:
            for isvc in self.api.store.list(INFERENCE_SERVICES, self.namespace):
                name, generation = isvc["metadata"]["name"], isvc["metadata"]["generation"]
                if seen.get(name) != generation:
                    seen[name] = generation
                    self.specs.append(isvc["spec"])
                    self.api.store.merge(
                        INFERENCE_SERVICES, self.namespace, name, {"status": self.status(isvc)}
                    )
            await asyncio.sleep(0.02)

    def status(self, isvc: dict[str, Any]) -> dict[str, Any]:
        """The status KServe would write for ``isvc``'s generation."""
        name = isvc["metadata"]["name"]
        conditions: list[dict[str, str]] = [
            {"type": kind, "status": "True"} for kind in ("Ready", "PredictorReady", "IngressReady")
        ]
        if isvc["spec"]["predictor"]["model"]["storageUri"] == self.failing_stable_uri:
            conditions[0] = {
                "type": "Ready",
                "status": "False",
                "reason": "ReconcileFailed",
                "message": "the model cannot be loaded",
            }
        status: dict[str, Any] = {
            "observedGeneration": isvc["metadata"]["generation"],
            "url": f"http://{name}-{self.namespace}.example.com",
            "address": {"url": f"http://{name}-predictor.{self.namespace}.svc.cluster.local"},
            "conditions": conditions,
            "canaryStatuses": None,
        }
        canaries = isvc["spec"].get("canary") or []
        if canaries:
            ready = self.canary_ready
            status["canaryStatuses"] = [
                {"name": c["predictor"]["name"], "ready": ready, "trafficPercent": 50}
                for c in canaries
            ]
            conditions.append(
                {
                    "type": "CanaryPredictorReady",
                    "status": "True" if ready else "False",
                    "reason": "AllCanariesReady" if ready else "CanariesNotReady",
                }
            )
        return status
