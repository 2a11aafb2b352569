"""A Service of process-node pods is reachable from this machine through the node's forwarder.

A real pod of the process node serves HTTP; its Service (named target port) gets a listener on
127.0.0.1 that ``testbed services`` lists and that answers from the pod, only while the pod is
ready; deleting the Service closes the listener.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PODS, SERVICES
from kubedl_prefect.testbed.cli import app
from kubedl_prefect.testbed.nodeagent import forwarder
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.process_node.test_process_pods import pod, wait_pod
from tests.integration.process_node.test_process_probes import ready_is

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SERVER = """
import http.server, socket
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{socket.gethostname()} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("", 8080), Handler).serve_forever()
"""


async def forwarded(
    testbed: Testbed, namespace: str, service: str, *, ready: bool, within_s: float = 30
) -> forwarder.Forward | None:
    """The Service's forward once it has ready targets (``ready``) or once it is gone."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = [
            f
            for f in forwarder.read_forwards(testbed.layout)
            if (f.port.namespace, f.port.service) == (namespace, service)
        ]
        if ready and found and found[0].targets:
            return found[0]
        if not ready and not found:
            return None
        await asyncio.sleep(0.2)
    raise AssertionError(
        f"{namespace}/{service}: forwards {forwarder.read_forwards(testbed.layout)}"
    )


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


async def test_a_service_of_a_process_pod_answers_on_loopback(
    kube: KubeClient, namespace: str, process_node: Testbed
) -> None:
    server = {
        "name": "server",
        "image": "python:3.11",
        "command": ["python", "-c", SERVER],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1},
    }
    await kube.create(
        PODS, namespace, pod("echo", [server], restart_policy="Always", labels={"app": "echo"})
    )
    await kube.create(
        SERVICES,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": "http"}]},
        },
    )
    running = await wait_pod(kube, namespace, "echo", ready_is(True))

    forward = await forwarded(process_node, namespace, "echo", ready=True)
    assert forward is not None
    assert forward.targets == (f"{running['status']['podIP']}:8080",)
    assert forward.address.startswith("127.0.0.1:")
    assert await asyncio.to_thread(get, f"{forward.url}/v2/health") == "echo /v2/health"
    address = forwarder.service_address(process_node.layout, namespace, "echo")
    assert address == forward.address

    listed = CliRunner().invoke(app, ["services", "--name", process_node.name])
    assert listed.exit_code == 0, listed.output
    assert f"{namespace}/echo:80" in listed.output
    assert forward.address in listed.output

    await kube.delete(SERVICES, namespace, "echo")
    assert await forwarded(process_node, namespace, "echo", ready=False) is None
    with pytest.raises(OSError, match="refused"):
        await asyncio.to_thread(get, f"{forward.url}/")


async def test_a_terminating_pod_leaves_its_services_at_once(
    kube: KubeClient, namespace: str, process_node: Testbed
) -> None:
    # As the endpoints controller does: a pod being deleted gets no more traffic through its
    # Services while its containers shut down (this one ignores SIGTERM: its grace period).
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SERVER
    for name in ("old", "new"):
        server = {
            "name": "server",
            "image": "python:3.11",
            "command": ["python", "-c", stubborn],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1},
        }
        await kube.create(
            PODS,
            namespace,
            pod(name, [server], restart_policy="Always", labels={"app": "pair"}, grace_s=10),
        )
    await kube.create(
        SERVICES,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "pair"},
            "spec": {"selector": {"app": "pair"}, "ports": [{"port": 80, "targetPort": "http"}]},
        },
    )
    old = await wait_pod(kube, namespace, "old", ready_is(True))
    new = await wait_pod(kube, namespace, "new", ready_is(True))
    deadline = time.monotonic() + 30
    while True:
        forward = await forwarded(process_node, namespace, "pair", ready=True)
        assert forward is not None
        if len(forward.targets) == 2:
            break
        assert time.monotonic() < deadline, forward
        await asyncio.sleep(0.2)

    await kube.delete(PODS, namespace, "old")
    await wait_pod(kube, namespace, "old", lambda p: bool(p["metadata"].get("deletionTimestamp")))
    deadline = time.monotonic() + 10
    while True:
        forward = await forwarded(process_node, namespace, "pair", ready=True)
        assert forward is not None
        if forward.targets == (f"{new['status']['podIP']}:8080",):
            break
        assert time.monotonic() < deadline, forward
        await asyncio.sleep(0.2)
    # The old pod still runs (its grace period), and no request reaches it.
    terminating = await kube.get(PODS, namespace, "old")
    assert terminating["status"]["podIP"] == old["status"]["podIP"]
    for _ in range(4):
        assert await asyncio.to_thread(get, f"{forward.url}/") == "new /"
