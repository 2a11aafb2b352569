"""The log follower's resume logic, on streams that break where the real server would not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubedl_prefect.errors import ForbiddenError, KubeConnectionError
from kubedl_prefect.kube.logs import ContainerLogLine, LogFollower


def pod(uid: str, *, terminated: bool = False) -> dict[str, Any]:
    state = {"terminated": {"exitCode": 0}} if terminated else {"running": {}}
    return {
        "metadata": {"name": "job-worker-0", "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "pytorch"}]},
        "status": {
            "phase": "Succeeded" if terminated else "Running",
            "containerStatuses": [{"name": "pytorch", "state": state}],
        },
    }


class ScriptedLogs:
    """Plays one scripted stream per follow_log call and records each call's sinceTime."""

    def __init__(self, streams: list[list[str | BaseException]]):
        self.streams = streams
        self.since: list[str | None] = []

    async def follow_log(
        self, namespace: str, pod: str, container: str, *, since_time: str | None = None, **_: Any
    ) -> AsyncIterator[str]:
        self.since.append(since_time)
        for item in self.streams.pop(0) if self.streams else []:
            if isinstance(item, BaseException):
                raise item
            yield item


async def test_broken_stream_resumes_without_losing_or_repeating_lines() -> None:
    a = "2026-11-30T10:00:01.100000000Z"
    b = "2026-11-30T10:00:01.200000000Z"
    c = "2026-11-30T10:00:02.000000000Z"
    client = ScriptedLogs(
        [
            [f"{a} one", f"{b} two", f"{b} two-again", KubeConnectionError("reset")],
            # The server resumes from the whole second: lines at and after 10:00:01 come again.
            [f"{a} one", f"{b} two", f"{b} two-again", f"{b} three", f"{c} four"],
        ]
    )
    lines: list[ContainerLogLine] = []
    follower = LogFollower(client, lines.append, reconnect_delay_s=0)  # type: ignore[arg-type]
    follower.update(pod("u1"))
    await asyncio.sleep(0.05)
    follower.update(pod("u1", terminated=True))
    await asyncio.wait_for(follower.wait(), 5)
    assert [line.text for line in lines] == ["one", "two", "two-again", "three", "four"]
    assert client.since[:2] == [None, "2026-11-30T10:00:01Z"]
    assert follower.reconnects >= 1


async def test_recreated_pod_is_followed_from_its_first_line() -> None:
    t = "2026-11-30T10:00:01.000000000Z"
    client = ScriptedLogs([[f"{t} old pod"], [f"{t} new pod"]])
    lines: list[ContainerLogLine] = []
    follower = LogFollower(client, lines.append, reconnect_delay_s=0)  # type: ignore[arg-type]
    follower.update(pod("u1", terminated=True))
    await asyncio.wait_for(follower.wait(), 5)
    follower.update(pod("u2", terminated=True))
    await asyncio.wait_for(follower.wait(), 5)
    assert [(line.pod["metadata"]["uid"], line.text) for line in lines] == [
        ("u1", "old pod"),
        ("u2", "new pod"),
    ]
    assert client.since == [None, None]


def forbidden() -> ForbiddenError:
    return ForbiddenError(
        'pods "job-worker-0" is forbidden: cannot get resource "pods/log"', status=403
    )


async def test_a_restarted_servers_rbac_warm_up_does_not_stop_the_logs() -> None:
    # Seen in the fault campaign: right after an API-server restart, log follows were refused
    # (403) until the server's RBAC caches were filled, and the replica's logs stopped for good.
    a = "2026-11-30T10:00:01.100000000Z"
    b = "2026-11-30T10:00:03.000000000Z"
    client = ScriptedLogs(
        [
            [f"{a} before", KubeConnectionError("reset")],
            [forbidden()],
            [forbidden()],
            [f"{b} after"],
        ]
    )
    lines: list[ContainerLogLine] = []
    follower = LogFollower(client, lines.append, reconnect_delay_s=0)  # type: ignore[arg-type]
    follower.update(pod("u1"))
    await asyncio.sleep(0.05)
    follower.update(pod("u1", terminated=True))
    await asyncio.wait_for(follower.wait(), 5)
    assert [line.text for line in lines] == ["before", "after"]


async def test_a_lasting_refusal_still_fails_the_logs() -> None:
    client = ScriptedLogs([[forbidden()] for _ in range(20)])
    follower = LogFollower(client, [].append, reconnect_delay_s=0)  # type: ignore[arg-type]
    follower.update(pod("u1"))
    with pytest.raises(ForbiddenError):
        await asyncio.wait_for(follower.wait(), 5)
