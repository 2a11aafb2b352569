"""Delivering phase updates and log lines to the caller's callbacks, off the runtime loop.

Every watch of the process runs on the one runtime loop
(:class:`~kubedl_prefect.kube.runtime.KubeRuntime`). A callback run there — a Prefect task
emitting an event, writing an artifact, a user's ``print`` to a slow terminal — would stall every
other job's watch for as long as it takes. So each wait hands its callback's calls to a
:class:`CallbackThread` of its own: calls run in order, one at a time, on that thread; the runtime
only enqueues. A callback that blocks for seconds delays its own wait's later deliveries and
nobody else's. The wait returns once every call it queued has run, so a caller sees all updates
before the result.

A callback that raises is logged and skipped; it never breaks the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class CallbackThread(Generic[T]):
    """Runs ``callback(item)`` for each enqueued item, in order, on a thread of its own.

    Args:
        callback: What to call with each item.
        name: The thread's name (shows up in stack dumps).
    """

    def __init__(self, callback: Callable[[T], object], name: str = "kubedl-prefect-callbacks"):
        self.callback = callback
        self.name = name
        self.delivered = 0
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __call__(self, item: T) -> None:
        """Enqueue one call (never blocks, whatever the callback does)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()
        self._queue.put(item)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, _Stop):
                item.done()
                return
            try:
                self.callback(item)  # type: ignore[arg-type]
            except Exception:
                logger.exception("a kubedl-prefect callback (%s) raised; it was skipped", self.name)
            self.delivered += 1

    async def drain(self) -> None:
        """Wait (without blocking the loop) until every enqueued call has run; stop the thread.

        The thread itself says when it is done, so no executor thread is tied up waiting: a
        hundred waits ending at once drain at once.
        """
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        stop = _Stop(asyncio.get_running_loop())
        self._queue.put(stop)
        await stop.future


class _Stop:
    """The last item of a callback queue: resolves a future on the drainer's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def done(self) -> None:
        """Tell the drainer; nobody to tell when its loop has closed (it gave up waiting).

        Every item before this one was delivered either way: a drain that was cancelled, or
        whose loop ended (``asyncio.run`` returned, the process shuts its runtime down) while
        the callback still ran, only loses the news that it is done.
        """

        def resolve() -> None:
            if not self.future.done():
                self.future.set_result(None)

        with contextlib.suppress(RuntimeError):  # "Event loop is closed"
            self.loop.call_soon_threadsafe(resolve)


@contextlib.asynccontextmanager
async def delivered(
    callback: Callable[[T], object] | None, name: str
) -> AsyncIterator[Callable[[T], None] | None]:
    """Wrap ``callback`` in a :class:`CallbackThread` for the duration of one wait.

    Yields ``None`` for ``None``. On exit, waits until every queued call has run (also when the
    wait raised or was cancelled).
    """
    if callback is None:
        yield None
        return
    thread: CallbackThread[T] = CallbackThread(callback, name)
    try:
        yield thread
    finally:
        await asyncio.shield(thread.drain())
