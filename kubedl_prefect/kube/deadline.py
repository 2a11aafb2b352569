"""A deadline for waits on watch events, on the monotonic clock.

Every wait of the process (a training job's phases, an InferenceService's readiness) wakes on the
next event of its informers' queue, or gives up with the error its caller chose once the deadline
passes.
"""

from __future__ import annotations

import asyncio
import time

from kubedl_prefect.kube.watch import EventQueue, next_event


class Deadline:
    """A deadline on the monotonic clock; ``None`` waits for ever."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    async def wait(self, queue: EventQueue, error: Exception) -> None:
        """Wait for the next event; raise ``error`` if the deadline passes first."""
        if self.at is None:
            await next_event(queue)
            return
        left = self.at - time.monotonic()
        if left <= 0:
            raise error
        try:
            async with asyncio.timeout(left):
                await next_event(queue)
        except TimeoutError:
            raise error from None
