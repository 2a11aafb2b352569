"""Shared watches: one list-then-watch per (cluster, kind, namespace) per process.

Many jobs are waited on at once; polling each costs requests that grow with the job's duration
and adds up to the poll interval of latency. Instead an :class:`Informer` lists a kind once, then
watches it from the list's ``resourceVersion`` with bookmarks, keeps the objects in memory and
fans every change out to the subscribers interested in it. Its loop:

* a watch that ends (server timeout) is resumed from the last resourceVersion seen, bookmarks
  included, so nothing is missed or repeated;
* ``410 Gone`` (the resourceVersion was compacted away) lists again and emits what changed
  meanwhile, as synthetic events, deletions included;
* connection errors and 5xx reconnect with capped exponential backoff and jitter;
* a stream silent for longer than the inactivity timeout is dropped and resumed: the API server
  sends a bookmark about once a minute, so a healthy stream is never silent for 90 seconds;
* errors that trying again cannot fix (403, a CRD that is not installed) end the informer and are
  raised to every subscriber.

There is no polling fallback: subscribers see the current state at once, then every change.

All of this runs on the :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

from kubedl_prefect.errors import (
    ForbiddenError,
    KubeAPIError,
    KubeConnectionError,
    KubeDLPrefectError,
    ServerError,
    WatchError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import KubeObject, ResourceKind

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ObjectFilter = Callable[[KubeObject], bool]


@dataclass(frozen=True)
class WatchEvent:
    """A change of one object, as seen by an informer."""

    type: EventType
    object: KubeObject

    @property
    def name(self) -> str:
        """The object's name."""
        return str(self.object["metadata"]["name"])


@dataclass(frozen=True)
class WatchSettings:
    """Timing of a shared watch.

    Args:
        inactivity_timeout_s: Drop and resume a stream silent for this long. The API server sends
            a bookmark about every 60 s, so 90 s means the stream is dead, not idle.
        server_timeout_s: Ask the server to end each watch after about this long (randomised by
            up to a quarter), so that streams are renewed before proxies cut them.
        backoff_initial_s: First delay before reconnecting after an error.
        backoff_max_s: Longest delay between reconnection attempts.
        linger_s: Keep an informer without subscribers running this long, for the next waiter.
        forbidden_retries: Refusals (403) in a row tolerated before the watch fails: an API
            server that has just restarted refuses requests until its RBAC caches are filled.
    """

    inactivity_timeout_s: float = 90.0
    server_timeout_s: int = 300
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 30.0
    linger_s: float = 30.0
    forbidden_retries: int = 4


@dataclass
class WatchStats:
    """Counters of an informer, for tests and benchmarks."""

    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0
    reconnects: int = 0


@dataclass(eq=False)
class Subscription:
    """The events an informer delivers to one subscriber, filtered.

    Iterate it (``async for event in subscription``) or call :meth:`next`. It first yields the
    matching objects the informer already holds (as ``ADDED``), then each change. Several
    subscriptions may share one queue, so that one consumer sees changes of several kinds in the
    order they arrived.
    """

    accepts: ObjectFilter
    queue: asyncio.Queue[WatchEvent | BaseException] = field(default_factory=asyncio.Queue)

    def _deliver(self, item: WatchEvent | BaseException) -> None:
        self.queue.put_nowait(item)

    async def next(self) -> WatchEvent:
        """The next event; raises the informer's error if it ended."""
        return await next_event(self.queue)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[WatchEvent]:
        while True:
            yield await self.next()


EventQueue = asyncio.Queue[WatchEvent | BaseException]


async def next_event(queue: EventQueue) -> WatchEvent:
    """The next event of a (shared) subscription queue; raises an informer's error."""
    item = await queue.get()
    if isinstance(item, BaseException):
        queue.put_nowait(item)  # later calls raise it again
        raise item
    return item


class Informer:
    """List-then-watch of one kind in one namespace, kept in memory and fanned out."""

    def __init__(
        self,
        client: KubeClient,
        kind: ResourceKind,
        namespace: str | None,
        settings: WatchSettings | None = None,
    ):
        self.client = client
        self.kind = kind
        self.namespace = namespace
        self.settings = settings or WatchSettings()
        self.stats = WatchStats()
        self.store: dict[str, KubeObject] = {}
        self._label_index: dict[str, dict[str, dict[str, KubeObject]]] = {}
        self._subscribers: set[Subscription] = set()
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._position: str | None = None
        """The resourceVersion of the last event or bookmark received (where to resume)."""

    @property
    def subscriber_count(self) -> int:
        """How many subscriptions are open."""
        return len(self._subscribers)

    def start(self) -> None:
        """Start the list-and-watch loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"informer {self.kind} {self.namespace}"
            )

    async def stop(self) -> None:
        """Stop the loop and wait for it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_synced(self) -> None:
        """Wait until the first list has been loaded (or the informer failed)."""
        await self._synced.wait()
        if self._failure is not None:
            raise self._failure

    def select(self, accepts: ObjectFilter) -> list[KubeObject]:
        """The objects held now that ``accepts`` selects."""
        return [obj for obj in self.store.values() if accepts(obj)]

    def subscribe(self, accepts: ObjectFilter, queue: EventQueue | None = None) -> Subscription:
        """Open a subscription; it starts with the matching objects held now."""
        subscription = Subscription(accepts, queue if queue is not None else asyncio.Queue())
        if self._failure is not None:
            subscription._deliver(self._failure)
            return subscription
        for obj in self.store.values():
            if accepts(obj):
                subscription._deliver(WatchEvent("ADDED", obj))
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Close a subscription."""
        self._subscribers.discard(subscription)

    def _emit(self, event: WatchEvent) -> None:
        self.stats.events += 1
        for subscription in tuple(self._subscribers):
            if subscription.accepts(event.object):
                subscription._deliver(event)

    def get(self, name: str) -> KubeObject | None:
        """The object of that name held now, if any."""
        return self.store.get(name)

    def by_label(self, key: str, value: str) -> list[KubeObject]:
        """The objects held now whose label ``key`` is ``value`` (indexed: no scan)."""
        index = self._label_index.get(key)
        if index is None:
            index = self._label_index[key] = {}
            for obj in self.store.values():
                self._index_one(key, index, obj)
        return list(index.get(value, {}).values())

    @staticmethod
    def _index_one(key: str, index: dict[str, dict[str, KubeObject]], obj: KubeObject) -> None:
        value = (obj["metadata"].get("labels") or {}).get(key)
        if value is not None:
            index.setdefault(value, {})[obj["metadata"]["name"]] = obj

    def _apply(self, event_type: EventType, obj: KubeObject) -> None:
        # managedFields is most of an object's size and nothing here reads it: dropping it keeps
        # thousands of held objects cheap for the garbage collector.
        obj["metadata"].pop("managedFields", None)
        name = obj["metadata"]["name"]
        old = self.store.pop(name, None)
        for key, index in self._label_index.items():
            if old is not None:
                value = (old["metadata"].get("labels") or {}).get(key)
                if value is not None:
                    index.get(value, {}).pop(name, None)
            if event_type != "DELETED":
                self._index_one(key, index, obj)
        if event_type != "DELETED":
            self.store[name] = obj
        self._emit(WatchEvent(event_type, obj))

    async def _relist(self) -> str:
        """List again, emit the differences to what we held, return the new resourceVersion."""
        self.stats.lists += 1
        listing = await self.client.list(self.kind, self.namespace)
        fresh = {obj["metadata"]["name"]: obj for obj in listing.items}
        for name, held in list(self.store.items()):
            if name not in fresh:
                self._apply("DELETED", held)
        for name, obj in fresh.items():
            old = self.store.get(name)
            if old is None:
                self._apply("ADDED", obj)
            elif old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self._apply("MODIFIED", obj)
        self._synced.set()
        return listing.resource_version

    async def _run(self) -> None:
        backoff = self.settings.backoff_initial_s
        resource_version: str | None = None
        refused = 0
        try:
            while True:
                try:
                    if resource_version is None:
                        resource_version = await self._relist()
                    self._position = resource_version
                    resource_version = await self._watch_once(resource_version)
                    backoff, refused = self.settings.backoff_initial_s, 0
                except _Expired:
                    self.stats.expired += 1
                    resource_version = None
                except (KubeConnectionError, ServerError, ForbiddenError) as exc:
                    # An API server that has just restarted may refuse requests until its RBAC
                    # caches are filled: a few refusals in a row are tolerated, not more.
                    if isinstance(exc, ForbiddenError):
                        refused += 1
                        if refused > self.settings.forbidden_retries:
                            raise
                    # Resume from the last event or bookmark received, not from where the
                    # broken stream started: those events were delivered already.
                    resource_version = self._position or resource_version
                    self.stats.reconnects += 1
                    await asyncio.sleep(backoff * (0.5 + random.random()))
                    backoff = min(backoff * 2, self.settings.backoff_max_s)
        except asyncio.CancelledError:
            raise
        except KubeDLPrefectError as exc:
            self._fail(exc)
        except Exception as exc:  # an unexpected payload must still reach the waiters
            self._fail(WatchError(f"watch of {self.kind} failed: {exc!r}"))

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, KubeAPIError):
            exc = WatchError(
                f"cannot watch {self.kind} in namespace {self.namespace}: {exc.message}",
                hint=exc.hint,
                retryable=exc.retryable,
            )
        self._failure = exc
        self._synced.set()
        for subscription in tuple(self._subscribers):
            subscription._deliver(exc)

    async def _watch_once(self, resource_version: str) -> str:
        """Follow one watch stream until the server ends it; return where to resume."""
        self.stats.watches += 1
        server_timeout = int(self.settings.server_timeout_s * (0.75 + random.random() / 4))
        stream = self.client.watch(
            self.kind,
            self.namespace,
            resource_version=resource_version,
            timeout_seconds=server_timeout,
            inactivity_timeout_s=self.settings.inactivity_timeout_s,
        )
        async for raw in stream:
            event_type = raw.get("type")
            obj = raw.get("object") or {}
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise _Expired()
                raise ServerError(
                    f"watch of {self.kind} returned an error: {obj.get('message')}",
                    status=int(obj.get("code") or 0),
                    reason=obj.get("reason"),
                )
            resource_version = obj.get("metadata", {}).get("resourceVersion") or resource_version
            self._position = resource_version
            if event_type == "BOOKMARK":
                self.stats.bookmarks += 1
                continue
            if event_type in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(event_type, obj)
        return resource_version


class _Expired(Exception):
    """The resourceVersion we watch from is too old (410 Gone): list again."""


class WatchHub:
    """Informers shared by everything in the process, created on demand and reference-counted.

    Must be used on the :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop.
    """

    def __init__(self, settings: WatchSettings | None = None):
        self.settings = settings or WatchSettings()
        self._informers: dict[tuple[str, ResourceKind, str | None], Informer] = {}
        self._reapers: dict[tuple[str, ResourceKind, str | None], asyncio.TimerHandle] = {}

    def informer(self, client: KubeClient, kind: ResourceKind, namespace: str | None) -> Informer:
        """The running informer for this cluster, kind and namespace (started if needed)."""
        key = (client.cluster_id, kind, namespace)
        reaper = self._reapers.pop(key, None)
        if reaper is not None:
            reaper.cancel()
        informer = self._informers.get(key)
        if informer is None or informer._failure is not None:
            informer = Informer(client, kind, namespace, self.settings)
            self._informers[key] = informer
            informer.start()
        return informer

    @contextlib.asynccontextmanager
    async def subscribe(
        self,
        client: KubeClient,
        kind: ResourceKind,
        namespace: str | None,
        accepts: ObjectFilter,
        queue: EventQueue | None = None,
    ) -> AsyncIterator[Subscription]:
        """Subscribe to changes of the objects ``accepts`` selects, after the first list."""
        informer = self.informer(client, kind, namespace)
        await informer.wait_synced()
        subscription = informer.subscribe(accepts, queue)
        try:
            yield subscription
        finally:
            informer.unsubscribe(subscription)
            if informer.subscriber_count == 0:
                self._schedule_reap((client.cluster_id, kind, namespace), informer)

    def _schedule_reap(self, key: tuple[str, ResourceKind, str | None], informer: Informer) -> None:
        def reap() -> None:
            self._reapers.pop(key, None)
            if informer.subscriber_count == 0 and self._informers.get(key) is informer:
                del self._informers[key]
                asyncio.get_running_loop().create_task(informer.stop())

        loop = asyncio.get_running_loop()
        self._reapers[key] = loop.call_later(self.settings.linger_s, reap)

    def informers(self) -> list[Informer]:
        """The informers running now."""
        return list(self._informers.values())

    async def close(self) -> None:
        """Stop every informer."""
        for reaper in self._reapers.values():
            reaper.cancel()
        self._reapers.clear()
        informers, self._informers = list(self._informers.values()), {}
        for informer in informers:
            await informer.stop()
