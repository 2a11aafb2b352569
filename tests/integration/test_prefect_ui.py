"""The real Prefect UI tells a training run's story: queue wait, replicas, logs, links.

A real Prefect server (``prefect server start``, not the test harness), the training flow on the
test bed, and the flow-run page in headless Chromium (Debian's package; ``scripts/test``
installs it), driven over the DevTools protocol: the run graph's event markers and artifact
badges are clicked and the panels they open are read (flows/ui_check.py). The job first waits
for GPUs that pods hold, then runs once they are deleted. A second test runs ``make demo``'s
train-and-serve chain and follows its links. Each asserts what the pages show, as text.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from flows.ui_check import (
    CHAIN_LINKS,
    QUEUED_GPUS,
    api,
    chromium,
    finished_flow_run,
    free_gpus,
    look_at_blocks_and_events,
    look_at_chain,
    look_at_flow_run,
    look_at_queued_run,
    look_at_replica_logs,
    occupy_gpus,
    prefect_server,
    replica_logs,
    running_flow_run,
    start_chain,
    start_training,
    stop_chain,
)
from kubedl_prefect.testbed.testbed import Testbed

# Minutes: a real Prefect server, Chromium and a training run; in `make test`'s second phase.
pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_the_flow_run_page_shows_the_queue_wait_replicas_logs_summary_and_events(
    namespace: str, tmp_path: Path
) -> None:
    chromium()  # fails loudly, with the command to install it, when it is missing
    testbed = Testbed(os.environ.get("KUBEDL_PREFECT_TESTBED", "default"))
    with prefect_server(tmp_path) as server:
        # Registered at start-up through the prefect.collections entry point: nothing saved yet.
        for slug in ("kubedl-kubernetes-cluster", "kubedl-training-job"):
            assert api(server, "GET", f"/block_types/slug/{slug}")["slug"] == slug
        # Pods hold most GPUs: the job waits for them, and is admitted once they are gone.
        hogs = occupy_gpus(testbed.kubeconfig, namespace)
        process = start_training(server, namespace, tmp_path, run_duration="6s", gpus=QUEUED_GPUS)
        try:
            queued = asyncio.run(
                look_at_queued_run(server, running_flow_run(server), tmp_path / "images")
            )
        finally:
            free_gpus(testbed.kubeconfig, namespace, hogs)
            flow_run_id = finished_flow_run(process)
        seen = asyncio.run(look_at_flow_run(server, flow_run_id, tmp_path / "images"))
        logs = asyncio.run(look_at_replica_logs(server, flow_run_id, tmp_path / "images"))
        worker_1 = replica_logs(server, flow_run_id, "worker-1")
        forms = asyncio.run(look_at_blocks_and_events(server, flow_run_id, tmp_path / "images"))

    # While it waited: the run is Running and its log says why the job is queued.
    assert "Running" in queued.page
    assert re.search(r"training job \S+ queued: .*Insufficient nvidia\.com/gpu", queued.reason), (
        queued.page[-3000:]
    )

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
    # The summary, after it ran: the admission wait (not 0s) and what it waited for.
    summary = next(text for text in seen.artifacts if "-summary\nDescription" in text)
    assert "Training job" in summary
    wait = re.search(r"admission wait\s+(\d+)s", summary)
    assert wait is not None, summary[-3000:]
    assert int(wait.group(1)) > 0, summary[-3000:]
    assert re.search(r"waited for\s+.*Insufficient nvidia\.com/gpu", summary), summary[-3000:]
    assert "kubectl logs -n" in panels
    for kind in ("TABLE", "PROGRESS", "MARKDOWN"):
        assert kind in seen.artifacts_tab

    # The Logs tab: each replica's lines under its own logger name.
    for replica in ("master-0", "worker-1"):
        rows = [row for row in logs.rows if f"rank {replica}: dataset ready" in row]
        assert rows, logs.text[-3000:]
        assert all(f"kubedl.replica.{replica}" in row for row in rows), rows
    worker_lines = {line["message"] for line in worker_1}
    assert "worker-1 | rank worker-1: dataset ready, 60000 images" in worker_lines, worker_lines
    assert all(line["name"] == "kubedl.replica.worker-1" for line in worker_1), worker_1

    assert "KubeDL Training Job" in forms["block-form"]
    assert "Spec" in forms["block-form"]
    assert "Bearer token" in forms["cluster-form"]
    assert "Kubeconfig content" in forms["cluster-form"]
    assert "Kubedl training job succeeded" in forms["event-feed"]
    for image in ("flow-run", "flow-run-queued", "flow-run-logs", "flow-run-summary"):
        assert (tmp_path / "images" / f"prefect-{image}.png").stat().st_size > 10_000


def test_the_chain_links_its_mlflow_run_model_version_and_endpoint(tmp_path: Path) -> None:
    chromium()
    with prefect_server(tmp_path) as server:
        chain = start_chain(server, tmp_path / "chain")
        try:
            page = asyncio.run(look_at_chain(server, chain, tmp_path / "images"))
        finally:
            stop_chain(chain.process)

    for key in CHAIN_LINKS:
        assert key in page.page  # a card on the flow run's Artifacts tab
        # The link artifact's page links to exactly its target.
        assert page.targets[key] == [chain.links[key]], page.targets
    assert "ddp-spirals on this machine (MLServer)" in page.artifact
    assert "serve-locally" in page.artifact  # the task run that wrote it
    # Followed, the endpoint is the served model: its V2 metadata.
    metadata = json.loads(page.endpoint)
    assert metadata["name"] == "ddp-spirals"
    assert metadata["inputs"], metadata
    for image in ("chain-flow-run", "chain-endpoint"):
        assert (tmp_path / "images" / f"prefect-{image}.png").stat().st_size > 10_000
