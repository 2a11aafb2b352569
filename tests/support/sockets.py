"""Sockets a block of code left for the garbage collector, and where each was opened.

Tests that must leave no connection open say so with :func:`sockets_left_unclosed`; Prefect
3.9.1 leaks one of its own in every async flow run (:data:`PREFECTS_OWN`), which such a test
tells apart by where the socket was opened.
"""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
import warnings
from collections.abc import Iterator

PREFECTS_OWN = "_read_server_default_result_storage_block_id"
"""Prefect 3.9.1's results.py: the async flow engine calls its sync twin, which opens a sync
client and never closes it (one socket per async flow run; see test_prefect_flows.py)."""


@contextlib.contextmanager
def sockets_left_unclosed() -> Iterator[list[str]]:
    """Where each socket the block left unclosed was opened (a traceback, innermost last).

    Every ``unclosed <socket>`` warning of the block, and of a garbage collection at its end, is
    caught instead of reported, and the socket's allocation traceback (tracemalloc, 64 frames)
    is kept as text in the yielded list, filled when the block ends.
    """
    found: list[str] = []
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start(64)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            yield found
            gc.collect()
        for warning in caught:
            if not str(warning.message).startswith("unclosed <socket"):
                continue
            where = tracemalloc.get_object_traceback(warning.source)
            found.append("\n".join(where.format()) if where else f"untraced: {warning.message}")
    finally:
        if started:
            tracemalloc.stop()


def not_prefects(found: list[str]) -> list[str]:
    """The tracebacks of ``found`` that are not Prefect's own leak."""
    return [where for where in found if PREFECTS_OWN not in where]
