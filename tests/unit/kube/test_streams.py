"""Watch and log streams against the in-memory API server: resume, relist, bookmarks, big lines.

The informer and the log follower run unchanged over HTTP; the server's controls break streams
and compact history the way a real API server restart or etcd compaction would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from kubedl_prefect.errors import InvalidObjectError, KubeConnectionError, WatchError
from kubedl_prefect.kube.client import (
    LOG_TRUNCATION_MARKER,
    MAX_LOG_LINE_BYTES,
    MAX_WATCH_EVENT_BYTES,
    KubeClient,
    _LineBuffer,
)
from kubedl_prefect.kube.credentials import BearerToken, connect
from kubedl_prefect.kube.logs import ContainerLogLine, LogFollower
from kubedl_prefect.kube.resources import PODS, KubeObject, ResourceKind
from kubedl_prefect.kube.watch import Informer, WatchEvent, WatchSettings
from tests.support.fakeapi import FakeKubeAPI

CONFIGMAPS = ResourceKind("", "v1", "ConfigMap", "configmaps")
FAST = WatchSettings(backoff_initial_s=0.01, backoff_max_s=0.05, linger_s=0.01)
MIB = 1024 * 1024


def configmap(name: str, value: str = "v", namespace: str = "ns") -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"value": value},
    }


async def until(condition: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll ``condition`` (state of other tasks and of the server) until it holds."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 - nothing to wait on but the state itself
            await asyncio.sleep(0.01)


class Recorder:
    """Subscribes to an informer before it starts, so that every event it emits is recorded."""

    def __init__(self, informer: Informer):
        self.informer = informer
        self.seen: list[tuple[str, str, str]] = []
        self._subscription = informer.subscribe(lambda o: True)
        self._task = asyncio.ensure_future(self._record())

    async def _record(self) -> None:
        async for event in self._subscription:
            self.seen.append((event.type, event.name, event.object["data"]["value"]))

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.informer.stop()


@pytest.fixture
async def recorder(fake_client: KubeClient) -> Any:
    recorder = Recorder(Informer(fake_client, CONFIGMAPS, "ns", FAST))
    recorder.informer.start()
    await recorder.informer.wait_synced()
    yield recorder
    await recorder.close()


# -- the informer --------------------------------------------------------------------------------


async def test_informer_lists_then_watches_and_receives_bookmarks(fake_api: FakeKubeAPI) -> None:
    fake_api.bookmark_interval_s = 0.05
    fake_api.store.apply(configmap("existing"))
    async with await _client(fake_api) as client:
        recorder = Recorder(Informer(client, CONFIGMAPS, "ns", FAST))
        recorder.informer.start()
        await recorder.informer.wait_synced()
        await client.create(CONFIGMAPS, "ns", configmap("new"))
        await client.patch(CONFIGMAPS, "ns", "new", {"data": {"value": "changed"}})
        await client.delete(CONFIGMAPS, "ns", "existing")
        await until(lambda: len(recorder.seen) == 5 and recorder.informer.stats.bookmarks >= 2)
        await recorder.close()
    assert recorder.seen == [
        ("ADDED", "existing", "v"),
        ("ADDED", "new", "v"),
        ("MODIFIED", "new", "changed"),
        # A foreground deletion (the client's default) marks the object before it goes.
        ("MODIFIED", "existing", "v"),
        ("DELETED", "existing", "v"),
    ]
    stats = recorder.informer.stats
    assert (stats.lists, stats.expired, stats.reconnects) == (1, 0, 0)
    assert fake_api.count("list") == 1
    assert fake_api.count("watch") == 1
    assert set(recorder.informer.store) == {"new"}


async def test_informer_resumes_after_dropped_watches_without_losing_or_repeating(
    fake_api: FakeKubeAPI, recorder: Recorder
) -> None:
    fake_api.store.apply(configmap("a"))
    await until(lambda: len(recorder.seen) == 1)
    watch_path = "/api/v1/namespaces/ns/configmaps"
    fake_api.fail_next("watch", watch_path, 503, "ServiceUnavailable", times=None)
    assert fake_api.drop_watches() == 1
    # Changes while the informer is disconnected are replayed from its resourceVersion.
    fake_api.store.apply(configmap("b"))
    fake_api.store.merge(CONFIGMAPS, "ns", "a", {"data": {"value": "2"}})
    await until(lambda: fake_api.count("watch", watch_path) >= 3)
    fake_api.clear_failures()
    fake_api.store.apply(configmap("c"))
    await until(lambda: ("ADDED", "c", "v") in recorder.seen)
    await asyncio.sleep(0.1)  # nothing more arrives
    assert recorder.seen == [
        ("ADDED", "a", "v"),
        ("ADDED", "b", "v"),
        ("MODIFIED", "a", "2"),
        ("ADDED", "c", "v"),
    ]
    stats = recorder.informer.stats
    assert stats.lists == 1, "a resumed watch needs no new list"
    assert stats.expired == 0
    assert stats.reconnects >= 2


async def test_informer_relists_after_410_and_emits_what_changed_meanwhile(
    fake_api: FakeKubeAPI, recorder: Recorder
) -> None:
    for name in ("keep", "gone", "changed"):
        fake_api.store.apply(configmap(name))
    await until(lambda: len(recorder.seen) == 3)
    fake_api.fail_next("watch", "/api/v1/namespaces/ns/configmaps", 503, "Unavailable", times=None)
    fake_api.drop_watches()
    fake_api.store.delete(CONFIGMAPS, "ns", "gone")
    fake_api.store.merge(CONFIGMAPS, "ns", "changed", {"data": {"value": "2"}})
    fake_api.store.apply(configmap("added"))
    fake_api.compact()
    fake_api.clear_failures()
    await until(lambda: recorder.informer.stats.expired == 1 and len(recorder.seen) == 6)
    assert sorted(recorder.seen[3:]) == [
        ("ADDED", "added", "v"),
        ("DELETED", "gone", "v"),
        ("MODIFIED", "changed", "2"),
    ]
    assert recorder.informer.stats.lists == 2
    assert set(recorder.informer.store) == {"keep", "changed", "added"}
    fake_api.store.apply(configmap("after"))
    await until(lambda: len(recorder.seen) == 7)
    assert recorder.seen[-1] == ("ADDED", "after", "v")


async def test_a_watch_with_a_selector_sees_objects_enter_and_leave_it(
    fake_client: KubeClient,
) -> None:
    since = (await fake_client.list(CONFIGMAPS, "ns")).resource_version
    events = fake_client.watch(CONFIGMAPS, "ns", resource_version=since, label_selector="app=x")
    await fake_client.create(CONFIGMAPS, "ns", configmap("a"))
    await fake_client.patch(CONFIGMAPS, "ns", "a", {"metadata": {"labels": {"app": "x"}}})
    await fake_client.patch(CONFIGMAPS, "ns", "a", {"data": {"value": "2"}})
    await fake_client.patch(CONFIGMAPS, "ns", "a", {"metadata": {"labels": {"app": "y"}}})
    seen = []
    async with asyncio.timeout(5):
        async for event in events:
            if event["type"] != "BOOKMARK":
                seen.append((event["type"], event["object"]["data"]["value"]))
            if len(seen) == 3:
                break
    await events.aclose()
    assert seen == [("ADDED", "v"), ("MODIFIED", "2"), ("DELETED", "2")]


async def test_a_watch_ends_cleanly_after_timeout_seconds(fake_client: KubeClient) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):
        events = [
            e
            async for e in fake_client.watch(
                CONFIGMAPS, "ns", resource_version="0", timeout_seconds=1
            )
        ]
    assert 0.9 <= loop.time() - started < 3
    assert all(e["type"] == "BOOKMARK" for e in events)


async def test_a_watch_from_before_the_compaction_gets_410_expired(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    old = fake_api.store.resource_version
    fake_api.store.apply(configmap("a"))
    fake_api.compact()
    async with asyncio.timeout(5):
        events = [e async for e in fake_client.watch(CONFIGMAPS, "ns", resource_version=old)]
    assert [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"


# -- large events and lines ----------------------------------------------------------------------


async def test_a_one_mebibyte_object_arrives_whole_through_the_informer(
    fake_client: KubeClient, recorder: Recorder
) -> None:
    big = "x" * MIB
    await fake_client.create(CONFIGMAPS, "ns", configmap("big", big))
    await fake_client.patch(CONFIGMAPS, "ns", "big", {"data": {"value": big + "y"}})
    await until(lambda: len(recorder.seen) == 2)
    assert recorder.seen[0] == ("ADDED", "big", big)
    assert recorder.seen[1] == ("MODIFIED", "big", big + "y")
    assert recorder.informer.stats.reconnects == 0


async def test_an_event_larger_than_any_read_buffer_still_arrives_whole(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    # 6 MiB: beyond aiohttp's line limit (twice the read buffer) that readline() enforced.
    since = fake_api.store.resource_version
    fake_api.store.apply(configmap("six", "x" * (6 * MIB)))
    events = fake_client.watch(CONFIGMAPS, "ns", resource_version=since)
    event = await asyncio.wait_for(anext(events), 10)
    await events.aclose()
    assert event["type"] == "ADDED"
    assert event["object"]["data"]["value"] == "x" * (6 * MIB)


async def test_an_event_over_the_limit_fails_the_watch_clearly(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    since = fake_api.store.resource_version
    fake_api.store.apply(configmap("huge", "x" * (MAX_WATCH_EVENT_BYTES + 1)))
    events = fake_client.watch(CONFIGMAPS, "ns", resource_version=since)
    with pytest.raises(WatchError, match="larger than") as failed:
        await anext(events)
    assert not failed.value.retryable
    assert failed.value.hint


async def test_the_informer_ends_with_the_watch_error_of_an_oversized_event(
    fake_api: FakeKubeAPI, recorder: Recorder
) -> None:
    fake_api.store.apply(configmap("huge", "x" * (MAX_WATCH_EVENT_BYTES + 1)))
    subscription = recorder.informer.subscribe(lambda o: True)

    async def events_until_failure() -> None:
        while True:
            event: WatchEvent = await subscription.next()
            assert event.name != "huge"

    with pytest.raises(WatchError, match="larger than"):
        await asyncio.wait_for(events_until_failure(), 10)


async def test_a_one_mebibyte_log_line_arrives_whole(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    fake_api.store.apply(pod("p"))
    line = "epoch 1 " + "y" * MIB
    stamped = fake_api.append_log("ns", "p", "main", "first", line, "last")
    fake_api.close_log("ns", "p", "main")
    async with asyncio.timeout(10):
        received = [text async for text in fake_client.follow_log("ns", "p", "main")]
    assert received == stamped
    assert len(received[1]) > MIB


async def test_a_log_line_over_the_limit_is_cut_with_a_marker_and_the_next_is_intact(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    fake_api.store.apply(pod("p"))
    extra = 1000
    stamped = fake_api.append_log("ns", "p", "main", "z" * (MAX_LOG_LINE_BYTES + extra), "next")
    fake_api.close_log("ns", "p", "main")
    async with asyncio.timeout(20):
        received = [text async for text in fake_client.follow_log("ns", "p", "main")]
    assert len(received) == 2
    stamp = stamped[0].split(" ")[0]
    kept = MAX_LOG_LINE_BYTES - len(stamp) - 1
    marker = LOG_TRUNCATION_MARKER.format(dropped=extra + len(stamp) + 1)
    assert received[0] == f"{stamp} {'z' * kept}{marker}"
    assert received[1] == stamped[1]


@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
    trailing=st.booleans(),
)
def test_lines_split_the_same_however_the_body_is_chunked(
    lines: list[bytes], cuts: list[int], trailing: bool
) -> None:
    body = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    limit = 25
    buffer = _LineBuffer(limit)
    out: list[tuple[bytes, int]] = []
    start = 0
    for cut in [*sorted(cuts), len(body)]:
        out.extend(buffer.feed(body[start:cut]))
        start = max(start, cut)
    rest = buffer.rest()
    if rest is not None:
        out.append(rest)
    expected = body.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert out == [(line[:limit], max(0, len(line) - limit)) for line in expected]


@pytest.fixture
async def scripted_body() -> Any:
    """Factory: a server (and a client of it) whose every GET answers ``body``, then closes."""
    made: list[tuple[web.AppRunner, KubeClient]] = []

    async def make(body: bytes) -> KubeClient:
        async def answer(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(body)
            return response

        app = web.Application()
        app.router.add_get("/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        client = await connect(BearerToken(server=f"http://127.0.0.1:{port}", token="t"))
        made.append((runner, client))
        return client

    yield make
    for runner, client in made:
        await client.close()
        await runner.cleanup()


async def test_a_complete_watch_line_that_is_not_json_is_a_watch_error(
    scripted_body: Callable[[bytes], Any],
) -> None:
    client = await scripted_body(b'{"type":"ADDED","object":{}}\n<html>proxy error</html>\n')
    events = client.watch(CONFIGMAPS, "ns", resource_version="1")
    assert await anext(events) == {"type": "ADDED", "object": {}}
    with pytest.raises(WatchError, match="not a watch event"):
        await anext(events)


async def test_a_watch_stream_ending_inside_an_event_is_a_connection_error(
    scripted_body: Callable[[bytes], Any],
) -> None:
    client = await scripted_body(b'{"type":"ADDED","object":{}}\n{"type":"MODIF')
    events = client.watch(CONFIGMAPS, "ns", resource_version="1")
    assert (await anext(events))["type"] == "ADDED"
    with pytest.raises(KubeConnectionError, match="inside an event"):
        await anext(events)


async def test_a_log_stream_ending_without_a_newline_delivers_its_last_line(
    scripted_body: Callable[[bytes], Any],
) -> None:
    client = await scripted_body(b"t1 first\r\n\nt2 last")
    assert [line async for line in client.follow_log("ns", "p", "c")] == [
        "t1 first\r",
        "",
        "t2 last",
    ]


# -- the log follower ----------------------------------------------------------------------------


def pod(name: str, *, state: str = "running", uid: str | None = None) -> KubeObject:
    states = {"running": {"running": {}}, "terminated": {"terminated": {"exitCode": 0}}}
    obj: KubeObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"containers": [{"name": "main"}]},
        "status": {
            "phase": "Running" if state == "running" else "Succeeded",
            "containerStatuses": [{"name": "main", "state": states[state]}],
        },
    }
    if uid:
        obj["metadata"]["uid"] = uid
    return obj


async def test_log_follower_resumes_a_dropped_stream_without_repeats(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    running = fake_api.store.apply(pod("job-worker-0"))
    second = dt.datetime.now(dt.UTC).replace(microsecond=100_000)
    fake_api.append_log("ns", "job-worker-0", "main", "one", "two", at=second)
    fake_api.append_log("ns", "job-worker-0", "main", "two-again", at=second)
    lines: list[ContainerLogLine] = []
    follower = LogFollower(fake_client, lines.append, reconnect_delay_s=0)
    follower.update(running)
    await until(lambda: len(lines) == 3)
    assert fake_api.drop_log_streams() == 1
    later = second.replace(microsecond=700_000)
    fake_api.append_log("ns", "job-worker-0", "main", "three", at=later)
    fake_api.append_log("ns", "job-worker-0", "main", "four")
    await until(lambda: len(lines) == 5)
    finished = fake_api.store.merge(
        PODS,
        "ns",
        "job-worker-0",
        {"status": pod("job-worker-0", state="terminated")["status"]},
    )
    follower.update(finished)
    fake_api.close_log("ns", "job-worker-0", "main")
    await asyncio.wait_for(follower.wait(), 5)
    await follower.close()
    assert [line.text for line in lines] == ["one", "two", "two-again", "three", "four"]
    assert follower.reconnects >= 1
    resumed = [r for r in fake_api.request_log if r.verb == "log"][1]
    assert resumed.query["sinceTime"] == second.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert resumed.query["timestamps"] == "true"


async def test_log_follower_stops_when_the_pod_is_deleted(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    running = fake_api.store.apply(pod("p"))
    fake_api.append_log("ns", "p", "main", "hello")
    lines: list[ContainerLogLine] = []
    follower = LogFollower(fake_client, lines.append, reconnect_delay_s=0)
    follower.update(running)
    await until(lambda: len(lines) == 1)
    fake_api.store.delete(PODS, "ns", "p")
    await asyncio.wait_for(follower.wait(), 5)
    assert [line.text for line in lines] == ["hello"]
    assert fake_api.open_log_streams == 0


async def test_log_requests_honour_tail_since_and_container_checks(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    fake_api.store.apply(pod("p"))
    early = dt.datetime(2026, 1, 1, 10, 0, 0, 500_000, tzinfo=dt.UTC)
    fake_api.append_log("ns", "p", "main", "a", "b", at=early)
    fake_api.append_log("ns", "p", "main", "c\nd", at=early + dt.timedelta(seconds=2))
    assert await fake_client.read_log("ns", "p", "main", tail_lines=3) == ["b", "c", "d"]
    stamps = [
        text async for text in _follow_closed(fake_api, fake_client, since="2026-01-01T10:00:02Z")
    ]
    assert [s.split(" ", 1)[1] for s in stamps] == ["c", "d"]
    assert stamps[0].startswith("2026-01-01T10:00:02.500000000Z ")
    with pytest.raises(InvalidObjectError, match="not valid for pod p"):
        await fake_client.read_log("ns", "p", "sidecar")


async def _follow_closed(fake_api: FakeKubeAPI, client: KubeClient, *, since: str) -> Any:
    fake_api.close_log("ns", "p", "main")
    async with asyncio.timeout(5):
        async for text in client.follow_log("ns", "p", "main", since_time=since):
            yield text


async def _client(fake_api: FakeKubeAPI) -> KubeClient:
    return await connect(fake_api.credentials)
