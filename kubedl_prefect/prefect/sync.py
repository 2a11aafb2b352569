"""The one helper behind every sync face of the Prefect surface.

The surface is written once, as coroutines. Its sync faces (sync tasks, ``TrainingJob.start``, the
sync run handle, flow hooks) run those coroutines with :func:`run_in_caller_context`: on a
short-lived thread with an event loop of its own, inside a copy of the caller's context variables,
so the coroutine sees the caller's Prefect flow run, task run and settings, works the same whether
the caller is a sync flow, a sync task called from an async flow (whose thread already runs a loop),
or a hook, and never runs on the Kubernetes runtime's loop (which it only hands Kubernetes calls
to).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_in_caller_context(
    make: Callable[[], Coroutine[Any, Any, T]], *, context: contextvars.Context | None = None
) -> T:
    """Run the coroutine ``make()`` to the end and return its result (or raise its error).

    Args:
        make: Builds the coroutine (called on the helper thread).
        context: The context variables to run it in (default: a copy of the caller's).

    Example:
        >>> async def answer() -> int:
        ...     return 42
        >>> run_in_caller_context(answer)
        42
    """
    ctx = context.copy() if context is not None else contextvars.copy_context()
    box: dict[str, Any] = {}

    def serve() -> None:
        try:
            box["result"] = ctx.run(asyncio.run, _call(make))
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=serve, name="kubedl-prefect-sync", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        error = box["error"]
        raise error
    result: T = box["result"]
    return result


async def _call(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return await make()
