"""Servers shared by every test of a session, unit and integration alike (tests/support).

Each is started by the first test that asks for it and stopped at the end of the session:
``prefect_server`` (a real Prefect server) and ``mlflow_server`` (a real MLflow tracking
server). Defined here once, so that every module gets the same one instead of its own.
"""

from collections.abc import Iterator

import pytest

from tests.support.mlflow_server import mlflow_server
from tests.support.prefect_server import drain_prefect_workers, prefect_server

__all__ = ["mlflow_server", "prefect_server"]


@pytest.fixture(scope="module", autouse=True)
def prefect_workers_drained() -> Iterator[None]:
    """After each module: Prefect's background workers flushed and stopped (see tests/support)."""
    yield
    drain_prefect_workers()
