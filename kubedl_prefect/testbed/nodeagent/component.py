"""The process node agent as a test-bed component, and what ``down`` removes after it.

:data:`AGENT` is its row (the project's Python running ``python -m
kubedl_prefect.testbed.nodeagent``, as a cluster administrator like kwok); :func:`wait_ready`
waits for its Node. :func:`teardown` removes whatever the agent made and may have left when it
could not clean up itself (killed): container launchers and their process trees, the pod
network's namespaces, links and bridge, its state folder. :func:`leftovers` lists what is left
(nothing, after ``down``).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from kubedl_prefect.errors import NotFoundError, TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import NODES
from kubedl_prefect.testbed.components import Component, ComponentContext, Identity, Layout
from kubedl_prefect.testbed.nodeagent import network
from kubedl_prefect.testbed.nodeagent.agent import SANDBOX_MODULE, kill_launchers
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_NAME, AgentPaths

#: Name of the "binary" the agent's row runs: this Python.
PYTHON = "python"


def _args(ctx: ComponentContext) -> list[str]:
    layout = ctx.layout
    return ["-m", "kubedl_prefect.testbed.nodeagent", layout.name, str(layout.ports.base)]


AGENT = Component(
    name="process-node-agent",
    binary=PYTHON,
    args=_args,
    identity=Identity("process-node-agent", ("system:masters",)),
)


def binaries() -> dict[str, Path]:
    """The agent's "binary": the Python of this environment (whose ``.venv`` pods use)."""
    return {PYTHON: Path(sys.executable)}


def bed_network(layout: Layout) -> network.BedNetwork:
    """The pod network of the test bed in ``layout``."""
    return network.BedNetwork(network.bed_tag(layout.name), network.subnet(layout.ports.base))


async def wait_ready(kube: KubeClient, *, timeout_s: float = 60.0) -> None:
    """Wait until the process node is registered and Ready.

    Raises:
        TestbedError: It was not Ready in time.
    """
    import asyncio

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            node = await kube.get(NODES, None, PROCESS_NODE_NAME)
        except NotFoundError:
            node = {}
        conditions = (node.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return
        await asyncio.sleep(0.2)
    raise TestbedError(f"process node {PROCESS_NODE_NAME} not Ready after {timeout_s:.0f}s")


def _launchers(paths: AgentPaths) -> list[int]:
    import psutil

    marker = str(paths.root) + "/"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if SANDBOX_MODULE in cmdline and any(arg.startswith(marker) for arg in cmdline):
            found.append(proc.pid)
    return found


def leftovers(layout: Layout) -> list[str]:
    """What the process node of ``layout`` made that still exists (nothing after ``down``).

    Container processes, network namespaces, links, mounts and its state folder.
    """
    paths = AgentPaths(layout)
    found = [f"process {pid}" for pid in _launchers(paths)]
    if shutil.which("ip") is not None:
        found += network.leftovers(bed_network(layout))
    net = bed_network(layout)
    for point in network.mount_points_under(Path("/")):
        if point.startswith(str(paths.root)) or (
            point.startswith(str(network.NETNS_DIR) + "/") and net.owns_netns(Path(point).name)
        ):
            found.append(f"mount {point}")
    if paths.root.exists():
        found.append(f"folder {paths.root}")
    return found


def teardown(layout: Layout) -> None:
    """Remove what the process node of ``layout`` made (after its agent was stopped)."""
    paths = AgentPaths(layout)
    if not paths.root.exists():
        return
    kill_launchers(paths)
    deadline = time.monotonic() + 5.0
    while _launchers(paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    if shutil.which("ip") is not None:
        network.teardown(bed_network(layout))
    shutil.rmtree(paths.root, ignore_errors=True)
