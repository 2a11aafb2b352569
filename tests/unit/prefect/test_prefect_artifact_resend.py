"""Artifacts whose update Prefect never got (its API was down longer than its client retries).

The replica table's terminal update is the last one a run makes: lost, the table would show the
job running forever. The writer remembers rows only once Prefect has them and sends the last
ones again at the end of the run; the progress bar likewise.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import httpx
import pytest

from kubedl_prefect.lifecycle.replicas import ReplicaState
from kubedl_prefect.prefect.artifacts import ArtifactWriter


class FlakyClient:
    """A Prefect client whose artifact requests fail while ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.data: dict[Any, Any] = {}

    def _check(self) -> None:
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused")

    def create_artifact(self, artifact: Any) -> Any:
        self._check()
        made = uuid4()
        self.data[made] = artifact.data
        return type("Created", (), {"id": made})()

    def update_artifact(self, artifact_id: Any, update: Any) -> None:
        self._check()
        self.data[artifact_id] = update.data


def states(phase: str) -> list[ReplicaState]:
    return [ReplicaState("worker-0", "worker", 0, "mnist-worker-0", "node-1", phase, 0)]


def phases(client: FlakyClient) -> list[str]:
    (table,) = [json.loads(d) for d in client.data.values() if isinstance(d, str)]
    return [row["phase"] for row in table]


def test_a_terminal_replica_table_lost_while_prefect_was_down_is_sent_at_the_end() -> None:
    client = FlakyClient()
    writer = ArtifactWriter("mnist-abc", None, None)
    writer._open = client
    writer.replicas(states("Running"), "mnist-abc-a1")
    client.down = True
    with pytest.raises(httpx.ConnectError):
        writer.replicas(states("Succeeded"), "mnist-abc-a1")
    client.down = False
    writer.replicas(states("Succeeded"), "mnist-abc-a1")  # the same rows again: not skipped
    assert phases(client) == ["Succeeded"]

    writer.replicas(states("Running"), "mnist-abc-a2")
    client.down = True
    with pytest.raises(httpx.ConnectError):
        writer.replicas(states("Succeeded"), "mnist-abc-a2")
    client.down = False
    writer.resend()  # the end of the run
    assert phases(client) == ["Succeeded"]
    requests = writer.requests
    writer.resend()  # nothing left to send
    assert writer.requests == requests


def test_an_update_after_the_run_ended_is_dropped_and_opens_no_client(
    prefect_server: dict[str, str],
) -> None:
    """A log line delivered after the end of the run (a callback thread's late item) once
    reopened the writer's client, which nobody closed: one socket left per run."""
    import gc

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from kubedl_prefect.prefect.artifacts import Progress
    from tests.support.sockets import sockets_left_unclosed

    key = f"late-{uuid4().hex[:8]}"
    with sockets_left_unclosed() as leaked:
        writer = ArtifactWriter(key, None, None)
        writer.progress(Progress(100.0, 100.0, 2.0, (("loss", 0.1),)), "mnist-abc-a1")
        writer.close()  # the end of the run
        requests = writer.requests
        writer.progress(Progress(30.0, 100.0, 1.0, (("loss", 0.9),)), "mnist-abc-a1")
        writer.replicas(states("Running"), "mnist-abc-a1")
        late = writer.requests - requests
        del writer
        gc.collect()
    assert leaked == []
    assert late == 0

    with get_client(sync_client=True) as client:
        (bar,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-progress"]))
        )
    assert bar.data == 100.0  # the finished bar was not moved back
