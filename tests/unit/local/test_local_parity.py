"""The same flow code on the local backend and on the Kubernetes one: only the backend changes.

``nightly`` stands for a flow's body: it knows only :class:`TrainingBackend`. It runs once on
the local backend (real processes) and once on the Kubernetes backend against the in-memory API
server with a played operator (tests/support), and both give the same answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kubedl_prefect.kube.credentials import connect
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import SessionPool
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate, TrainingBackend
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.local import LocalBackend
from kubedl_prefect.lifecycle.retry import RetryPolicy, arun_to_completion
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import TrainingJobSpec
from tests.support.operator import FakeOperator
from tests.unit.local.helpers import SpecFactory


@dataclass(frozen=True)
class Report:
    succeeded: bool
    attempt: int
    last_phase: Phase
    replayed_again: bool
    attached: bool


async def nightly(
    backend: TrainingBackend,
    spec: TrainingJobSpec,
    key: str,
    on_attempt: Callable[[JobRef], None] = lambda ref: None,
) -> Report:
    """A flow's body: train, then replay the same key (it must not train again)."""
    phases: list[PhaseUpdate] = []
    retry = RetryPolicy(max_attempts=2, backoff_s=0.0)
    outcome = await arun_to_completion(
        backend, spec, key=key, retry=retry, on_phase=phases.append, on_attempt=on_attempt
    )
    attached = (await backend.attach(outcome.ref)) == outcome.ref
    again = await arun_to_completion(backend, spec, key=key, retry=retry)
    await backend.close()
    return Report(
        outcome.succeeded, outcome.ref.attempt, phases[-1].phase, again.replayed, attached
    )


@pytest.fixture
async def kubernetes(fake_api: Any) -> AsyncIterator[tuple[KubernetesBackend, FakeOperator]]:
    pool = SessionPool()
    client = await connect(fake_api.credentials)
    backend = KubernetesBackend(namespace="ml", credentials=fake_api.credentials, pool=pool)
    yield backend, FakeOperator(client)
    await client.close()
    await KubeRuntime.get().run(pool.close())


async def test_the_same_flow_code_runs_on_both_backends(
    backend: LocalBackend,
    replica_spec: SpecFactory,
    kubernetes: tuple[KubernetesBackend, FakeOperator],
) -> None:
    spec = replica_spec(workers=2)
    local = await nightly(backend, spec, "nightly-1")

    cluster, operator = kubernetes
    played: list[asyncio.Task[Any]] = []

    def play(ref: JobRef) -> None:
        played.append(asyncio.ensure_future(operator.run_to(ref)))

    remote = await nightly(cluster, spec, "nightly-1", on_attempt=play)
    await asyncio.gather(*played)

    assert local == remote == Report(True, 1, Phase.SUCCEEDED, True, True)
