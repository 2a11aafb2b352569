"""Probes on the process node: the pure deciders, and HTTP and TCP checks on real sockets."""

from __future__ import annotations

import asyncio
import doctest
from collections.abc import AsyncIterator
from types import ModuleType

import pytest

from kubedl_prefect.testbed.nodeagent import podstatus, prober, probes
from kubedl_prefect.testbed.nodeagent.podstatus import ContainerRecord, Running
from kubedl_prefect.testbed.nodeagent.probes import (
    Exec,
    HttpGet,
    Probe,
    ProbeState,
    TcpSocket,
    container_probes,
    health,
    initial_state,
    observe,
)

POD_IP = "169.254.104.9"


@pytest.mark.parametrize("module", [probes], ids=lambda m: m.__name__)
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0


def test_all_three_handlers_are_read_with_the_api_servers_defaults() -> None:
    container = {
        "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9000}],
        "startupProbe": {"tcpSocket": {"port": 9000}, "failureThreshold": 30, "periodSeconds": 1},
        "livenessProbe": {
            "exec": {"command": ["cat", "/tmp/healthy"]},
            "initialDelaySeconds": 5,
            "terminationGracePeriodSeconds": 4,
        },
        "readinessProbe": {
            "httpGet": {
                "path": "v2/health/ready",
                "port": "http",
                "scheme": "https",
                "httpHeaders": [{"name": "X-Probe", "value": "1"}],
            },
            "successThreshold": 2,
            "timeoutSeconds": 3,
        },
    }

    found = container_probes(container, POD_IP)

    assert isinstance(found, list)
    startup, liveness, readiness = found
    assert startup == Probe("startup", TcpSocket(POD_IP, 9000), period_s=1.0, failure_threshold=30)
    assert liveness == Probe(
        "liveness", Exec(("cat", "/tmp/healthy")), initial_delay_s=5.0, termination_grace_s=4.0
    )
    assert readiness.action == HttpGet(
        POD_IP, 8080, "/v2/health/ready", "HTTPS", (("X-Probe", "1"),)
    )
    assert (readiness.success_threshold, readiness.timeout_s, readiness.period_s) == (2, 3.0, 10.0)
    assert container_probes({"image": "x"}, POD_IP) == []


def test_an_unknown_named_port_is_a_problem_not_a_probe() -> None:
    problem = container_probes({"readinessProbe": {"tcpSocket": {"port": "metrics"}}}, POD_IP)
    assert problem == 'readinessProbe: port "metrics" is not a named port of the container'


def test_readiness_flips_only_after_its_thresholds() -> None:
    probe = Probe("readiness", TcpSocket(POD_IP, 1), success_threshold=2, failure_threshold=3)
    state = initial_state("readiness")
    seen = []
    for ok in (True, True, False, False, True, False, False, False, True, True):
        state = observe(probe, state, ok)
        seen.append(state.success)
    assert seen == [False, True, True, True, True, True, True, False, False, True]
    assert state.checks == 10


def test_liveness_kills_after_failure_threshold_failures_in_a_row() -> None:
    probe = Probe("liveness", TcpSocket(POD_IP, 1), failure_threshold=2)
    states = {"liveness": initial_state("liveness")}
    verdicts = []
    for ok in (False, True, False, False):
        states["liveness"] = observe(probe, states["liveness"], ok)
        verdicts.append(health(states).kill)
    assert verdicts == ["", "", "", "liveness"]


def test_nothing_but_the_startup_probe_counts_until_it_succeeds() -> None:
    startup = Probe("startup", TcpSocket(POD_IP, 1), failure_threshold=2)
    states = {
        "startup": initial_state("startup"),
        "readiness": ProbeState(True, successes=1, checks=1),
    }
    assert health(states) == probes.ContainerHealth(started=False, ready=False)
    states["startup"] = observe(startup, states["startup"], True)
    assert health(states) == probes.ContainerHealth(started=True, ready=True)

    failing = {"startup": initial_state("startup")}
    for _ in range(2):
        failing["startup"] = observe(startup, failing["startup"], False)
    assert health(failing).kill == "startup"


def test_a_running_container_is_ready_only_when_its_readiness_probe_says_so() -> None:
    pod = {"spec": {"restartPolicy": "Always"}}
    records = [
        ContainerRecord("server", "i", Running("t")),
        ContainerRecord("sidecar", "i", Running("t")),
    ]
    kwargs = {"pod_ip": POD_IP, "host_ip": "127.0.0.1", "start_time": "t", "now": "t"}

    def ready(readiness: dict[str, bool]) -> tuple[str, list[bool]]:
        status = podstatus.pod_status(pod, [], records, readiness=readiness, **kwargs)  # type: ignore[arg-type]
        condition = next(c for c in status["conditions"] if c["type"] == "Ready")
        return condition["status"], [c["ready"] for c in status["containerStatuses"]]

    assert ready({"server": False}) == ("False", [False, True])
    assert ready({"server": True}) == ("True", [True, True])
    assert ready({}) == ("True", [True, True])


@pytest.fixture
async def http_server() -> AsyncIterator[tuple[int, list[str]]]:
    """A real HTTP server on loopback: 200 on /ok, 301 on /moved, 503 elsewhere."""
    requests: list[str] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        requests.append(head)
        path = head.split()[1]
        code = {"/ok": "200 OK", "/moved": "301 Moved Permanently"}.get(path, "503 Unavailable")
        writer.write(f"HTTP/1.1 {code}\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield port, requests


async def test_http_checks_take_2xx_and_3xx_and_report_other_codes(
    http_server: tuple[int, list[str]],
) -> None:
    port, requests = http_server
    get = HttpGet("127.0.0.1", port, "/ok", headers=(("X-Probe", "yes"),))

    assert await prober.check(get, timeout_s=2) == prober.CheckResult(True)
    assert (await prober.check(HttpGet("127.0.0.1", port, "/moved"), timeout_s=2)).ok
    failed = await prober.check(HttpGet("127.0.0.1", port, "/ready"), timeout_s=2)
    assert failed == prober.CheckResult(False, "HTTP probe failed with statuscode: 503")
    assert "User-Agent: kube-probe/" in requests[0]
    assert "X-Probe: yes" in requests[0]


async def test_tcp_checks_see_a_listener_and_a_closed_port() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        assert (await prober.check(TcpSocket("127.0.0.1", port), timeout_s=2)).ok
    closed = await prober.check(TcpSocket("127.0.0.1", port), timeout_s=2)
    assert not closed.ok
    assert closed.output.startswith(f"dial tcp 127.0.0.1:{port}: ")
    assert "refused" in closed.output.lower()


async def test_the_prober_kills_once_and_reports_readiness_changes() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    said: list[object] = []
    became_ready = asyncio.Event()

    async def on_ready(ready: bool) -> None:
        said.append(ready)
        became_ready.set()

    async def on_failure(kind: probes.ProbeKind, message: str) -> None:
        said.append(message.split(":")[0])

    async def on_kill(probe: Probe) -> None:
        said.append(f"kill {probe.kind}")

    made = prober.ContainerProber(
        [
            Probe("readiness", TcpSocket("127.0.0.1", port), period_s=0.05),
            Probe("liveness", TcpSocket("127.0.0.1", port), period_s=0.05, failure_threshold=2),
        ],
        init_pid=lambda: None,
        env={},
        on_ready=on_ready,
        on_failure=on_failure,
        on_kill=on_kill,
    )
    running = asyncio.create_task(made.run())
    await asyncio.wait_for(became_ready.wait(), 5)
    server.close()
    await server.wait_closed()
    await asyncio.wait_for(running, 5)

    assert said[0] is True
    assert said.count("kill liveness") == 1
    assert said[-1] == "kill liveness"
    assert said.count("Liveness probe failed") == 2
