"""Following the logs of every container of a set of pods, without losing or repeating lines.

Each container of each pod gets its own follow stream, started as soon as the container has
started. Lines are requested with timestamps; when a stream breaks (network, API server restart)
it is resumed with ``sinceTime``, whose resolution is one second, so the follower remembers only
the timestamp of the last line it delivered and how many lines carried exactly that timestamp, and
skips what it has seen: memory stays constant however long the job runs. A pod re-created under the
same name (a new uid) starts from its first line; a container restarted in place continues in the
same stream's successor.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from kubedl_prefect.errors import ForbiddenError, KubeConnectionError, NotFoundError, ServerError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import KubeObject


@dataclass(frozen=True)
class ContainerLogLine:
    """One line of one container's log."""

    pod: KubeObject
    container: str
    timestamp: str
    text: str


LineCallback = Callable[[ContainerLogLine], None]


@dataclass
class _Position:
    """Where a container's stream is: the last timestamp delivered and the lines seen at it."""

    timestamp: str = ""
    count_at_timestamp: int = 0
    replayed: int = 0

    def accept(self, timestamp: str) -> bool:
        """Whether a line with ``timestamp`` is new; records it if so."""
        if timestamp < self.timestamp:
            return False
        if timestamp == self.timestamp:
            self.count_at_timestamp += 1
            return self.count_at_timestamp > self.replayed
        self.timestamp, self.count_at_timestamp, self.replayed = timestamp, 1, 0
        return True

    def rewind(self) -> None:
        """A new stream starts: lines at the last timestamp come again and must be skipped."""
        self.replayed = self.count_at_timestamp
        self.count_at_timestamp = 0

    def since_time(self) -> str | None:
        """``sinceTime`` for resuming: the last timestamp cut to whole seconds."""
        if not self.timestamp:
            return None
        return self.timestamp.split(".")[0].rstrip("Z") + "Z"


def _started(pod: KubeObject, container: str) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            return "running" in state or "terminated" in state
    return False


def _terminated(pod: KubeObject, container: str) -> bool:
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return True
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return "terminated" in (status.get("state") or {})
    return False


class LogFollower:
    """Follows every container of the pods it is told about, delivering lines to a callback.

    Feed it pods with :meth:`update` (from an informer's events); it starts a stream for each
    started container it has not followed yet and keeps the latest pod object for each, to know
    when a container has ended. Must run on the runtime loop.

    Args:
        client: The Kubernetes client.
        on_line: Called for every new line, in order within a container.
        reconnect_delay_s: Pause before resuming a broken stream.
        grace_s: How long a terminated container's stream may run on for its last lines.
        forbidden_retries: Refusals (403) in a row tolerated before a stream fails: an API
            server that has just restarted refuses requests until its RBAC caches are filled.
    """

    def __init__(
        self,
        client: KubeClient,
        on_line: LineCallback,
        *,
        reconnect_delay_s: float = 0.5,
        grace_s: float = 2.0,
        forbidden_retries: int = 5,
    ):
        self._forbidden_retries = forbidden_retries
        self._client = client
        self._grace = grace_s
        self._closing: set[tuple[str, str]] = set()
        self._on_line = on_line
        self._delay = reconnect_delay_s
        self._pods: dict[str, KubeObject] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.reconnects = 0

    def update(self, pod: KubeObject) -> None:
        """Tell the follower about a pod's latest state.

        Started containers of new pods begin to be followed; the stream of a container that has
        terminated is closed after the grace period, if it has not ended by itself (a kubelet
        ends it; some log servers keep following a finished file).
        """
        uid = str(pod["metadata"].get("uid") or pod["metadata"]["name"])
        self._pods[uid] = pod
        loop = asyncio.get_running_loop()
        for container in (pod.get("spec") or {}).get("containers") or []:
            name = container["name"]
            key = (uid, name)
            if key not in self._tasks and _started(pod, name):
                self._tasks[key] = loop.create_task(
                    self._follow(uid, name), name=f"logs {pod['metadata']['name']}/{name}"
                )
            task = self._tasks.get(key)
            if task is not None and key not in self._closing and _terminated(pod, name):
                self._closing.add(key)
                loop.call_later(self._grace, task.cancel)

    async def finish(self) -> None:
        """Give open streams the grace period to end by themselves, then close them."""
        pending = [t for t in self._tasks.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self._grace)
        await self.close()

    @property
    def following(self) -> bool:
        """Whether any stream is still open."""
        return any(not task.done() for task in self._tasks.values())

    async def wait(self) -> None:
        """Wait until every stream started so far has ended (its container terminated).

        Cancelling this wait leaves the streams running. A stream that failed raises here.
        """
        while True:
            pending = [t for t in self._tasks.values() if not t.done()]
            if not pending:
                for task in self._tasks.values():
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                return
            await asyncio.wait(pending)

    async def close(self) -> None:
        """Stop every stream."""
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self, uid: str, container: str) -> None:
        position = _Position()
        refused = 0
        while True:
            metadata = self._pods[uid]["metadata"]
            ended_cleanly = False
            try:
                async for raw in self._client.follow_log(
                    metadata["namespace"],
                    metadata["name"],
                    container,
                    since_time=position.since_time(),
                ):
                    timestamp, _, text = raw.partition(" ")
                    if position.accept(timestamp):
                        self._on_line(ContainerLogLine(self._pods[uid], container, timestamp, text))
                ended_cleanly = True
                refused = 0
            except NotFoundError:
                return  # the pod is gone; a re-created pod has a new uid and its own stream
            except ForbiddenError:
                # An API server that has just restarted refuses requests until its RBAC caches
                # are filled: a few refusals in a row are tolerated, as the shared watches do.
                refused += 1
                if refused > self._forbidden_retries:
                    raise
                await asyncio.sleep(min(self._delay * 2 ** (refused - 1), 5.0))
            except (KubeConnectionError, ServerError):
                refused = 0
            # A follow ends cleanly when the container exits; until the pod's status says so
            # (it may lag), resume: lines already delivered are skipped.
            if ended_cleanly and _terminated(self._pods[uid], container):
                return
            self.reconnects += 1
            position.rewind()
            await asyncio.sleep(self._delay)
