"""Container probes on a process node: what to check, and what the results mean (pure).

A kubelet runs three kinds of probe on each container (``startupProbe``, ``livenessProbe``,
``readinessProbe``), each one action (``httpGet``, ``tcpSocket`` or ``exec``) every
``periodSeconds`` after ``initialDelaySeconds``, each check cut at ``timeoutSeconds``. A probe's
result flips only after ``successThreshold`` checks in a row succeeded, or ``failureThreshold``
in a row failed. Until the startup probe succeeded the other two do not run. Readiness starts
failed (the container is not ready until a check passed); liveness and startup start
succeeded. A failed readiness probe takes the container (and the pod) out of ``Ready``; a failed
liveness or startup probe kills the container, which then restarts per ``restartPolicy``.

:func:`container_probes` reads a container's probes, :func:`observe` folds one check into a
probe's :class:`ProbeState`, :func:`health` says what the states mean for the container. The
checks themselves (I/O) are in :mod:`.prober`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

ProbeKind = Literal["startup", "liveness", "readiness"]

#: The container fields of the three probes, by kind (the order a kubelet starts them in).
PROBE_FIELDS: Final[dict[ProbeKind, str]] = {
    "startup": "startupProbe",
    "liveness": "livenessProbe",
    "readiness": "readinessProbe",
}


@dataclass(frozen=True)
class HttpGet:
    """An HTTP ``GET``: a status from 200 to 399 is a success.

    Attributes:
        host: Where to connect (the pod's address unless the probe names a host).
        port: The port (a named port already resolved).
        path: The request's path.
        scheme: ``HTTP`` or ``HTTPS`` (certificates are not verified, as a kubelet does not).
        headers: Extra request headers, in order.
    """

    host: str
    port: int
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def url(self) -> str:
        """The URL asked for, as a kubelet's messages show it."""
        return f"{self.scheme.lower()}://{self.host}:{self.port}{self.path}"


@dataclass(frozen=True)
class TcpSocket:
    """A TCP connection that opens is a success."""

    host: str
    port: int


@dataclass(frozen=True)
class Exec:
    """A command run in the container: exit code 0 is a success."""

    command: tuple[str, ...]


ProbeAction = HttpGet | TcpSocket | Exec


@dataclass(frozen=True)
class Probe:
    """One probe of a container, defaults filled in as the API server fills them.

    Attributes:
        kind: ``startup``, ``liveness`` or ``readiness``.
        action: What one check does.
        initial_delay_s: Seconds after the container started before the first check.
        period_s: Seconds between checks.
        timeout_s: Seconds a check may take (longer is a failure).
        success_threshold: Checks in a row that must succeed to flip the result to success.
        failure_threshold: Checks in a row that must fail to flip it to failure.
        termination_grace_s: The probe's own grace period when it kills the container
            (``None``: the pod's ``terminationGracePeriodSeconds``).
    """

    kind: ProbeKind
    action: ProbeAction
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace_s: float | None = None


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int | str:
    """The number of ``port`` (a number, or a name of the container's ``ports``), or why not.

    Example:
        >>> container = {"ports": [{"name": "http", "containerPort": 8080}]}
        >>> resolve_port("http", container), resolve_port(9000, container), resolve_port("8081", {})
        (8080, 9000, 8081)
        >>> resolve_port("grpc", container)
        'port "grpc" is not a named port of the container'
    """
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for entry in container.get("ports") or []:
        if entry.get("name") == port:
            return int(entry["containerPort"])
    return f"port {port!r} is not a named port of the container".replace("'", '"')


def _action(
    handler: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str
) -> ProbeAction | str:
    if "httpGet" in handler:
        get = handler["httpGet"]
        port = resolve_port(get.get("port", ""), container)
        if isinstance(port, str):
            return port
        headers = tuple(
            (str(h["name"]), str(h.get("value", ""))) for h in get.get("httpHeaders") or []
        )
        path = str(get.get("path") or "/")
        return HttpGet(
            host=str(get.get("host") or pod_ip),
            port=port,
            path=path if path.startswith("/") else "/" + path,
            scheme=str(get.get("scheme") or "HTTP").upper(),
            headers=headers,
        )
    if "tcpSocket" in handler:
        sock = handler["tcpSocket"]
        port = resolve_port(sock.get("port", ""), container)
        if isinstance(port, str):
            return port
        return TcpSocket(host=str(sock.get("host") or pod_ip), port=port)
    if "exec" in handler:
        command = tuple(str(part) for part in handler["exec"].get("command") or [])
        if not command:
            return "exec probe without a command"
        return Exec(command)
    kinds = sorted(set(handler) & {"grpc"}) or sorted(handler)
    return f"unsupported probe handler {', '.join(kinds)} (httpGet, tcpSocket and exec are)"


def container_probes(container: Mapping[str, Any], pod_ip: str) -> list[Probe] | str:
    """The probes of ``container`` (a pod at ``pod_ip``), or what is wrong with one.

    Example:
        >>> container = {"ports": [{"name": "http", "containerPort": 8080}],
        ...     "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
        ...                        "periodSeconds": 2}}
        >>> [probe] = container_probes(container, "169.254.104.2")
        >>> probe.kind, probe.action.url, probe.period_s, probe.failure_threshold
        ('readiness', 'http://169.254.104.2:8080/v2/health/ready', 2.0, 3)
        >>> container_probes({"livenessProbe": {"grpc": {"port": 9000}}}, "169.254.104.2")
        'livenessProbe: unsupported probe handler grpc (httpGet, tcpSocket and exec are)'
    """
    probes: list[Probe] = []
    for kind, field_name in PROBE_FIELDS.items():
        handler = container.get(field_name)
        if not handler:
            continue
        action = _action(handler, container, pod_ip)
        if isinstance(action, str):
            return f"{field_name}: {action}"
        grace = handler.get("terminationGracePeriodSeconds")
        probes.append(
            Probe(
                kind=kind,
                action=action,
                initial_delay_s=float(handler.get("initialDelaySeconds") or 0),
                period_s=float(handler.get("periodSeconds") or 10),
                timeout_s=float(handler.get("timeoutSeconds") or 1),
                success_threshold=int(handler.get("successThreshold") or 1),
                failure_threshold=int(handler.get("failureThreshold") or 3),
                termination_grace_s=float(grace) if grace is not None else None,
            )
        )
    return probes


@dataclass(frozen=True)
class ProbeState:
    """A probe's result so far.

    Attributes:
        success: The current result.
        successes: Checks in a row that succeeded.
        failures: Checks in a row that failed.
        checks: Checks run.
    """

    success: bool
    successes: int = 0
    failures: int = 0
    checks: int = 0


def initial_state(kind: ProbeKind) -> ProbeState:
    """A probe's result before its first check: failed for readiness, succeeded otherwise.

    Example:
        >>> initial_state("readiness").success, initial_state("liveness").success
        (False, True)
    """
    return ProbeState(success=kind != "readiness")


def observe(probe: Probe, state: ProbeState, ok: bool) -> ProbeState:
    """``state`` after one more check of ``probe`` that succeeded (``ok``) or failed.

    Example:
        >>> probe = Probe("readiness", TcpSocket("h", 1), success_threshold=2, failure_threshold=2)
        >>> state = initial_state("readiness")
        >>> seen = []
        >>> for ok in (True, True, False, True, False, False):
        ...     state = observe(probe, state, ok)
        ...     seen.append(state.success)
        >>> seen
        [False, True, True, True, True, False]
    """
    if ok:
        successes, failures = state.successes + 1, 0
        success = state.success or successes >= probe.success_threshold
    else:
        successes, failures = 0, state.failures + 1
        success = state.success and failures < probe.failure_threshold
    return replace(
        state, success=success, successes=successes, failures=failures, checks=state.checks + 1
    )


@dataclass(frozen=True)
class ContainerHealth:
    """What a container's probes say.

    Attributes:
        started: Its startup probe succeeded (or it has none): the other probes run.
        ready: It may take traffic (started, and its readiness probe passes or it has none).
        kill: Why it must be killed (a failed liveness or startup probe), or ``""``.
    """

    started: bool
    ready: bool
    kill: str = ""


def health(states: Mapping[ProbeKind, ProbeState]) -> ContainerHealth:
    """What the probe states of one running container mean (a kind absent: no such probe).

    Example:
        >>> health({"readiness": ProbeState(True), "liveness": ProbeState(False, failures=3)})
        ContainerHealth(started=True, ready=False, kill='liveness')
        >>> health({"startup": ProbeState(True, checks=0), "readiness": ProbeState(True)})
        ContainerHealth(started=False, ready=False, kill='')
    """
    startup = states.get("startup")
    started = startup is None or (startup.success and startup.checks > 0)
    kill = ""
    if startup is not None and not startup.success:
        kill = "startup"
    elif started and not states.get("liveness", ProbeState(True)).success:
        kill = "liveness"
    readiness = states.get("readiness")
    ready = started and (readiness is None or readiness.success) and not kill
    return ContainerHealth(started=started, ready=ready, kill=kill)


def failure_message(kind: ProbeKind, output: str) -> str:
    """The ``Unhealthy`` event's message, as a kubelet words it.

    Example:
        >>> failure_message("readiness", "HTTP probe failed with statuscode: 503")
        'Readiness probe failed: HTTP probe failed with statuscode: 503'
    """
    return f"{kind.capitalize()} probe failed: {output}"


def kill_message(container: str, kind: ProbeKind) -> str:
    """The ``Killing`` event's message when a probe kills ``container``.

    Example:
        >>> kill_message("main", "liveness")
        'Container main failed liveness probe, will be restarted'
    """
    return f"Container {container} failed {kind} probe, will be restarted"
