"""What a process node reports for a pod, and what it does when a container exits (pure).

The node agent keeps one :class:`ContainerRecord` per container (init containers included) and
reports :func:`pod_status` of them, the way a kubelet computes a pod's phase: init containers
first, then the containers; ``restartPolicy`` decides (:func:`restarts`) whether an exited
container runs again, after a back-off (:func:`backoff_s`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KubeObject = dict[str, Any]


@dataclass(frozen=True)
class Waiting:
    """Not running: never started, or waiting to start again.

    Attributes:
        reason: ``ContainerCreating``, ``PodInitializing``, ``ErrImagePull``,
            ``ImagePullBackOff``, ``CrashLoopBackOff``, ``CreateContainerConfigError``...
        message: Why.
    """

    reason: str
    message: str = ""


@dataclass(frozen=True)
class Running:
    """Running since ``started_at`` (RFC 3339)."""

    started_at: str


@dataclass(frozen=True)
class Terminated:
    """Exited.

    Attributes:
        exit_code: Its exit code (128 + the signal when a signal ended it).
        started_at: When it started (RFC 3339).
        finished_at: When it exited (RFC 3339).
        signal: The signal that ended it, if any.
        message: What it left at its ``terminationMessagePath`` (:func:`termination_message`).
    """

    exit_code: int
    started_at: str
    finished_at: str
    signal: int | None = None
    message: str = ""

    @property
    def reason(self) -> str:
        """``Completed`` for exit code 0, else ``Error``."""
        return "Completed" if self.exit_code == 0 else "Error"


ContainerState = Waiting | Running | Terminated


@dataclass(frozen=True)
class ContainerRecord:
    """What the node knows of one container.

    Attributes:
        name: The container's name.
        image: Its image.
        state: Its current state.
        last: Its previous run's end, if it ran before.
        restart_count: How often it was started again.
    """

    name: str
    image: str
    state: ContainerState
    last: Terminated | None = None
    restart_count: int = 0


def restarts(policy: str, exit_code: int) -> bool:
    """Whether a container that exited with ``exit_code`` runs again under ``policy``.

    Example:
        >>> [restarts(p, c) for p in ("Always", "OnFailure", "Never") for c in (0, 1)]
        [True, True, False, True, False, False]
    """
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return exit_code != 0
    return False


def backoff_s(restart_count: int, *, initial: float = 0.5, cap: float = 10.0) -> float:
    """Delay before the ``restart_count``-th restart (shorter than a kubelet's 10 s .. 5 min).

    Example:
        >>> [backoff_s(n) for n in (0, 1, 2, 6)]
        [0.5, 1.0, 2.0, 10.0]
    """
    return min(cap, initial * 2.0**restart_count)


def _state(state: ContainerState) -> KubeObject:
    if isinstance(state, Waiting):
        body: KubeObject = {"reason": state.reason}
        if state.message:
            body["message"] = state.message
        return {"waiting": body}
    if isinstance(state, Running):
        return {"running": {"startedAt": state.started_at}}
    terminated: KubeObject = {
        "exitCode": state.exit_code,
        "reason": state.reason,
        "startedAt": state.started_at,
        "finishedAt": state.finished_at,
    }
    if state.signal is not None:
        terminated["signal"] = state.signal
    if state.message:
        terminated["message"] = state.message
    return {"terminated": terminated}


MAX_TERMINATION_MESSAGE_BYTES = 4096
"""The most of a termination message a kubelet keeps (it cuts the rest)."""
_SHARED_TREES = ("/dev", "/proc", "/sys")


def termination_message_path(container: KubeObject) -> str | None:
    """Where ``container``'s termination message file is mounted; ``None`` when it cannot be.

    As a kubelet does, the node mounts a file of its own at ``terminationMessagePath`` and reads
    it when the container exits. A container here shares this machine's ``/dev`` and ``/sys``,
    so a path under them (the default, ``/dev/termination-log``) would put the file on the
    machine itself: such containers leave no message; a pod that wants one names a path
    elsewhere.

    Example:
        >>> termination_message_path({"terminationMessagePath": "/kubedl-prefect/termination-log"})
        '/kubedl-prefect/termination-log'
        >>> termination_message_path({}) is None  # /dev/termination-log
        True
    """
    path = str(container.get("terminationMessagePath") or "/dev/termination-log")
    normal = "/" + "/".join(part for part in path.split("/") if part not in ("", "."))
    if not path.startswith("/") or ".." in normal.split("/"):
        return None
    if any(normal == tree or normal.startswith(f"{tree}/") for tree in _SHARED_TREES):
        return None
    return normal


def termination_message(data: bytes) -> str:
    """The message a container left, as a kubelet reports it: at most 4 KiB of it.

    Example:
        >>> len(termination_message(b"x" * 5000)), termination_message(b"done")
        (4096, 'done')
    """
    return data[:MAX_TERMINATION_MESSAGE_BYTES].decode("utf-8", errors="replace")


def container_status(
    record: ContainerRecord, *, init: bool = False, probed_ready: bool = True
) -> KubeObject:
    """One entry of ``containerStatuses`` (or ``initContainerStatuses``).

    ``probed_ready`` is what the container's readiness probe says (see :mod:`.probes`); a
    running container without one is ready.
    """
    running = isinstance(record.state, Running)
    done = isinstance(record.state, Terminated) and record.state.exit_code == 0
    status: KubeObject = {
        "name": record.name,
        "image": record.image,
        "imageID": "",
        "state": _state(record.state),
        "lastState": _state(record.last) if record.last else {},
        "ready": done if init else running and probed_ready,
        "restartCount": record.restart_count,
        "started": running,
    }
    return status


def phase(
    policy: str, init: Sequence[ContainerRecord], containers: Sequence[ContainerRecord]
) -> str:
    """The pod's phase, as a kubelet computes it.

    An init container that failed for good fails the pod; until all succeeded the pod is
    ``Pending``. Then: any container running (or waiting to be restarted) means ``Running``,
    waiting to start at all ``Pending``; all exited: ``Succeeded`` if all exited 0, else
    ``Failed`` (``Never``), or ``Running`` while ``OnFailure``/``Always`` restart them.

    Example:
        >>> ok = ContainerRecord("c", "i", Terminated(0, "t", "t"))
        >>> bad = ContainerRecord("c", "i", Terminated(1, "t", "t"))
        >>> (phase("Never", [], [ok]), phase("Never", [], [bad]), phase("OnFailure", [], [ok]))
        ('Succeeded', 'Failed', 'Succeeded')
    """
    for record in init:
        state = record.state
        if isinstance(state, Terminated) and state.exit_code != 0 and policy == "Never":
            return "Failed"
        if not (isinstance(state, Terminated) and state.exit_code == 0):
            return "Pending"
    started = [r for r in containers if r.restart_count or not isinstance(r.state, Waiting)]
    if not started or (
        len(started) < len(containers) and not any(isinstance(r.state, Running) for r in containers)
    ):
        return "Pending"
    if any(isinstance(r.state, Running | Waiting) for r in containers):
        return "Running"
    codes = [r.state.exit_code for r in containers if isinstance(r.state, Terminated)]
    if all(code == 0 for code in codes):
        return "Succeeded" if policy != "Always" else "Running"
    return "Failed" if policy == "Never" else "Running"


def _condition(kind: str, ok: bool, now: str, reason: str = "") -> KubeObject:
    condition: KubeObject = {
        "type": kind,
        "status": "True" if ok else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    if reason and not ok:
        condition["reason"] = reason
    return condition


def pod_status(
    pod: KubeObject,
    init: Sequence[ContainerRecord],
    containers: Sequence[ContainerRecord],
    *,
    pod_ip: str | None,
    host_ip: str,
    start_time: str,
    now: str,
    readiness: Mapping[str, bool] | None = None,
) -> KubeObject:
    """The ``status`` a process node writes for ``pod``.

    Args:
        pod: The pod (its ``restartPolicy`` and earlier conditions).
        init: Records of its init containers, in order.
        containers: Records of its containers, in order.
        pod_ip: Its address (``None`` once its network is gone).
        host_ip: The node's address.
        start_time: When the node took it up.
        now: The current time (RFC 3339), for conditions that change.
        readiness: What the readiness probes say, by container name (a container without a
            readiness probe is ready while it runs).
    """
    probed = readiness or {}
    policy = str((pod.get("spec") or {}).get("restartPolicy", "Always"))
    current = phase(policy, init, containers)
    initialized = all(isinstance(r.state, Terminated) and r.state.exit_code == 0 for r in init)
    all_running = bool(containers) and all(
        isinstance(r.state, Running) and probed.get(r.name, True) for r in containers
    )
    finished = current in ("Succeeded", "Failed")
    before = {str(c.get("type")): c for c in ((pod.get("status") or {}).get("conditions") or [])}
    conditions = []
    for kind, ok, reason in (
        ("PodReadyToStartContainers", pod_ip is not None, ""),
        ("Initialized", initialized, "ContainersNotInitialized"),
        ("Ready", all_running, "PodCompleted" if finished else "ContainersNotReady"),
        ("ContainersReady", all_running, "PodCompleted" if finished else "ContainersNotReady"),
        ("PodScheduled", True, ""),
    ):
        condition = _condition(kind, ok, now, reason)
        earlier = before.get(kind)
        if earlier is not None and earlier.get("status") == condition["status"]:
            condition["lastTransitionTime"] = earlier.get("lastTransitionTime", now)
        conditions.append(condition)
    status: KubeObject = {
        "phase": current,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "initContainerStatuses": [container_status(r, init=True) for r in init],
        "containerStatuses": [
            container_status(r, probed_ready=probed.get(r.name, True)) for r in containers
        ],
        "qosClass": (pod.get("status") or {}).get("qosClass", "BestEffort"),
    }
    if pod_ip is not None:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status
