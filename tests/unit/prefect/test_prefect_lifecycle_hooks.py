"""The lifecycle hooks the Prefect surface uses, against the in-memory API server.

``KubernetesBackend(labels=...)`` labels the jobs a flow run creates, ``find_jobs`` finds them
again (and only them), ``replicas`` reads a job's pods from the shared watch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubedl_prefect.kube.credentials import connect
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import SessionPool
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.prefect.cleanup import FLOW_RUN_LABEL
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from tests.support.operator import FakeOperator


def spec(name: str = "mnist") -> TrainingJobSpec:
    return parse_spec({"name": name, "image": "busybox", "replicas": {"master": 1, "worker": 2}})


@pytest.fixture
async def pool() -> AsyncIterator[SessionPool]:
    made = SessionPool()
    yield made
    await KubeRuntime.get().run(made.close())


async def test_find_jobs_returns_the_jobs_of_one_flow_run_only(
    fake_api: Any, pool: SessionPool
) -> None:
    ours = KubernetesBackend(
        namespace="ml", credentials=fake_api.credentials, pool=pool, labels={FLOW_RUN_LABEL: "a"}
    )
    theirs = KubernetesBackend(
        namespace="ml", credentials=fake_api.credentials, pool=pool, labels={FLOW_RUN_LABEL: "b"}
    )
    kubeflow = KubernetesBackend(
        namespace="ml",
        dialect="kubeflow",
        credentials=fake_api.credentials,
        pool=pool,
        labels={FLOW_RUN_LABEL: "a"},
    )
    try:
        first = await ours.submit(spec(), key="one")
        other = await kubeflow.submit(spec("other"), key="two")
        await theirs.submit(spec(), key="three")
        # Adopting a job another flow run created does not make it ours.
        await ours.submit(spec(), key="three")
        found = await ours.find_jobs({FLOW_RUN_LABEL: "a"})
        assert sorted((r.name, r.dialect, r.key, r.attempt) for r in found) == sorted(
            [(first.name, "kubedl", "one", 1), (other.name, "kubeflow", "two", 1)]
        )
        assert {r.uid for r in found} == {first.uid, other.uid}
        assert await ours.find_jobs({FLOW_RUN_LABEL: "nobody"}) == []
    finally:
        for backend in (ours, theirs, kubeflow):
            await backend.close()


async def test_replicas_lists_the_jobs_pods_with_their_nodes(
    fake_api: Any, pool: SessionPool
) -> None:
    backend = KubernetesBackend(namespace="ml", credentials=fake_api.credentials, pool=pool)
    client = await connect(fake_api.credentials)
    try:
        ref = await backend.submit(spec(), key="pods")
        await FakeOperator(client).pods(ref, {"master": 1, "worker": 2})
        states = await backend.replicas(ref)
        # The API server keeps no status given at creation: the pods are Pending, bound.
        assert [(s.replica, s.node, s.phase) for s in states] == [
            ("master-0", "gpu-node-0", "Pending"),
            ("worker-0", "gpu-node-0", "Pending"),
            ("worker-1", "gpu-node-0", "Pending"),
        ]
        assert all(s.pod.startswith(ref.name) for s in states)
    finally:
        await client.close()
        await backend.close()
