"""Prefect writes a task need not wait for: sent on background threads, never lost.

When a training job ends, its run writes its last artifacts (the summary, the progress bar at
100%, a replica table Prefect missed while it was down). They are final — nothing the task
returns depends on them — and each is a request to the Prefect API, which on a busy server takes
tens to hundreds of milliseconds. So the run hands them to the process's :class:`Outbox` and its
task returns at once; a few background threads send them, each hand-over's writes in order.

Nothing is lost: :func:`flush_artifacts` (:func:`aflush_artifacts` in async code) waits until
everything handed over has been sent, and runs by itself when the process exits, so a flow
run's process never ends with writes unsent. Code that reads a run's artifacts through the
Prefect API in the same process right after its flow returned calls it first, as it would
``APILogHandler.flush()`` for the run's logs. A write that fails is logged by whoever handed it
over (the run's logger), as it was when the task sent it itself.

At exit the outbox is flushed before Prefect drains its own background workers: each artifact
write makes Prefect's client emit an event (``prefect.artifact.created``/``updated``), which
Prefect's events worker must still be there to send (:func:`before_prefect_exits`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

logger = logging.getLogger(__name__)

WORKERS: Final = 4
"""Background threads that send (started as writes arrive, kept for the process's life)."""
EXIT_FLUSH_S: Final = 120.0
"""How long the process waits at exit for writes still unsent (a Prefect API that does not
answer would otherwise hold the exit for ever); what is left then is logged as lost."""


@dataclass(frozen=True)
class _Write:
    what: str
    send: Callable[[], object]


def before_prefect_exits(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the process exits, before Prefect's events worker is drained.

    Prefect's background workers drain when the interpreter starts to exit, before threads are
    joined and in the reverse order of their start (CPython's ``threading._register_atexit``,
    which ``concurrent.futures`` uses too; plain ``atexit`` handlers run only after them). So
    the events worker is started first when events are on, then ``hook`` is registered the same
    way: it runs before the worker's drain, and the events it causes are still sent.
    """
    from prefect.events.worker import EventsWorker, should_emit_events

    if should_emit_events():
        EventsWorker.instance()
    register: Callable[[Callable[[], None]], object] = getattr(
        threading, "_register_atexit", atexit.register
    )
    register(hook)


class Outbox:
    """Sends writes on up to ``workers`` background threads; :meth:`flush` waits for them.

    Args:
        workers: The most threads sending at once.
        on_exit: How to have the outbox flushed at exit (:func:`before_prefect_exits`; tests
            pass their own).

    Example:
        >>> box = Outbox(workers=2, on_exit=lambda hook: None)
        >>> sent = []
        >>> for n in range(3):
        ...     box.submit(f"write {n}", lambda n=n: sent.append(n))
        >>> box.flush(timeout_s=10), sorted(sent), box.sent
        (True, [0, 1, 2], 3)
    """

    def __init__(
        self,
        workers: int = WORKERS,
        on_exit: Callable[[Callable[[], None]], None] = before_prefect_exits,
    ):
        if workers < 1:
            raise ValueError(f"an outbox needs at least one worker, got {workers}")
        self.workers = workers
        self.sent = 0
        """Writes done (a write whose ``send`` raised counts too: it was tried)."""
        self._queue: deque[_Write] = deque()
        self._busy = 0
        self._idle = 0
        self._threads = 0
        self._cond = threading.Condition()
        self._on_exit = on_exit
        self._exit_hook = False

    @property
    def pending(self) -> int:
        """Writes handed over and not done yet (queued or being sent)."""
        with self._cond:
            return len(self._queue) + self._busy

    def submit(self, what: str, send: Callable[[], object]) -> None:
        """Hand ``send`` over: it runs on a background thread soon; this never blocks.

        Args:
            what: What it writes (named in the log if it is still unsent at exit).
            send: The write; it handles its own errors (anything it raises is logged here).
        """
        with self._cond:
            hook, self._exit_hook = not self._exit_hook, True
        if hook:
            self._on_exit(self._at_exit)
        with self._cond:
            self._queue.append(_Write(what, send))
            if len(self._queue) > self._idle and self._threads < self.workers:
                self._threads += 1
                thread = threading.Thread(
                    target=self._serve, name="kubedl-prefect-outbox", daemon=True
                )
                thread.start()
            self._cond.notify()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                write = self._queue.popleft()
                self._busy += 1
            try:
                write.send()
            except Exception:
                logger.exception("kubedl-prefect could not send %s", write.what)
            finally:
                with self._cond:
                    self._busy -= 1
                    self.sent += 1
                    self._cond.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every write handed over so far is done; whether all were, in time.

        Args:
            timeout_s: The most to wait (default: as long as it takes).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _at_exit(self) -> None:
        pending = self.pending
        if not pending:
            return
        logger.info("kubedl-prefect: sending %d Prefect write(s) before exiting", pending)
        if not self.flush(EXIT_FLUSH_S):
            with self._cond:
                lost = [write.what for write in self._queue]
                busy = self._busy
            logger.warning(
                "kubedl-prefect: the Prefect API did not take %d write(s) within %.0f s of the "
                "exit; lost: %s",
                len(lost) + busy,
                EXIT_FLUSH_S,
                ", ".join(lost) or "(being sent)",
            )


_OUTBOX = Outbox()


def outbox() -> Outbox:
    """The process's outbox (one for every run of the process)."""
    return _OUTBOX


def flush_artifacts(timeout_s: float | None = None) -> bool:
    """Wait until every artifact write of finished runs has reached Prefect.

    A training task returns as soon as its job's outcome is known; its last artifacts (the
    summary, the progress bar at 100%) are sent in the background right after, and at the
    latest when the process exits. Call this before reading them through the Prefect API in the
    same process.

    Args:
        timeout_s: The most to wait (default: as long as it takes).

    Returns:
        Whether everything was sent in time.

    Example:
        >>> flush_artifacts(timeout_s=5)
        True
    """
    return _OUTBOX.flush(timeout_s)


async def aflush_artifacts(timeout_s: float | None = None) -> bool:
    """Async :func:`flush_artifacts` (waits on a thread; the event loop goes on)."""
    return await asyncio.to_thread(_OUTBOX.flush, timeout_s)
