"""Fixtures shared by the unit tests: the in-memory Kubernetes API server (tests/support).

``fake_api`` serves on the test's own event loop (async tests); ``fake_api_thread`` serves on a
thread of its own, for sync tests (its controls work from any thread); ``fake_client`` is a
:class:`~kubedl_prefect.kube.client.KubeClient` connected to ``fake_api`` with its token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import connect
from tests.support.fakeapi import FakeKubeAPI


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeKubeAPI]:
    """A started in-memory API server (HTTP, bearer token), stopped after the test."""
    async with FakeKubeAPI() as server:
        yield server


@pytest.fixture
def fake_api_thread() -> Iterator[FakeKubeAPI]:
    """The same server on its own thread and loop, for sync tests."""
    with FakeKubeAPI.serve_in_thread() as server:
        yield server


@pytest.fixture
async def fake_client(fake_api: FakeKubeAPI) -> AsyncIterator[KubeClient]:
    """A client of ``fake_api`` (its ``BearerToken`` credentials), closed after the test."""
    client = await connect(fake_api.credentials)
    yield client
    await client.close()
