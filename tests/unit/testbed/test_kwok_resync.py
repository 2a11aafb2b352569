"""After kwok restarts, the test bed shows it its nodes' pods again (against the fake API).

kwok v0.8 may skip the pods of a node whose Lease it has just created (its cache does not have
the Lease yet) and then leave them as they are: in one CI run a Running pod on one node never
ended after ``testbed.restart("kwok")``. The restart now waits until kwok holds every Lease and
touches the pods of those nodes, which kwok then plays again. The restart itself runs in
``tests/integration/test_lifecycle.py`` (long: logs across a broken stream).
"""

from __future__ import annotations

import asyncio

import pytest

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import LEASES, PODS, KubeObject
from kubedl_prefect.testbed import cluster
from tests.support.fakeapi import FakeKubeAPI


def pod(name: str, node: str) -> KubeObject:
    metadata = {"name": name, "namespace": "ml"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"nodeName": node}}


def lease(node: str) -> KubeObject:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "vm_new"},
    }


def annotations_of(api: FakeKubeAPI, name: str) -> dict[str, str]:
    found = api.store.get(PODS, "ml", name)
    assert found is not None
    return dict(found["metadata"].get("annotations") or {})


async def test_once_kwok_holds_its_leases_the_pods_of_its_nodes_are_touched(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    for name, node in (("a", "kwok-node-0"), ("b", "kwok-node-1"), ("c", "process-node")):
        fake_api.store.create(pod(name, node), PODS)
    fake_api.store.create(lease("kwok-node-0"), LEASES)

    async def kwok_takes_node_1() -> None:  # the second Lease comes a moment later
        await asyncio.sleep(0.5)
        fake_api.store.create(lease("kwok-node-1"), LEASES)

    taking = asyncio.create_task(kwok_takes_node_1())
    touched = await cluster.resync_kwok_pods(
        fake_client, ["kwok-node-0", "kwok-node-1"], timeout_s=10
    )
    await taking

    assert touched == 2
    assert cluster.RESYNC_ANNOTATION in annotations_of(fake_api, "a")
    assert cluster.RESYNC_ANNOTATION in annotations_of(fake_api, "b")
    assert annotations_of(fake_api, "c") == {}  # not kwok's node


async def test_a_lease_kwok_never_takes_is_a_testbed_error(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    fake_api.store.create(pod("a", "kwok-node-0"), PODS)
    with pytest.raises(TestbedError, match="kwok to hold the Leases of kwok-node-0"):
        await cluster.resync_kwok_pods(fake_client, ["kwok-node-0"], timeout_s=0.5)
    assert annotations_of(fake_api, "a") == {}
