"""A canary release against the in-memory API server: each branch of run_canary / arun_canary.

The fake API plays the API server; ``FakeKserve`` (tests/support) plays KServe's controller (it
reports every applied generation Ready, with ``status.canaryStatuses`` for a canary); two small
V2 servers on 127.0.0.1 play the stable and the candidate predictor's Services. The real
cluster's version is tests/integration/process_node/test_process_kserve.py (long).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from kubedl_prefect.errors import InferenceServiceNotReadyError, InferenceServiceSpecError
from kubedl_prefect.kube.resources import INFERENCE_SERVICES
from kubedl_prefect.serving import (
    Canary,
    CanaryCheck,
    InferenceServiceDeployer,
    InferenceServiceSpec,
    arun_canary,
    run_canary,
)
from kubedl_prefect.serving.release import cluster_address, predictor_service
from tests.support.fakeapi import FakeKubeAPI
from tests.support.fakekserve import FakeKserve

NAMESPACE = "ml"
STABLE_URI = "s3://ml/m-stable/artifacts"
CANDIDATE_URI = "s3://ml/m-candidate/artifacts"
ROWS = [[[float(i), 1.0]] for i in range(4)]
CHECK = CanaryCheck(min_requests=4, max_difference=0.5)


@dataclass
class Predictor:
    """A V2 model server: answers ``sum(row) + shift`` per row, or fails with ``status``."""

    shift: float = 0.0
    status: int = 200
    requests: int = 0
    url: str = ""

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"name": request.match_info["model"], "ready": True})

    async def infer(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.status != 200:
            return web.json_response({"error": "the model crashed"}, status=self.status)
        (tensor,) = (await request.json())["inputs"]
        width = tensor["shape"][1]
        data = tensor["data"]
        sums = [sum(data[i : i + width]) + self.shift for i in range(0, len(data), width)]
        return web.json_response(
            {"outputs": [{"name": "y", "shape": [len(sums), 1], "datatype": "FP32", "data": sums}]}
        )


@contextlib.asynccontextmanager
async def serving(predictor: Predictor) -> AsyncIterator[Predictor]:
    app = web.Application()
    app.router.add_get("/v2/models/{model}/ready", predictor.ready)
    app.router.add_post("/v2/models/{model}/infer", predictor.infer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    predictor.url = f"http://{host}:{port}"
    try:
        yield predictor
    finally:
        await runner.cleanup()


@dataclass
class Bed:
    api: FakeKubeAPI
    kserve: FakeKserve
    deployer: InferenceServiceDeployer
    stable: Predictor
    candidate: Predictor
    rollbacks: list[str]

    def address(self, service: str) -> str:
        return {"clf-predictor": self.stable.url, "clf-canary-predictor": self.candidate.url}[
            service
        ]

    def on_rollback(self) -> None:
        self.rollbacks.append("alias restored")

    def live(self) -> dict[str, Any]:
        found = self.api.store.get(INFERENCE_SERVICES, NAMESPACE, "clf")
        assert found is not None
        return found


@pytest.fixture
async def bed(fake_api: FakeKubeAPI) -> AsyncIterator[Bed]:
    deployer = InferenceServiceDeployer(namespace=NAMESPACE, credentials=fake_api.credentials)
    async with (
        FakeKserve(fake_api, NAMESPACE).running() as kserve,
        serving(Predictor()) as stable,
        serving(Predictor()) as candidate,
    ):
        made = Bed(fake_api, kserve, deployer, stable, candidate, [])
        await deployer.deploy(spec(), timeout_s=10)  # the stable model serves
        try:
            yield made
        finally:
            await deployer.close()


def spec(*, canary: bool = False) -> InferenceServiceSpec:
    return InferenceServiceSpec(
        name="clf",
        storage_uri=STABLE_URI,
        canary=Canary(CANDIDATE_URI, traffic_percent=50) if canary else None,
    )


async def release(bed: Bed, **overrides: Any) -> Any:
    arguments: dict[str, Any] = {
        "check": CHECK,
        "address": bed.address,
        "timeout_s": 10,
        "ready_timeout_s": 5,
        "on_rollback": bed.on_rollback,
        **overrides,
    }
    return await arun_canary(bed.deployer, spec(canary=True), ROWS, **arguments)


def model(live: dict[str, Any]) -> tuple[str, bool]:
    return live["spec"]["predictor"]["model"]["storageUri"], bool(live["spec"].get("canary"))


async def test_a_candidate_within_the_check_is_promoted(bed: Bed) -> None:
    bed.candidate.shift = 0.25
    outcome = await release(bed)
    assert outcome.promoted, outcome.verdict.reason
    assert list(outcome.stable) == [[1.0], [2.0], [3.0], [4.0]]
    assert list(outcome.candidate) == [[1.25], [2.25], [3.25], [4.25]]
    assert outcome.verdict.largest_difference == pytest.approx(0.25)
    # Deployed with the canary (both Services got the same 4 requests), then promoted.
    assert [model({"spec": s}) for s in bed.kserve.specs[1:]] == [
        (STABLE_URI, True),
        (CANDIDATE_URI, False),
    ]
    assert (bed.stable.requests, bed.candidate.requests) == (4, 4)
    assert model(bed.live()) == (CANDIDATE_URI, False)
    assert outcome.serving.storage_uri == CANDIDATE_URI
    assert bed.rollbacks == []


@pytest.mark.parametrize(
    ("shift", "status", "reason"),
    [
        (2.0, 200, "differ from the stable model's by up to 2"),
        (0.0, 500, "the candidate failed 4 of 4 requests (100%)"),
    ],
)
async def test_a_candidate_that_differs_or_errors_is_rolled_back(
    bed: Bed, shift: float, status: int, reason: str
) -> None:
    bed.candidate.shift, bed.candidate.status = shift, status
    outcome = await release(bed)
    assert not outcome.promoted
    assert reason in outcome.verdict.reason
    # The stable model alone again, the alias restored; the stable model still answers.
    assert model(bed.live()) == (STABLE_URI, False)
    assert outcome.serving.storage_uri == STABLE_URI
    assert bed.rollbacks == ["alias restored"]
    assert list(outcome.stable) == [[1.0], [2.0], [3.0], [4.0]]


async def test_a_promoted_candidate_that_fails_restores_the_stable_model_alone(bed: Bed) -> None:
    # It answered well as the canary, but as the stable predictor it does not become Ready:
    # the rollback restores what served before the release, not the release's canary.
    bed.kserve.failing_stable_uri = CANDIDATE_URI
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await release(bed)
    assert caught.value.rolled_back
    assert caught.value.reason == "ReconcileFailed"
    assert "the previous spec was restored and is Ready again" in caught.value.message
    assert [model({"spec": s}) for s in bed.kserve.specs[1:]] == [
        (STABLE_URI, True),
        (CANDIDATE_URI, False),
        (STABLE_URI, False),
    ]
    assert model(bed.live()) == (STABLE_URI, False)
    assert bed.rollbacks == ["alias restored"]


async def test_a_stable_model_that_does_not_answer_promotes_nothing(bed: Bed) -> None:
    bed.stable.status = 503
    outcome = await release(bed)
    assert not outcome.promoted
    assert "the stable model answered none of the 4 requests" in outcome.verdict.reason
    assert model(bed.live()) == (STABLE_URI, False)


async def test_a_canary_that_never_gets_ready_is_rolled_back_by_the_deployment(bed: Bed) -> None:
    bed.kserve.canary_ready = False
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await release(bed, timeout_s=1)
    assert caught.value.rolled_back
    assert caught.value.timed_out
    assert caught.value.reason == "CanaryNotReady"
    assert model(bed.live()) == (STABLE_URI, False)
    assert bed.rollbacks == ["alias restored"]
    assert bed.candidate.requests == 0


async def test_a_service_without_a_candidate_is_refused_before_anything_is_applied(
    bed: Bed,
) -> None:
    before = bed.live()["metadata"]["resourceVersion"]
    with pytest.raises(InferenceServiceSpecError, match="no canary"):
        await arun_canary(bed.deployer, spec(), ROWS, address=bed.address)
    assert bed.live()["metadata"]["resourceVersion"] == before


async def test_the_blocking_twin_runs_the_same_release(bed: Bed) -> None:
    run: Callable[..., Any] = run_canary
    outcome = await asyncio.to_thread(
        run,
        bed.deployer,
        spec(canary=True),
        ROWS,
        check=CHECK,
        address=bed.address,
        timeout_s=10,
        ready_timeout_s=5,
    )
    assert outcome.promoted
    assert model(bed.live()) == (CANDIDATE_URI, False)


def test_services_are_named_and_reached_as_kserve_names_them() -> None:
    service = spec(canary=True)
    assert predictor_service(service, "canary") == "clf-canary-predictor"
    where = cluster_address("ml", "http://clf-predictor.ml.svc.corp.example")
    assert where("clf-canary-predictor") == "http://clf-canary-predictor.ml.svc.corp.example"
