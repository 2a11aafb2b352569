"""Services of process pods, reachable from this machine: a small TCP forwarder per Service port.

The test bed has no cluster IPs and no kube-proxy, and the API server refuses link-local pod
addresses in Endpoints, so a Service of process pods has no address a client on this machine
could use. The node agent therefore forwards: for every TCP port of every Service that selects
one of its pods, it listens on ``127.0.0.1`` (a free port) and passes each connection on to one of
the Service's ready pods (its ``targetPort``, a named port looked up in the pod's containers),
taking them in turn. A connection that arrives while no selected pod is ready is closed at once.

Which address serves which Service port is written to ``services.json`` in the node's state
folder (:func:`forwards_file`); :func:`read_forwards` and :func:`service_address` read it, and
``kubedl-prefect testbed services`` prints it. The listeners live in the agent: they stop with
it, and ``down`` removes the file with the node's state.

:func:`service_routes` (pure) decides the routes; :class:`Forwarder` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed.components import LOOPBACK, Layout
from kubedl_prefect.testbed.nodeagent.network import PodEntry
from kubedl_prefect.testbed.nodeagent.node import AgentPaths

logger = logging.getLogger(__name__)

KubeObject = dict[str, Any]

#: The state file's name, in the node's state folder.
FORWARDS_FILE = "services.json"
_COPY_CHUNK = 64 * 1024


@dataclass(frozen=True, order=True)
class ServicePort:
    """One TCP port of one Service.

    Attributes:
        namespace: The Service's namespace.
        service: Its name.
        port: The port number it declares.
        name: The port's name (may be empty).
    """

    namespace: str
    service: str
    port: int
    name: str = ""


@dataclass(frozen=True)
class ProcessPod:
    """A pod of the process node, as the forwarder sees it.

    Attributes:
        entry: The pod as Services select it (labels, address, readiness).
        ports: Its containers' named ports, ``{name: number}``.
    """

    entry: PodEntry
    ports: Mapping[str, int] = field(default_factory=dict)


def container_ports(pod: KubeObject) -> dict[str, int]:
    """The named ports of a pod's containers.

    Example:
        >>> container_ports({"spec": {"containers": [{"ports": [
        ...     {"name": "http", "containerPort": 8080}, {"containerPort": 9000}]}]}})
        {'http': 8080}
    """
    found: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name"):
                found[str(port["name"])] = int(port["containerPort"])
    return found


def _target(port: Mapping[str, Any], pod: ProcessPod) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    text = str(target)
    if text.isdigit():
        return int(text)
    return pod.ports.get(text)


def service_routes(
    services: Sequence[KubeObject], pods: Sequence[ProcessPod]
) -> dict[ServicePort, list[tuple[str, int]]]:
    """For each TCP port of each Service selecting a process pod: its ready targets.

    A Service with a selector that matches at least one pod of ``pods`` (ready or not) gets a
    route per TCP port; its targets are the ``(address, targetPort)`` of the matching ready pods
    (all of them with ``publishNotReadyAddresses``), in the order given.

    Example:
        >>> svc = {"metadata": {"name": "model", "namespace": "ml"}, "spec": {
        ...     "selector": {"app": "m"}, "ports": [{"port": 80, "targetPort": "http"}]}}
        >>> ready = ProcessPod(PodEntry("ml", {"app": "m"}, "169.254.104.2", "", "", True),
        ...                    {"http": 8080})
        >>> service_routes([svc], [ready])
        {ServicePort(namespace='ml', service='model', port=80, name=''): [('169.254.104.2', 8080)]}
    """
    routes: dict[ServicePort, list[tuple[str, int]]] = {}
    for service in services:
        meta, spec = service.get("metadata") or {}, service.get("spec") or {}
        selector = spec.get("selector") or {}
        if not selector:
            continue
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        selected = [
            pod
            for pod in pods
            if pod.entry.namespace == namespace
            and pod.entry.address
            and all(pod.entry.labels.get(k) == v for k, v in selector.items())
        ]
        if not selected:
            continue
        everyone = bool(spec.get("publishNotReadyAddresses"))
        for port in spec.get("ports") or []:
            if str(port.get("protocol", "TCP")) != "TCP":
                continue
            key = ServicePort(namespace, name, int(port["port"]), str(port.get("name", "")))
            targets = []
            for pod in selected:
                number = _target(port, pod)
                if number is not None and (pod.entry.ready or everyone):
                    targets.append((pod.entry.address, number))
            routes[key] = targets
    return routes


@dataclass(frozen=True)
class Forward:
    """Where this machine reaches one Service port.

    Attributes:
        port: The Service port.
        address: ``127.0.0.1:<port>`` of its forwarder.
        targets: The ready pods it forwards to now, ``address:port``.
    """

    port: ServicePort
    address: str
    targets: tuple[str, ...]

    @property
    def url(self) -> str:
        """``http://<address>``."""
        return f"http://{self.address}"


class _Listener:
    def __init__(self, key: ServicePort):
        self.key = key
        self.targets: list[tuple[str, int]] = []
        self._turns = itertools.count()
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, LOOPBACK, 0)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        targets = list(self.targets)
        if not targets:
            writer.close()
            return
        host, port = targets[next(self._turns) % len(targets)]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            logger.info("forward of %s to %s:%s failed: %s", self.key, host, port, exc)
            writer.close()
            return
        await asyncio.gather(
            _pipe(reader, upstream_writer), _pipe(upstream_reader, writer), return_exceptions=True
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_COPY_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass
    finally:
        if reader.at_eof():
            writer.close()


def forwards_file(layout: Layout) -> Path:
    """Where the process node of ``layout`` writes its forwards."""
    return AgentPaths(layout).node_dir / FORWARDS_FILE


class Forwarder:
    """The listeners of one process node's Services (see the module's description).

    Args:
        state: The file the forwards are written to.
    """

    def __init__(self, state: Path):
        self.state = state
        self.listeners: dict[ServicePort, _Listener] = {}
        self._lock = asyncio.Lock()

    async def update(self, routes: Mapping[ServicePort, list[tuple[str, int]]]) -> None:
        """Open, retarget and close listeners so that they match ``routes``; write the file."""
        async with self._lock:
            for key in set(self.listeners) - set(routes):
                await self.listeners.pop(key).close()
            for key, targets in routes.items():
                listener = self.listeners.get(key)
                if listener is None:
                    listener = _Listener(key)
                    try:
                        await listener.open()
                    except OSError as exc:
                        logger.warning("no forwarder for %s: %s", key, exc)
                        continue
                    self.listeners[key] = listener
                listener.targets = list(targets)
            self._write()

    async def close(self) -> None:
        """Close every listener and remove the file."""
        async with self._lock:
            for listener in self.listeners.values():
                await listener.close()
            self.listeners.clear()
            self.state.unlink(missing_ok=True)

    def _write(self) -> None:
        forwards = [
            {
                "namespace": key.namespace,
                "service": key.service,
                "port": key.port,
                "name": key.name,
                "address": listener.address,
                "targets": [f"{host}:{port}" for host, port in listener.targets],
            }
            for key, listener in sorted(self.listeners.items())
        ]
        self.state.parent.mkdir(parents=True, exist_ok=True)
        partial = self.state.with_suffix(".partial")
        partial.write_text(json.dumps(forwards, indent=1) + "\n")
        os.replace(partial, self.state)


def read_forwards(layout: Layout) -> list[Forward]:
    """The forwards the process node of ``layout`` serves now (none when it does not run)."""
    path = forwards_file(layout)
    try:
        entries = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return [
        Forward(
            ServicePort(e["namespace"], e["service"], int(e["port"]), e.get("name", "")),
            str(e["address"]),
            tuple(e.get("targets") or ()),
        )
        for e in entries
    ]


def service_address(layout: Layout, namespace: str, service: str, port: int | None = None) -> str:
    """``127.0.0.1:<port>`` where this machine reaches ``service`` (its only or given port).

    Raises:
        TestbedError: No process pod's Service of that name and port is forwarded.
    """
    found = [
        f
        for f in read_forwards(layout)
        if f.port.namespace == namespace
        and f.port.service == service
        and (port is None or f.port.port == port)
    ]
    if len(found) != 1:
        what = f"{namespace}/{service}" + (f" port {port}" if port is not None else "")
        known = ", ".join(f"{f.port.namespace}/{f.port.service}:{f.port.port}" for f in found)
        raise TestbedError(
            f"Service {what} is not forwarded by the process node of test bed "
            f"{layout.name!r}" + (f" (several ports: {known}; name one)" if found else ""),
            hint="the forwarder serves Services that select a pod of the process node; "
            "`kubedl-prefect testbed services` lists what is forwarded",
        )
    return found[0].address
