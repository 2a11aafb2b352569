"""Probes of pods on the process node: readiness drives Ready, a failing liveness probe restarts.

Real pods of the test bed's process node (issue 20 item 1): an HTTP readiness probe against a
Python server that answers 200 only for a while, and an ``exec`` liveness probe run inside a
container's own namespaces that starts failing when the container removes a file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import EVENTS, PODS
from tests.integration.process_node.test_process_pods import pod, status_of, wait_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Obj = dict[str, Any]

#: Answers 200 from 3 s to 9 s after it started, 503 before and after.
SERVER = """
import http.server, time
start = time.monotonic()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if 3 < time.monotonic() - start < 9 else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("", 8080), Handler).serve_forever()
"""


def ready_is(expected: bool) -> Callable[[Obj], bool]:
    def check(p: Obj) -> bool:
        status = p.get("status") or {}
        if status.get("phase") != "Running":
            return False
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        return conditions.get("Ready") == ("True" if expected else "False")

    return check


async def test_the_readiness_probe_makes_the_pod_ready_and_unready(
    kube: KubeClient, namespace: str
) -> None:
    container = {
        "name": "server",
        "image": "python:3.11",
        "command": ["python", "-c", SERVER],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
    }
    await kube.create(PODS, namespace, pod("served", [container], restart_policy="Always"))

    running = await wait_pod(kube, namespace, "served", ready_is(False))
    assert status_of(running, "server")["state"].get("running")
    assert status_of(running, "server")["ready"] is False
    ready = await wait_pod(kube, namespace, "served", ready_is(True))
    assert status_of(ready, "server")["ready"] is True
    unready = await wait_pod(kube, namespace, "served", ready_is(False))
    assert status_of(unready, "server")["ready"] is False
    assert status_of(unready, "server")["restartCount"] == 0  # readiness never restarts

    events = await kube.list(EVENTS, namespace)
    messages = [e["message"] for e in events.items if e["reason"] == "Unhealthy"]
    assert "Readiness probe failed: HTTP probe failed with statuscode: 503" in messages


async def test_a_failing_liveness_probe_restarts_the_container(
    kube: KubeClient, namespace: str
) -> None:
    container = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sh", "-c", "touch /tmp/alive; sleep 2; rm /tmp/alive; exec sleep 300"],
        "livenessProbe": {
            "exec": {"command": ["cat", "/tmp/alive"]},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    }
    await kube.create(
        PODS, namespace, pod("lively", [container], restart_policy="Always", grace_s=2)
    )

    def restarted_once(p: Obj) -> bool:
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        return any(s["restartCount"] >= 1 and s["state"].get("running") for s in statuses)

    restarted = await wait_pod(kube, namespace, "lively", restarted_once)
    last = status_of(restarted, "main")["lastState"]["terminated"]
    assert last["exitCode"] == 143  # SIGTERM, as a kubelet stops it
    assert restarted["status"]["phase"] == "Running"

    events = await kube.list(EVENTS, namespace)
    by_reason = {(e["reason"], e["message"]) for e in events.items}
    assert ("Killing", "Container main failed liveness probe, will be restarted") in by_reason
    assert any(
        reason == "Unhealthy" and message.startswith("Liveness probe failed: cat: ")
        for reason, message in by_reason
    )
