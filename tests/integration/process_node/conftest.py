"""Fixtures of the tests whose pods run for real, as processes on the test bed's process node.

``process_node`` is the session's test bed with its process node started (once per module:
starting it again is a no-op while its agent runs); ``kube`` is a client of that test bed;
``new_claim`` creates a PersistentVolumeClaim of its local provisioner in the test's namespace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PERSISTENT_VOLUME_CLAIMS, KubeObject
from kubedl_prefect.testbed.nodeagent.provisioner import STORAGE_CLASS
from kubedl_prefect.testbed.testbed import Testbed

NewClaim = Callable[..., Awaitable[KubeObject]]
"""``await new_claim(name, storage="256Mi", access="ReadWriteMany")``: the created claim."""


@pytest.fixture(scope="module")
def process_node(testbed: Testbed) -> Testbed:
    """The session's test bed, with its process node running."""
    testbed.start_process_node()
    return testbed


@pytest.fixture
async def kube(process_node: Testbed) -> AsyncIterator[KubeClient]:
    """A client of the test bed, as its administrator."""
    async with await KubeClient.from_kubeconfig(str(process_node.kubeconfig)) as client:
        yield client


@pytest.fixture
def new_claim(kube: KubeClient, namespace: str) -> NewClaim:
    """Creates a claim of the test bed's StorageClass (its local provisioner) in ``namespace``.

    Deleted with the namespace, unless the test deletes it first.
    """

    async def create(
        name: str, *, storage: str = "256Mi", access: str = "ReadWriteMany"
    ) -> KubeObject:
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "storageClassName": STORAGE_CLASS,
                "accessModes": [access],
                "resources": {"requests": {"storage": storage}},
            },
        }
        return await kube.create(PERSISTENT_VOLUME_CLAIMS, namespace, claim)

    return create
