"""Tests that share one test bed from several pytest workers: most share it, a few need it alone.

``make test`` runs pytest with workers (pytest-xdist) against one test bed. Most integration
tests work in a namespace of their own and can run side by side; a test marked
``@pytest.mark.exclusive`` restarts or stops a component, or counts what the whole cluster holds,
and must run while no other test of any worker runs. :func:`hold_test_bed` is a readers-writer
lock across processes (``flock`` on two files beside the test bed): shared for ordinary tests,
exclusive for marked ones, with writers first (a waiting exclusive test holds the turnstile, so
new shared turns queue behind it instead of starving it).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> with hold_test_bed(folder, exclusive=False):
    ...     with hold_test_bed(folder, exclusive=False):  # shared turns overlap
    ...         print("two shared turns at once")
    two shared turns at once
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def hold_test_bed(folder: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the test bed shared (``exclusive=False``) or alone until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    with (
        (folder / "tests.turnstile").open("a") as turnstile,
        (folder / "tests.lock").open("a") as lock,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            # A writer keeps the turnstile until it holds the lock; a reader only passes through.
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
