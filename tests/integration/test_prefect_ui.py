"""The real Prefect UI shows a finished training run: replica table, progress, summary, events.

A real Prefect server (``prefect server start``, not the test harness), the training flow on the
test bed, and the flow-run page in headless Chromium (Debian's package; ``scripts/test``
installs it), driven over the DevTools protocol: the run graph's event markers and artifact
badges are clicked and the panels they open are read (flows/ui_check.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flows.ui_check import (
    api,
    chromium,
    look_at_blocks_and_events,
    look_at_flow_run,
    prefect_server,
    run_training,
)

# Minutes: a real Prefect server, Chromium and a training run; in `make test`'s second phase.
pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_the_flow_run_page_shows_replicas_progress_summary_and_events(
    namespace: str, tmp_path: Path
) -> None:
    chromium()  # fails loudly, with the command to install it, when it is missing
    with prefect_server(tmp_path) as server:
        # Registered at start-up through the prefect.collections entry point: nothing saved yet.
        for slug in ("kubedl-kubernetes-cluster", "kubedl-training-job"):
            assert api(server, "GET", f"/block_types/slug/{slug}")["slug"] == slug
        flow_run_id = run_training(server, namespace, tmp_path, run_duration="6s")
        seen = asyncio.run(look_at_flow_run(server, flow_run_id, tmp_path / "images"))
        forms = asyncio.run(look_at_blocks_and_events(server, flow_run_id, tmp_path / "images"))

    assert "Completed" in seen.page
    events = "\n".join(seen.events)
    for name in ("created", "admitted", "running", "succeeded"):
        assert f"kubedl.training-job.{name}" in events, events[-3000:]
    assert "Kubedl training job succeeded" in events

    panels = "\n".join(seen.artifacts)
    replicas = next(text for text in seen.artifacts if "-replicas\nDescription" in text)
    for column in ("role", "index", "pod", "node", "phase", "restarts"):
        assert column in replicas
    for replica in ("master-0", "worker-0", "worker-1"):
        assert f"-a1-{replica}" in replicas
    assert "kwok-node-" in replicas
    assert "Progress: 100%" in panels
    assert "Training job" in panels
    assert "admission wait" in panels
    assert "kubectl logs -n" in panels
    for kind in ("TABLE", "PROGRESS", "MARKDOWN"):
        assert kind in seen.artifacts_tab

    assert "KubeDL Training Job" in forms["block-form"]
    assert "Spec" in forms["block-form"]
    assert "Bearer token" in forms["cluster-form"]
    assert "Kubeconfig content" in forms["cluster-form"]
    assert "Kubedl training job succeeded" in forms["event-feed"]
    for image in ("flow-run", "flow-run-replicas", "flow-run-summary", "event-feed"):
        assert (tmp_path / "images" / f"prefect-{image}.png").stat().st_size > 10_000
