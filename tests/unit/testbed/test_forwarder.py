"""The Service forwarder of the process node: routes (pure) and real listeners on loopback."""

from __future__ import annotations

import asyncio
import doctest
import json
from pathlib import Path

import pytest

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed.components import Layout, Ports
from kubedl_prefect.testbed.nodeagent import forwarder
from kubedl_prefect.testbed.nodeagent.forwarder import (
    Forwarder,
    ProcessPod,
    ServicePort,
    service_routes,
)
from kubedl_prefect.testbed.nodeagent.network import PodEntry


def test_docstring_examples() -> None:
    result = doctest.testmod(forwarder)
    assert result.attempted > 0
    assert result.failed == 0


def a_service(
    name: str, selector: dict[str, str], *ports: dict[str, object], **spec: object
) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"selector": selector, "ports": list(ports), **spec},
    }


def a_pod(address: str, *, ready: bool, labels: dict[str, str] | None = None) -> ProcessPod:
    entry = PodEntry("ml", labels or {"app": "m"}, address, "", "", ready)
    return ProcessPod(entry, {"http": 8080, "grpc": 9000})


def test_routes_go_to_ready_selected_pods_by_named_or_numbered_target_port() -> None:
    services = [
        a_service(
            "model",
            {"app": "m"},
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "grpc", "port": 81, "targetPort": 9000},
            {"name": "dns", "port": 53, "protocol": "UDP"},
        ),
        a_service("kwok-only", {"app": "elsewhere"}, {"port": 80}),
        {"metadata": {"name": "headless", "namespace": "ml"}, "spec": {"ports": [{"port": 1}]}},
    ]
    pods = [
        a_pod("169.254.104.2", ready=True),
        a_pod("169.254.104.3", ready=False),
        a_pod("169.254.104.4", ready=True, labels={"app": "m", "extra": "x"}),
    ]

    routes = service_routes(services, pods)

    assert routes == {
        ServicePort("ml", "model", 80, "http"): [("169.254.104.2", 8080), ("169.254.104.4", 8080)],
        ServicePort("ml", "model", 81, "grpc"): [("169.254.104.2", 9000), ("169.254.104.4", 9000)],
    }


def test_a_service_whose_pods_are_not_ready_keeps_its_route_without_targets() -> None:
    service = a_service("model", {"app": "m"}, {"port": 80, "targetPort": 8080})
    pods = [a_pod("169.254.104.3", ready=False)]
    assert service_routes([service], pods) == {ServicePort("ml", "model", 80): []}
    everyone = a_service("model", {"app": "m"}, {"port": 80}, publishNotReadyAddresses=True)
    assert service_routes([everyone], pods) == {
        ServicePort("ml", "model", 80): [("169.254.104.3", 80)]
    }


async def echo_server(greeting: bytes) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(100)
        writer.write(greeting + data)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def ask(address: str, text: bytes) -> bytes:
    """What the server at ``address`` answers to ``text`` (``b""``: closed without an answer)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(text)
        await writer.drain()
        return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_the_forwarder_passes_connections_to_the_targets_in_turn(tmp_path: Path) -> None:
    first, second = await echo_server(b"one:"), await echo_server(b"two:")
    ports = [s.sockets[0].getsockname()[1] for s in (first, second)]
    key = ServicePort("ml", "model", 80, "http")
    state = tmp_path / "services.json"
    made = Forwarder(state)
    try:
        await made.update({key: [("127.0.0.1", ports[0]), ("127.0.0.1", ports[1])]})
        [written] = json.loads(state.read_text())
        address = written["address"]
        assert written["targets"] == [f"127.0.0.1:{p}" for p in ports]

        answers = {await ask(address, b"hi") for _ in range(4)}
        assert answers == {b"one:hi", b"two:hi"}

        await made.update({key: []})  # no ready pod: connections are closed at once
        assert await ask(address, b"hi") == b""
        assert json.loads(state.read_text())[0]["address"] == address  # the same port stays

        await made.update({})
        assert json.loads(state.read_text()) == []
        with pytest.raises(ConnectionRefusedError):
            await ask(address, b"hi")
    finally:
        await made.close()
        for server in (first, second):
            server.close()
    assert not state.exists()


def test_service_address_reads_the_file_and_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path))
    layout = Layout(name="unit", ports=Ports(base=30400))
    path = forwarder.forwards_file(layout)
    path.parent.mkdir(parents=True)
    entries = [
        {"namespace": "ml", "service": "model", "port": p, "address": f"127.0.0.1:{4000 + p}"}
        for p in (80, 81)
    ]
    path.write_text(json.dumps(entries))

    assert forwarder.service_address(layout, "ml", "model", 81) == "127.0.0.1:4081"
    with pytest.raises(TestbedError, match="several ports: ml/model:80, ml/model:81"):
        forwarder.service_address(layout, "ml", "model")
    with pytest.raises(TestbedError, match="ml/other is not forwarded"):
        forwarder.service_address(layout, "ml", "other")
