"""Crash one component of a running test bed and start it again: :meth:`Testbed.restart`.

The component gets SIGKILL, as a crash would, and is started again with the same binary, command
line and data, then waited on until healthy. What clients see, per component, is in
docs/testbed.md ("Crashing a component"). Two components need more than a plain relaunch:

- after ``kube-apiserver``, the components talking to it would reconnect only slowly (client-go
  backs off up to a minute), so they are stopped while it is down and started again after it;
- ``kwok`` takes a new identity at each start and would wait 40 s for its nodes' Leases, so those
  are deleted first, as a restarted kubelet simply renews its own.

These functions expect the caller to hold the test bed's lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import cluster, process
from kubedl_prefect.testbed.build import GoBinary, binary_path, is_built
from kubedl_prefect.testbed.components import Component, Layout
from kubedl_prefect.testbed.controlplane import APISERVER, KWOK
from kubedl_prefect.testbed.launch import start_component

logger = logging.getLogger(__name__)


def crash_and_restart(
    layout: Layout,
    target: Component,
    *,
    components: Sequence[Component],
    binaries: Sequence[GoBinary],
    timeout: float,
    dependents: bool,
) -> float:
    """Kill ``target`` (SIGKILL), start it again and wait until healthy; return the downtime.

    Args:
        layout: The test bed.
        target: The component to crash; it must be running.
        components: Every component the test bed may run, in start order (the API server
            first): those running are its dependents.
        binaries: The test bed's binaries, to find the current build of one that was rebuilt
            since the component started.
        timeout: How long each component may take to become healthy again.
        dependents: After the API server, restart the components that talk to it too.

    Returns:
        Seconds from the kill until ``target`` was healthy again (not counting dependents).

    Raises:
        TestbedError: ``target`` is not running, or it or a dependent did not come back (the
            message ends with the tail of its log).
    """
    record = process.read(layout.pid_file(target.name))
    if record is None or not process.is_alive(record):
        raise TestbedError(
            f"{target.name} of test bed {layout.name} is not running",
            hint="start the test bed first (Testbed.up or `kubedl-prefect testbed up`)",
        )
    started = time.monotonic()
    process.kill(record)
    stopped: list[tuple[Component, process.ProcessRecord]] = []
    if target == APISERVER and dependents:
        # Stopped while it is down, so that it starts without their reconnection storm.
        stopped = _stop_running(layout, [c for c in components if c != APISERVER])
    _relaunch(layout, target, record, binaries, timeout=timeout)
    downtime = time.monotonic() - started
    logger.info("%s restarted after %.1fs down", target.name, downtime)
    failed: list[TestbedError] = []
    for dependent, old in stopped:  # all of them, even after one failed
        try:
            _relaunch(layout, dependent, old, binaries, timeout=timeout)
        except TestbedError as exc:
            failed.append(exc)
    if failed:
        raise failed[0]
    return downtime


def binary_of(
    component: Component, record: process.ProcessRecord, binaries: Sequence[GoBinary]
) -> Path:
    """The binary ``record`` ran, or the current build of it when it was rebuilt since.

    Raises:
        TestbedError: The binary is gone and there is no current build of it.
    """
    ran = Path(record.binary)
    if ran.is_file():
        return ran
    for binary in binaries:
        if binary.name == component.binary and is_built(binary):
            logger.warning("%s was rebuilt since it started: running %s", ran, binary_path(binary))
            return binary_path(binary)
    raise TestbedError(
        f"cannot restart {component.name}: its binary {ran} is gone",
        hint="rebuild and restart the test bed (`kubedl-prefect testbed down`, then `up`)",
    )


def _stop_running(
    layout: Layout, components: Sequence[Component]
) -> list[tuple[Component, process.ProcessRecord]]:
    """Stop those of ``components`` that run (last first); return them in start order."""
    stopped = []
    for component in reversed(components):
        record = process.read(layout.pid_file(component.name))
        if record is not None and process.is_alive(record):
            process.stop(record)
            stopped.append((component, record))
    return stopped[::-1]


def _relaunch(
    layout: Layout,
    component: Component,
    record: process.ProcessRecord,
    binaries: Sequence[GoBinary],
    *,
    timeout: float,
) -> None:
    """Start the binary of ``record`` (stopped) again as ``component``; wait until healthy."""
    nodes: list[str] = []
    if component == KWOK:
        # As a restarted kubelet would, take the nodes over at once (see release_node_leases).
        try:
            nodes = cluster.call(layout, cluster.release_node_leases)
        except TestbedError as exc:  # the API server is down: kwok will wait
            logger.warning("kwok may wait 40 s for its nodes' leases: %s", exc)
    path = binary_of(component, record, binaries)
    start_component(layout, component, {component.binary: path}, timeout=timeout)
    if nodes:
        touched = cluster.call(layout, cluster.resync_kwok_pods, nodes, timeout_s=timeout)
        logger.info("kwok holds its nodes again; %d pods shown to it again", touched)
