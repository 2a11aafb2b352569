"""Waiting in tests for something a server does in its own time.

>>> import asyncio
>>> answers = iter([None, 0, "ready"])
>>> async def check() -> object:
...     return next(answers)
>>> asyncio.run(until("the answer", check, within_s=5, every_s=0.01))
'ready'
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any


async def until(
    what: str, check: Callable[[], Awaitable[Any]], within_s: float = 30.0, every_s: float = 0.5
) -> Any:
    """The first truthy value of ``await check()``, tried every ``every_s`` seconds.

    Raises:
        AssertionError: Naming ``what`` and the last value, when ``within_s`` passed first.
    """
    last: Any = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            while True:
                last = await check()
                if last:
                    return last
                await asyncio.sleep(every_s)
    raise AssertionError(f"{what} did not happen within {within_s:g}s (last: {last!r})")
