"""Why a predictor's pods are not Ready, in the model server's own words: which log, which line.

When a deployment fails or times out, :mod:`.deploy` reads the log of the container that tells
why (:func:`telling_container`) and adds its error line (:func:`server_error`) to the reason: a
model server that cannot load a model says so in its log, not in the pod's status. MLServer 1.7,
for one, logs the exception and exits with code 0, so neither the exit code nor a termination
message (``FallbackToLogsOnError`` applies to failed exits only) carries it, and KServe's
``modelStatus.lastFailureInfo.message`` stays empty. Pure.

Example:
    >>> server_error([
    ...     "2026-12-03 15:54:23,943 [mlserver] ERROR - Some of the models failed to load",
    ...     "Traceback (most recent call last):",
    ...     '    raise MlflowException(',
    ...     'mlflow.exceptions.MlflowException: Model does not have the "python_function" flavor',
    ...     "2026-12-03 15:54:24,146 [mlserver.grpc] INFO - gRPC server shutdown complete"])
    'mlflow.exceptions.MlflowException: Model does not have the "python_function" flavor'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kubedl_prefect.kube.resources import KubeObject

MAX_ERROR_LENGTH: Final = 400
"""The longest error line kept (a model server may log a whole payload in one)."""

# The last line of a Python traceback (``pkg.module.SomeError: what``), or a logged ERROR.
_EXCEPTION_LINE: Final = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Failure)\b:?\s")
_LOGGED_ERROR: Final = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b")


@dataclass(frozen=True)
class LogSource:
    """The container whose log tells why a pod is not Ready.

    Attributes:
        pod: The pod's name.
        container: The container's name.
        previous: Read the instance before its last restart (the current one is starting over
            or waiting to).
    """

    pod: str
    container: str
    previous: bool


def _labelled(pod: KubeObject, labels: Mapping[str, str]) -> bool:
    mine = (pod.get("metadata") or {}).get("labels") or {}
    return all(mine.get(k) == v for k, v in labels.items())


def _source(pod_name: str, status: Mapping[str, Any], *, init: bool) -> LogSource | None:
    state = status.get("state") or {}
    last = (status.get("lastState") or {}).get("terminated")
    terminated = state.get("terminated")
    name = str(status.get("name") or "")
    if init:
        # An init container that ended badly, or one that keeps failing.
        if terminated and int(terminated.get("exitCode") or 0) != 0:
            return LogSource(pod_name, name, previous=False)
        if last and not terminated:
            return LogSource(pod_name, name, previous=True)
        return None
    if status.get("ready"):
        return None
    if terminated:
        return LogSource(pod_name, name, previous=False)
    # Restarted (running again, or waiting in CrashLoopBackOff): the ended instance tells.
    return LogSource(pod_name, name, previous=bool(last))


def telling_container(
    pods: Sequence[KubeObject], labels: Mapping[str, str] | None = None
) -> LogSource | None:
    """The container of the first pod not Ready (carrying ``labels``) whose log tells why.

    A failed init container (the storage initializer) comes first; else the first container
    not ready: its ended instance when it restarted, else the one running (loading, or failed
    without exiting). ``None`` when every pod is Ready, or none has started a container.
    """
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if metadata.get("deletionTimestamp") or not _labelled(pod, labels or {}):
            continue
        status = pod.get("status") or {}
        name = str(metadata.get("name") or "")
        for entry in status.get("initContainerStatuses") or []:
            found = _source(name, entry, init=True)
            if found is not None:
                return found
        for entry in status.get("containerStatuses") or []:
            if (entry.get("state") or {}).get("waiting") and not (entry.get("lastState") or {}).get(
                "terminated"
            ):
                continue  # never started: no log yet
            found = _source(name, entry, init=False)
            if found is not None:
                return found
    return None


def server_error(lines: Sequence[str]) -> str | None:
    """The model server's own error in its log: the last exception line, else the last ERROR.

    ``None`` when the log says neither (the server is still loading, or logs elsewhere).
    """
    exception = next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), None)
    found = exception or next(
        (line for line in reversed(lines) if _LOGGED_ERROR.search(line)), None
    )
    if found is None:
        return None
    found = found.strip()
    return found if len(found) <= MAX_ERROR_LENGTH else found[: MAX_ERROR_LENGTH - 3] + "..."
