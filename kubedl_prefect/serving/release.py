"""A canary release: the candidate next to the stable model, the same test traffic, then a verdict.

:func:`arun_canary` (blocking twin: :func:`run_canary`) runs the whole sequence for an
:class:`~.spec.InferenceServiceSpec` whose ``canary`` is the candidate:

1. deploys it with :meth:`~.deploy.InferenceServiceDeployer.deploy`, whose wait includes KServe's
   ``status.canaryStatuses``; a candidate that does not even start (its pod crash-loops) is
   rolled back there (``on_rollback`` runs) and raises
   :class:`~kubedl_prefect.errors.InferenceServiceNotReadyError`;
2. waits until each predictor's Service answers ``/v2/models/<name>/ready`` (a Service's
   endpoints follow its pods' readiness with a delay), at most ``ready_timeout_s``;
3. sends every request of ``requests`` to the stable Service, then the same request to the
   candidate's (``<name>-<canary name>-predictor``), and keeps each answer's outputs flattened,
   ``None`` for a request that failed (no connection, a timeout, an HTTP error, no outputs);
4. decides with the pure :func:`~.canary.canary_verdict` and :class:`~.canary.CanaryCheck`;
5. promotes (deploys the candidate as the stable model, without a canary; if that fails, the
   deployment restores the stable model alone, not the stable model with its canary) or rolls
   back (deploys the stable model alone again, then calls ``on_rollback``: the registry's
   ``restore_alias``, so the champion alias names what serves).

Where the Services are reached: ``address(service)`` gives a Service's base URL. By default it is
the cluster's DNS name, ``http://<service>.<namespace>.svc.<domain>`` (the domain of KServe's
``status.address.url``), reachable from inside the cluster; from outside, pass a port-forward's
address, or on the test bed the process node's forwarder (``kubedl-prefect testbed services``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

from kubedl_prefect.errors import InferenceServiceSpecError, SpecIssue
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.serving.canary import Answer, CanaryCheck, CanaryVerdict, canary_verdict
from kubedl_prefect.serving.deploy import (
    InferenceServiceDeployer,
    RollbackCallback,
    ServingOutcome,
)
from kubedl_prefect.serving.events import ServingCallback
from kubedl_prefect.serving.local import v2_request
from kubedl_prefect.serving.spec import InferenceServiceSpec

ServiceAddress = Callable[[str], str]
"""The base URL (``http://host:port``) where a Service, named, answers."""

DEFAULT_CHECK: Final = CanaryCheck()
"""The documented check with its defaults (10 requests at least, no error)."""
READY_POLL_S: Final = 0.5
"""How often a Service's model readiness is asked while waiting for it."""


@dataclass(frozen=True)
class CanaryOutcome:
    """How a canary release ended.

    Attributes:
        verdict: What the check found (:attr:`~.canary.CanaryVerdict.promote`: promoted).
        serving: The deployment that serves now: the candidate as the stable model when
            promoted, the stable model alone otherwise.
        stable: The stable model's answers to the requests, in order (``None``: failed).
        candidate: The candidate's answers to the same requests.
    """

    verdict: CanaryVerdict
    serving: ServingOutcome
    stable: tuple[Answer, ...]
    candidate: tuple[Answer, ...]

    @property
    def promoted(self) -> bool:
        """Whether the candidate replaced the stable model."""
        return self.verdict.promote


def predictor_service(service: InferenceServiceSpec, predictor: str | None = None) -> str:
    """The name of KServe's Service of the stable predictor, or of the canary ``predictor``.

    Example:
        >>> spec = InferenceServiceSpec(name="fraud", storage_uri="s3://ml/m-ab/artifacts")
        >>> predictor_service(spec), predictor_service(spec, "canary")
        ('fraud-predictor', 'fraud-canary-predictor')
    """
    return f"{service.name}-{predictor}-predictor" if predictor else f"{service.name}-predictor"


def cluster_address(namespace: str, address_url: str | None) -> ServiceAddress:
    """Services by their cluster DNS names, in the domain of KServe's ``status.address.url``.

    Example:
        >>> where = cluster_address("ml", "http://fraud-predictor.ml.svc.cluster.local")
        >>> where("fraud-canary-predictor")
        'http://fraud-canary-predictor.ml.svc.cluster.local'
        >>> cluster_address("ml", None)("fraud-predictor")
        'http://fraud-predictor.ml.svc.cluster.local'
    """
    host = urlsplit(address_url or "").hostname or ""
    _, found, domain = host.partition(f".{namespace}.svc.")
    suffix = domain if found and domain else "cluster.local"
    return lambda service: f"http://{service}.{namespace}.svc.{suffix}"


def flattened(answer: Any) -> Answer:
    """A V2 inference answer's outputs as one list of numbers (``None``: it has no outputs).

    Values that are not numbers become NaN, which the check refuses as not finite.

    Example:
        >>> flattened({"outputs": [{"name": "o", "shape": [1, 2], "data": [0.5, 1]}]})
        [0.5, 1.0]
        >>> flattened({"error": "no model"}) is None
        True
    """
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if not isinstance(outputs, list) or not outputs:
        return None
    values: list[float] = []

    def add(data: Any) -> None:
        if isinstance(data, list):
            for item in data:
                add(item)
        elif isinstance(data, int | float) and not isinstance(data, bool):
            values.append(float(data))
        else:
            values.append(math.nan)

    for output in outputs:
        add(output.get("data") if isinstance(output, dict) else None)
    return values


async def _wait_model_ready(
    client: httpx.AsyncClient, base: str, model: str, timeout_s: float
) -> bool:
    """Whether ``base`` said the model is ready within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = await client.get(f"{base}/v2/models/{model}/ready")
            if answer.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(READY_POLL_S, left))


async def _ask(client: httpx.AsyncClient, url: str, request: dict[str, Any]) -> Answer:
    try:
        answer = await client.post(url, json=request)
        if answer.status_code != 200:
            return None
        return flattened(answer.json())
    except (httpx.HTTPError, ValueError):
        return None


async def send_to_both(
    stable: str,
    candidate: str,
    model: str,
    requests: Sequence[Any],
    *,
    ready_timeout_s: float = 120.0,
    request_timeout_s: float = 30.0,
) -> tuple[list[Answer], list[Answer]]:
    """The answers of the stable and the candidate Service to the same ``requests``.

    Waits (each at most ``ready_timeout_s``) until both say the model is ready, then sends each
    request to the stable Service and then to the candidate's.

    Args:
        stable: The stable predictor Service's base URL.
        candidate: The candidate's.
        model: The V2 model name (the InferenceService's name).
        requests: V2 inference requests, or rows of numbers (see
            :func:`~.local.v2_request`).
        ready_timeout_s: How long each Service may take to say the model is ready.
        request_timeout_s: How long one request may take.
    """
    bodies = [v2_request(request) for request in requests]
    async with httpx.AsyncClient(timeout=request_timeout_s) as client:
        await asyncio.gather(
            _wait_model_ready(client, stable, model, ready_timeout_s),
            _wait_model_ready(client, candidate, model, ready_timeout_s),
        )
        found: tuple[list[Answer], list[Answer]] = ([], [])
        for body in bodies:
            for base, answers in zip((stable, candidate), found, strict=True):
                answers.append(await _ask(client, f"{base}/v2/models/{model}/infer", body))
    return found


def _candidate_problem(service: InferenceServiceSpec) -> InferenceServiceSpecError | None:
    if service.canary is None:
        return InferenceServiceSpecError(
            [
                SpecIssue(
                    "canary",
                    "a canary release needs a candidate, and this service has no canary",
                    "give the candidate as canary=Canary(storage_uri, traffic_percent, link=...)",
                )
            ],
            name=service.name,
        )
    return None


async def arun_canary(
    deployer: InferenceServiceDeployer,
    service: InferenceServiceSpec,
    requests: Sequence[Any],
    *,
    check: CanaryCheck = DEFAULT_CHECK,
    address: ServiceAddress | None = None,
    timeout_s: float = 600.0,
    ready_timeout_s: float = 120.0,
    request_timeout_s: float = 30.0,
    on_event: ServingCallback | None = None,
    on_rollback: RollbackCallback | None = None,
) -> CanaryOutcome:
    """Deploy ``service``'s canary, send both models ``requests``, then promote or roll back.

    Args:
        deployer: Where and how to deploy.
        service: The stable model, with the candidate as its ``canary``.
        requests: The test traffic: V2 inference requests or rows of numbers, each sent to
            both models (at least ``check.min_requests``).
        check: When the candidate passes (:class:`~.canary.CanaryCheck`).
        address: The base URL of a Service, by name; default: its cluster DNS name.
        timeout_s: How long each deployment (with the canary, then the outcome) may take to
            become Ready.
        ready_timeout_s: How long each Service may take to answer that the model is ready.
        request_timeout_s: How long one request may take.
        on_event: Called with each :class:`~.events.InferenceServiceEvent` of the deployments.
        on_rollback: Called (in a worker thread) after the candidate was rolled back, here or
            by a deployment that failed: pass ``lambda: registry.restore_alias(decision)``.

    Returns:
        The verdict, the answers and what serves now.

    Raises:
        InferenceServiceSpecError: ``service`` has no canary, or is invalid (nothing applied).
        InferenceServiceNotReadyError: A deployment failed or timed out and was rolled back
            (the candidate's pods did not start, or the promoted or restored spec did not
            become Ready).
    """
    problem = _candidate_problem(service)
    if problem is not None:
        raise problem
    candidate = service.canary
    assert candidate is not None
    deployed = await deployer.deploy(
        service, timeout_s=timeout_s, on_event=on_event, on_rollback=on_rollback
    )
    live = await deployer.get(service.name, namespace=deployed.namespace)
    where = address or cluster_address(
        deployed.namespace, (((live or {}).get("status") or {}).get("address") or {}).get("url")
    )
    stable_answers, candidate_answers = await send_to_both(
        where(predictor_service(service)),
        where(predictor_service(service, candidate.name)),
        service.name,
        requests,
        ready_timeout_s=ready_timeout_s,
        request_timeout_s=request_timeout_s,
    )
    verdict = canary_verdict(stable_answers, candidate_answers, check)
    if verdict.promote:
        promoted = replace(
            service, storage_uri=candidate.storage_uri, link=candidate.link, canary=None
        )
        serving = await deployer.deploy(
            promoted,
            timeout_s=timeout_s,
            on_event=on_event,
            on_rollback=on_rollback,
            restore=replace(service, canary=None),  # the stable model alone, not its canary
        )
    else:
        try:
            serving = await deployer.deploy(
                replace(service, canary=None), timeout_s=timeout_s, on_event=on_event
            )
        finally:
            if on_rollback is not None:
                await asyncio.to_thread(on_rollback)
    return CanaryOutcome(verdict, serving, tuple(stable_answers), tuple(candidate_answers))


def run_canary(
    deployer: InferenceServiceDeployer,
    service: InferenceServiceSpec,
    requests: Sequence[Any],
    *,
    check: CanaryCheck = DEFAULT_CHECK,
    address: ServiceAddress | None = None,
    timeout_s: float = 600.0,
    ready_timeout_s: float = 120.0,
    request_timeout_s: float = 30.0,
    on_event: ServingCallback | None = None,
    on_rollback: RollbackCallback | None = None,
) -> CanaryOutcome:
    """Blocking :func:`arun_canary`, for sync code (same arguments, same result)."""
    return KubeRuntime.get().block_on(
        arun_canary(
            deployer,
            service,
            requests,
            check=check,
            address=address,
            timeout_s=timeout_s,
            ready_timeout_s=ready_timeout_s,
            request_timeout_s=request_timeout_s,
            on_event=on_event,
            on_rollback=on_rollback,
        )
    )
