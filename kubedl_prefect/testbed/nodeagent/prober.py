"""Running a container's probes on a process node (the I/O half of :mod:`.probes`).

:func:`check` runs one check: an HTTP ``GET`` or a TCP connection from this machine to the pod's
address (as a kubelet probes from the node), or a command run inside the container's own
namespaces and root (``nsenter`` into its first process). :class:`ContainerProber` runs every
probe of one container run on its own schedule and tells the node agent when the container's
readiness changes and when it must be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from kubedl_prefect.testbed.nodeagent.probes import (
    ContainerHealth,
    Exec,
    HttpGet,
    Probe,
    ProbeAction,
    ProbeKind,
    ProbeState,
    TcpSocket,
    failure_message,
    health,
    initial_state,
    observe,
)

logger = logging.getLogger(__name__)


def _dial_error(exc: OSError) -> str:
    """An ``OSError`` of a connect in Go's words (``connect: connection refused``)."""
    if exc.errno:
        return f"connect: {os.strerror(exc.errno).lower()}"
    return str(exc)


#: The ``User-Agent`` of HTTP checks (a kubelet's is ``kube-probe/<major>.<minor>``).
USER_AGENT = "kube-probe/1.34"
#: Most output of a failed check kept in its message.
_OUTPUT_LIMIT = 1024


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome.

    Attributes:
        ok: It succeeded.
        output: What it said (a kubelet's wording for HTTP and TCP, the command's output).
    """

    ok: bool
    output: str = ""


async def _http(action: HttpGet) -> CheckResult:
    context: ssl.SSLContext | None = None
    if action.scheme == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        reader, writer = await asyncio.open_connection(action.host, action.port, ssl=context)
    except OSError as exc:
        return CheckResult(
            False,
            f'Get "{action.url}": dial tcp {action.host}:{action.port}: {_dial_error(exc)}',
        )
    try:
        headers = {
            "Host": f"{action.host}:{action.port}",
            "User-Agent": USER_AGENT,
            "Accept": "*/*",
        }
        headers.update(dict(action.headers))
        request = f"GET {action.path} HTTP/1.1\r\n"
        request += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request += "Connection: close\r\n\r\n"
        writer.write(request.encode("latin-1"))
        await writer.drain()
        line = (await reader.readline()).decode("latin-1").split()
        if len(line) < 2 or not line[1].isdigit():
            return CheckResult(False, f'Get "{action.url}": malformed HTTP response')
        code = int(line[1])
        if 200 <= code < 400:
            return CheckResult(True)
        return CheckResult(False, f"HTTP probe failed with statuscode: {code}")
    except OSError as exc:
        return CheckResult(False, f'Get "{action.url}": {exc}')
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _tcp(action: TcpSocket) -> CheckResult:
    try:
        _, writer = await asyncio.open_connection(action.host, action.port)
    except OSError as exc:
        return CheckResult(False, f"dial tcp {action.host}:{action.port}: {_dial_error(exc)}")
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return CheckResult(True)


async def _exec(
    action: Exec, init_pid: int, env: Mapping[str, str], timeout_s: float
) -> CheckResult:
    argv = [
        "nsenter",
        f"--target={init_pid}",
        "--mount",
        "--uts",
        "--net",
        "--pid",
        "--root",
        "--wd",
    ]
    process = await asyncio.create_subprocess_exec(
        *argv,
        "--",
        *action.command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return CheckResult(False, f"command timed out after {timeout_s:g}s")
    text = output.decode("utf-8", errors="replace")[-_OUTPUT_LIMIT:].strip()
    if process.returncode == 0:
        return CheckResult(True, text)
    return CheckResult(False, text or f"command exited with {process.returncode}")


async def check(
    action: ProbeAction,
    *,
    timeout_s: float,
    init_pid: int | None = None,
    env: Mapping[str, str] | None = None,
) -> CheckResult:
    """Run one check of ``action``; longer than ``timeout_s`` is a failure.

    Args:
        action: What to check.
        timeout_s: The probe's ``timeoutSeconds``.
        init_pid: The container's first process (``exec``: whose namespaces and root to enter).
        env: The container's environment (``exec``).
    """
    if isinstance(action, Exec):
        if init_pid is None:
            return CheckResult(False, "the container has no process to run the command in")
        return await _exec(action, init_pid, env or {}, timeout_s)
    run = _http(action) if isinstance(action, HttpGet) else _tcp(action)
    try:
        return await asyncio.wait_for(run, timeout_s)
    except TimeoutError:
        target = action.url if isinstance(action, HttpGet) else f"{action.host}:{action.port}"
        return CheckResult(False, f"{target}: timeout after {timeout_s:g}s")


class ContainerProber:
    """Runs the probes of one run of one container until cancelled or until it must die.

    Args:
        probes: The container's probes (:func:`~.probes.container_probes`).
        init_pid: Its first process (for ``exec`` checks), or a callable giving it.
        env: Its environment (for ``exec`` checks).
        on_ready: Called with the container's readiness whenever it changes.
        on_failure: Called with the kind and message of each failed check.
        on_kill: Called once with the kind of the probe that failed for good (liveness or
            startup); the prober then stops.
    """

    def __init__(
        self,
        probes: list[Probe],
        *,
        init_pid: Callable[[], int | None],
        env: Mapping[str, str],
        on_ready: Callable[[bool], Awaitable[None]],
        on_failure: Callable[[ProbeKind, str], Awaitable[None]],
        on_kill: Callable[[Probe], Awaitable[None]],
    ):
        self.probes = probes
        self.init_pid = init_pid
        self.env = env
        self.on_ready = on_ready
        self.on_failure = on_failure
        self.on_kill = on_kill
        self.states: dict[ProbeKind, ProbeState] = {p.kind: initial_state(p.kind) for p in probes}
        self.health = health(self.states)
        self._started = asyncio.Event()
        self._killed = asyncio.Event()
        if self.health.started:
            self._started.set()

    async def run(self) -> None:
        """Run every probe until cancelled, or until one had the container killed."""
        loops = [asyncio.create_task(self._loop(p)) for p in self.probes]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()

    async def _loop(self, probe: Probe) -> None:
        if probe.kind != "startup":
            await self._started.wait()
        await asyncio.sleep(probe.initial_delay_s)
        while not self._killed.is_set():
            result = await check(
                probe.action, timeout_s=probe.timeout_s, init_pid=self.init_pid(), env=self.env
            )
            if not result.ok:
                await self.on_failure(probe.kind, failure_message(probe.kind, result.output))
            self.states[probe.kind] = observe(probe, self.states[probe.kind], result.ok)
            before, self.health = self.health, health(self.states)
            if self.health.kill:
                self._killed.set()
                await self.on_kill(probe)
                return
            if self.health.started and not self._started.is_set():
                self._started.set()
            if self.health.ready != before.ready:
                await self.on_ready(self.health.ready)
            if probe.kind == "startup" and self.health.started:
                return
            await asyncio.sleep(probe.period_s)

    @property
    def current(self) -> ContainerHealth:
        """What the probes say now."""
        return self.health
