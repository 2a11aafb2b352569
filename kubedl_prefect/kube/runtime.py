"""One background event loop per process for all Kubernetes I/O.

Prefect runs sync tasks in worker threads and async tasks in whichever loop the flow has, yet a
shared watch must be *one* connection per process, and aiohttp sessions belong to the loop that
made them. So clients, watches and log streams all live on one daemon thread's loop, and callers
hand coroutines to it: async callers with :meth:`KubeRuntime.run` (awaitable from any loop,
cancellation included), sync callers with :meth:`KubeRuntime.block_on`. This is the one mechanism
behind both the async API and its sync facade.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")


class KubeRuntime:
    """The process-wide loop that owns Kubernetes clients and shared watches."""

    _instance: ClassVar[KubeRuntime | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    EXIT_FLUSH_S: ClassVar[float] = 10.0
    """How long interpreter exit waits for tracked background writes (:meth:`track`)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="kubedl-prefect-kube", daemon=True)
        self._tracked: set[asyncio.Task[Any]] = set()
        self._thread.start()
        atexit.register(self._flush_at_exit)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @classmethod
    def get(cls) -> KubeRuntime:
        """The runtime of this process, started on first use."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The runtime's event loop."""
        return self._loop

    def in_runtime(self) -> bool:
        """Whether the calling code runs on the runtime's own thread."""
        return threading.current_thread() is self._thread

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep a background task of the runtime loop alive until it is done, even at exit.

        The loop runs on a daemon thread, which dies with the interpreter: a write still in
        flight then (a run record) is waited for, up to :attr:`EXIT_FLUSH_S`.
        """
        self._tracked.add(task)
        task.add_done_callback(self._tracked.discard)

    def _flush_at_exit(self) -> None:
        async def flush() -> None:
            tasks = list(self._tracked)
            if tasks:
                await asyncio.wait(tasks, timeout=self.EXIT_FLUSH_S)

        if self._tracked and self._thread.is_alive() and not self.in_runtime():
            future = self.submit(flush())
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                future.result(timeout=self.EXIT_FLUSH_S + 1)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the runtime loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the runtime loop, from any event loop.

        Cancelling the caller cancels ``coro`` too.
        """
        if self.in_runtime():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def block_on(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the runtime loop and block the calling thread until it is done."""
        if self.in_runtime():
            coro.close()
            raise RuntimeError("block_on() called from the kube runtime's own thread")
        future = self.submit(coro)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise
