"""Fixtures of the tests whose pods run for real, as processes on the test bed's process node.

``process_node`` is the session's test bed with its process node started (once per module:
starting it again is a no-op while its agent runs); ``kube`` is a client of that test bed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.testbed.testbed import Testbed


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
