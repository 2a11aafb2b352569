"""Informer behaviour on stream endings the real API server does not produce on demand.

A scripted stand-in for ``KubeClient`` plays each list and watch answer in turn; the integration
tests cover the same loop against the real API server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubedl_prefect.errors import ForbiddenError, KubeConnectionError, WatchError
from kubedl_prefect.kube.client import ObjectList
from kubedl_prefect.kube.resources import PODS, KubeObject, ResourceKind
from kubedl_prefect.kube.watch import Informer, WatchHub, WatchSettings

FAST = WatchSettings(backoff_initial_s=0.001, backoff_max_s=0.01, linger_s=0.01)


def obj(name: str, rv: str, **extra: Any) -> KubeObject:
    return {"metadata": {"name": name, "resourceVersion": rv}, **extra}


class ScriptedClient:
    """Answers list() and watch() calls from scripts, recording where each watch started."""

    cluster_id = "scripted"

    def __init__(self, lists: list[ObjectList], watches: list[list[Any]]):
        self.lists = lists
        self.watches = watches
        self.watch_starts: list[str] = []

    async def list(self, kind: ResourceKind, namespace: str | None) -> ObjectList:
        answer = self.lists.pop(0)
        return answer

    async def watch(
        self, kind: ResourceKind, namespace: str | None, *, resource_version: str, **_: Any
    ) -> AsyncIterator[KubeObject]:
        self.watch_starts.append(resource_version)
        if not self.watches:
            await asyncio.Event().wait()  # stay connected and silent
        for item in self.watches.pop(0):
            if isinstance(item, BaseException):
                raise item
            yield item


async def collect(informer: Informer, count: int) -> list[tuple[str, str]]:
    """Subscribe before the informer starts, so that every event it emits is seen."""
    subscription = informer.subscribe(lambda o: True)
    informer.start()
    seen = []
    for _ in range(count):
        event = await asyncio.wait_for(subscription.next(), 5)
        seen.append((event.type, event.name))
    return seen


async def test_resumes_from_the_last_bookmark_after_a_dropped_stream() -> None:
    client = ScriptedClient(
        lists=[ObjectList([obj("a", "1")], "10")],
        watches=[
            [
                {"type": "ADDED", "object": obj("b", "11")},
                {"type": "BOOKMARK", "object": obj("", "15")},
            ],
            [KubeConnectionError("reset")],
            [{"type": "MODIFIED", "object": obj("a", "16")}],
        ],
    )
    informer = Informer(client, PODS, "ns", FAST)  # type: ignore[arg-type]
    seen = await collect(informer, 3)
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a")]
    assert client.watch_starts[:3] == ["10", "15", "15"]
    assert informer.stats.lists == 1
    assert informer.stats.bookmarks == 1
    assert informer.stats.reconnects == 1
    await informer.stop()


async def test_gone_lists_again_and_reports_what_changed_meanwhile() -> None:
    client = ScriptedClient(
        lists=[
            ObjectList([obj("a", "1"), obj("b", "2")], "10"),
            ObjectList([obj("b", "30"), obj("c", "31")], "32"),
        ],
        watches=[[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]],
    )
    informer = Informer(client, PODS, "ns", FAST)  # type: ignore[arg-type]
    seen = await collect(informer, 5)
    assert seen == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("DELETED", "a"),
        ("MODIFIED", "b"),
        ("ADDED", "c"),
    ]
    assert informer.stats.expired == 1
    assert client.watch_starts == ["10", "32"]
    assert set(informer.store) == {"b", "c"}
    await informer.stop()


async def test_forbidden_ends_the_informer_and_reaches_subscribers() -> None:
    client = ScriptedClient(
        lists=[ObjectList([], "1")],
        # Refusals are tolerated a few times in a row (an API server just restarted), not more.
        watches=[[ForbiddenError("no watch for you", status=403)]] * (FAST.forbidden_retries + 1),
    )
    informer = Informer(client, PODS, "ns", FAST)  # type: ignore[arg-type]
    subscription = informer.subscribe(lambda o: True)
    informer.start()
    with pytest.raises(WatchError, match="no watch for you") as caught:
        await asyncio.wait_for(subscription.next(), 5)
    assert not caught.value.retryable
    assert informer.stats.reconnects == FAST.forbidden_retries
    with pytest.raises(WatchError):  # and again for later calls
        await subscription.next()


async def test_hub_shares_one_informer_and_reaps_it_when_unused() -> None:
    client = ScriptedClient(lists=[ObjectList([obj("a", "1")], "5")], watches=[])
    hub = WatchHub(FAST)
    scripted: Any = client
    async with (
        hub.subscribe(scripted, PODS, "ns", lambda o: o["metadata"]["name"] == "a") as one,
        hub.subscribe(scripted, PODS, "ns", lambda o: True) as two,
    ):
        assert len(hub.informers()) == 1
        assert (await one.next()).name == "a"
        assert (await two.next()).name == "a"
    assert len(client.watch_starts) == 1
    await asyncio.sleep(0.05)
    assert hub.informers() == []
    await hub.close()
