"""One real Prefect server for the whole test session (``prefect_test_harness``).

Starting a Prefect server takes 30-90 s on a 2-core machine; eight test modules each used to
start their own. Tests share this one and stay apart by what they read: events, logs and
artifacts are filtered by the flow run they belong to, blocks and deployments carry names of
their own. ``PREFECT_HOME`` is a temporary folder, so nothing of the developer's own Prefect
profile is read or written.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_HOME,
    PREFECT_LOCAL_STORAGE_PATH,
    PREFECT_SERVER_ANALYTICS_ENABLED,
    temporary_settings,
)
from prefect.testing.utilities import prefect_test_harness

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The session's Prefect server; yields the environment a subprocess needs to use it.

    The environment also puts the repository on ``PYTHONPATH`` (for ``flows.*``) and makes
    runners poll every second, so that a served deployment picks its runs up at once.
    """
    home = tmp_path_factory.mktemp("prefect-home")
    with (
        temporary_settings(
            updates={
                PREFECT_HOME: str(home),
                PREFECT_LOCAL_STORAGE_PATH: str(home / "storage"),
                PREFECT_SERVER_ANALYTICS_ENABLED: False,
            }
        ),
        prefect_test_harness(server_startup_timeout=120),
    ):
        yield {
            **os.environ,
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_RUNNER_POLL_FREQUENCY": "1",
            "PYTHONPATH": str(ROOT),
        }


def drain_prefect_workers() -> None:
    """Flush and stop Prefect's background log and event workers, as the harness does at its end.

    Between modules, so that their threads (which keep a websocket open and retry with random
    jitter) do not run under the next module's tests: Hypothesis fails a test whose strategies
    see the global ``random`` state change under them. The artifacts our runs write in the
    background (kubedl_prefect.prefect.outbox) are sent first, while the server still runs.
    """
    if "kubedl_prefect.prefect.outbox" in sys.modules:
        from kubedl_prefect.prefect.outbox import flush_artifacts

        flush_artifacts(timeout_s=120)
    if "prefect.events.worker" not in sys.modules:
        return  # nothing of Prefect's ran in this process yet
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        for worker in (APILogWorker, EventsWorker):
            result = worker.drain_all()
            if inspect.isawaitable(result):
                await result

    run_coro_as_sync(drain())
