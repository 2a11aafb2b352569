"""What the simulated containers print: CRI log files that kwok serves as the kubelet would.

Pods on kwok nodes run no container, so nothing prints by itself. kwok's server answers the
kubelet API the API server forwards ``GET .../pods/<pod>/log`` to (``/containerLogs/...``) from
files named in ``Logs`` objects (``kwok.x-k8s.io/v1alpha1``, one per pod, named after it). It reads
them with the kubelet's own CRI log reader, so the files are in the CRI format,
``<RFC3339Nano time> <stdout|stderr> F <text>`` one line each, and ``follow``, ``timestamps``,
``sinceTime``, ``sinceSeconds`` and ``tailLines`` behave as on a real node: a followed stream
receives the lines appended later.

:meth:`~kubedl_prefect.testbed.testbed.Testbed.pod_log` creates the ``Logs`` object and returns a
:class:`PodLog`, whose :meth:`PodLog.write` appends lines stamped with the current time. Pods
without a ``Logs`` object print nothing (an empty file, set by a cluster-wide default).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kubedl_prefect.errors import TestbedError

#: API group and version of kwok's ``Logs``/``ClusterLogs`` resources.
KWOK_API_VERSION = "kwok.x-k8s.io/v1alpha1"
#: (group, version, plural) of the namespaced ``Logs`` resource.
LOGS_RESOURCE = ("kwok.x-k8s.io", "v1alpha1", "logs")
#: Name of the cluster-wide default (the empty log of every pod without a ``Logs`` object).
DEFAULT_CLUSTER_LOGS = "kubedl-prefect-testbed-default"

Stream = Literal["stdout", "stderr"]


def cri_timestamp(at: dt.datetime | None = None) -> str:
    """``at`` (default: now, to the nanosecond) as the CRI log format writes it: RFC 3339, UTC.

    Raises:
        TestbedError: ``at`` has no time zone.
    """
    if at is None:
        nanos = time.time_ns()
        seconds, fraction = divmod(nanos, 1_000_000_000)
        moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    else:
        if at.tzinfo is None:
            raise TestbedError(f"log time {at.isoformat()} has no time zone")
        moment = at.astimezone(dt.UTC)
        fraction = moment.microsecond * 1000
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{fraction:09d}Z"


def cri_lines(
    texts: tuple[str, ...] | list[str], *, stream: Stream = "stdout", at: dt.datetime | None = None
) -> str:
    """``texts`` as CRI log lines (one per line of text), each stamped ``at`` or now.

    Example:
        >>> import datetime as dt
        >>> when = dt.datetime(2025, 1, 2, 3, 4, 5, 600000, tzinfo=dt.UTC)
        >>> print(cri_lines(["epoch 1", "epoch 2"], at=when), end="")
        2025-01-02T03:04:05.600000000Z stdout F epoch 1
        2025-01-02T03:04:05.600000000Z stdout F epoch 2

    Raises:
        TestbedError: ``stream`` is neither ``stdout`` nor ``stderr``.
    """
    if stream not in ("stdout", "stderr"):
        raise TestbedError(f"a container log stream is stdout or stderr, got {stream!r}")
    out = []
    for text in texts:
        for line in text.split("\n"):
            out.append(f"{cri_timestamp(at)} {stream} F {line}\n")
    return "".join(out)


@dataclass(frozen=True)
class PodLog:
    """The log of one container of one pod, as the API server serves it.

    Attributes:
        namespace: The pod's namespace.
        pod: The pod's name (the pod may not exist yet: names of training-job pods are known
            in advance, e.g. ``<job>-worker-1``).
        container: The container's name.
        path: The CRI-format file kwok reads.
    """

    namespace: str
    pod: str
    container: str
    path: Path

    def write(self, *lines: str, stream: Stream = "stdout", at: dt.datetime | None = None) -> None:
        """Append ``lines`` as the container's output, stamped ``at`` (default: now).

        Each string is one line (embedded newlines make several); a stream that follows the log
        receives them at once.

        Args:
            *lines: The text the container prints.
            stream: ``stdout`` or ``stderr``.
            at: The time to stamp them with (time-zone aware); now by default.
        """
        data = cri_lines(list(lines), stream=stream, at=at).encode()
        # One write on an O_APPEND descriptor: a reader never sees half of a call's lines.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def text(self) -> str:
        """What was written so far, in the CRI format."""
        return self.path.read_text()


def pod_log_path(root: Path, namespace: str, pod: str, container: str) -> Path:
    """Where the log of ``namespace/pod``'s ``container`` lives under ``root``."""
    for part in (namespace, pod, container):
        if not part or "/" in part or part in (".", ".."):
            raise TestbedError(f"not a valid name for a pod log: {part!r}")
    return root / namespace / pod / f"{container}.log"


def previous_path(path: Path) -> Path:
    """The log of the container's previous run, next to ``path`` (empty: none ran before)."""
    return path.with_name(path.stem + ".previous.log")


def logs_manifest(
    namespace: str, pod: str, containers: Mapping[str, Path], default: Path
) -> dict[str, Any]:
    """A kwok ``Logs`` object: ``containers``' files, and ``default`` for any other container.

    Each container also gets a (``previous``) file of its own, which is how the test bed tells
    that kwok has seen the object: kwok answers ``previous=true`` only for containers listed.
    """
    entries: list[dict[str, Any]] = [
        {
            "containers": [name],
            "logsFile": str(path),
            "previousLogsFile": str(previous_path(path)),
            "follow": True,
        }
        for name, path in sorted(containers.items())
    ]
    entries.append({"logsFile": str(default), "follow": True})
    return {
        "apiVersion": KWOK_API_VERSION,
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": entries},
    }


def listed_containers(manifest: Mapping[str, Any]) -> dict[str, Path]:
    """``{container: file}`` of a ``Logs`` object made by :func:`logs_manifest`."""
    found: dict[str, Path] = {}
    for entry in manifest.get("spec", {}).get("logs", []):
        for name in entry.get("containers") or []:
            found[str(name)] = Path(entry["logsFile"])
    return found


def default_cluster_logs(default: Path) -> dict[str, Any]:
    """The kwok ``ClusterLogs`` of every pod without a ``Logs`` object: the empty ``default``."""
    return {
        "apiVersion": KWOK_API_VERSION,
        "kind": "ClusterLogs",
        "metadata": {"name": DEFAULT_CLUSTER_LOGS},
        "spec": {"logs": [{"logsFile": str(default), "follow": True}]},
    }
