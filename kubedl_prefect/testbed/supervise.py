"""Keep a running test bed's operators running, as their Deployments would on a real cluster.

A small detached process per test bed (``python -m kubedl_prefect.testbed.supervise NAME BASE``,
started by :meth:`Testbed.up <kubedl_prefect.testbed.testbed.Testbed.up>`, stopped first by
``down``) polls the operators' pid files once a second. An operator that exited is started again
with the same command line after a back-off that doubles with each crash in a row
(:class:`Backoff`, like a kubelet's ``CrashLoopBackOff``), and the crash is recorded: how many
restarts, when it last crashed, after how long, and the tail of its log. An operator stopped on
purpose (:meth:`Testbed.stop <kubedl_prefect.testbed.testbed.Testbed.stop>`) is left alone until
it is started again. Everything is kept in ``supervisor.json`` in the test bed's folder, which
``testbed status`` reads.

Each round runs under the test bed's lock, so a restart, stop or start through :class:`Testbed`
is never mistaken for a crash. The decisions are the pure function :func:`step`.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import process
from kubedl_prefect.testbed.build import binary_path, is_built
from kubedl_prefect.testbed.components import Component, Layout, Ports
from kubedl_prefect.testbed.launch import start_component
from kubedl_prefect.testbed.operators import OPERATOR_BINARIES, OPERATOR_COMPONENTS

logger = logging.getLogger(__name__)

#: Name of the supervisor's own pid and log files.
SUPERVISOR = "supervisor"

#: Lines of an operator's log kept with its last crash.
CRASH_LOG_LINES = 15


@dataclass(frozen=True)
class Backoff:
    """How long to wait before starting a crashed component again.

    Attributes:
        initial: Delay after the first crash, in seconds.
        cap: The longest delay.
        reset_after: A process that ran this long is healthy again: its next crash starts the
            back-off over.
    """

    initial: float = 1.0
    cap: float = 60.0
    reset_after: float = 120.0

    def delay(self, crashes_in_a_row: int) -> float:
        """The delay after the ``crashes_in_a_row``-th crash in a row (1 for the first).

        Example:
            >>> [Backoff(initial=1, cap=5).delay(n) for n in (1, 2, 3, 4)]
            [1.0, 2.0, 4.0, 5]
        """
        return min(self.cap, self.initial * 2.0 ** max(0, crashes_in_a_row - 1))


@dataclass(frozen=True)
class Crash:
    """The last exit of a supervised component that nobody asked for.

    Attributes:
        at: When it was noticed (seconds since the epoch).
        uptime_s: How long the process had run.
        log_tail: The last lines of its log.
    """

    at: float
    uptime_s: float
    log_tail: str


@dataclass(frozen=True)
class Supervised:
    """What the supervisor knows of one component.

    Attributes:
        restarts: How often it was started again after a crash.
        crashes_in_a_row: Crashes since it last ran for :attr:`Backoff.reset_after`.
        last_crash: Its last crash, if any.
        held: Stopped on purpose (``Testbed.stop``): not restarted until started again.
        restart_at: When it is due to start again (set while it is down after a crash).
    """

    restarts: int = 0
    crashes_in_a_row: int = 0
    last_crash: Crash | None = None
    held: bool = False
    restart_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Supervised:
        """The inverse of :meth:`to_json`."""
        crash = data.get("last_crash")
        return cls(
            restarts=int(data.get("restarts", 0)),
            crashes_in_a_row=int(data.get("crashes_in_a_row", 0)),
            last_crash=Crash(**crash) if isinstance(crash, dict) else None,
            held=bool(data.get("held", False)),
            restart_at=data.get("restart_at"),
        )


def step(
    entry: Supervised,
    *,
    running: process.ProcessRecord | None,
    exited: process.ProcessRecord | None,
    now: float,
    backoff: Backoff,
    log_tail: Callable[[], str],
) -> tuple[Supervised, bool]:
    """One look at one component: its new state, and whether to start it now.

    Args:
        entry: What was known so far.
        running: Its process record when it runs.
        exited: Its last process record when it does not run (``None``: never started).
        now: The current time (seconds since the epoch).
        backoff: The restart back-off.
        log_tail: Reads the tail of its log (called only when a crash is recorded).

    Example:
        >>> down = process.ProcessRecord(pid=7, binary="/bin/x", started_at=100.0)
        >>> entry, start = step(Supervised(), running=None, exited=down, now=110.0,
        ...                     backoff=Backoff(), log_tail=lambda: "panic")
        >>> (entry.crashes_in_a_row, entry.restart_at, start)
        (1, 111.0, False)
        >>> step(entry, running=None, exited=down, now=111.0, backoff=Backoff(),
        ...      log_tail=lambda: "")[1]
        True
    """
    if entry.held:
        return entry, False
    if running is not None:
        if entry.crashes_in_a_row and now - running.started_at >= backoff.reset_after:
            entry = replace(entry, crashes_in_a_row=0)
        return replace(entry, restart_at=None), False
    if exited is None:  # never started: not ours to start
        return entry, False
    if entry.restart_at is None:
        crashes = entry.crashes_in_a_row + 1
        crash = Crash(at=now, uptime_s=max(0.0, now - exited.started_at), log_tail=log_tail())
        due = now + backoff.delay(crashes)
        return replace(entry, crashes_in_a_row=crashes, last_crash=crash, restart_at=due), False
    return entry, now >= entry.restart_at


def state_path(layout: Layout) -> Path:
    """The supervisor's state file of the test bed in ``layout``."""
    return layout.root / "supervisor.json"


def load(layout: Layout) -> dict[str, Supervised]:
    """The supervisor's state of each component (empty when there is none)."""
    try:
        data = json.loads(state_path(layout).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {name: Supervised.from_json(v) for name, v in data.items() if isinstance(v, dict)}


def save(layout: Layout, state: dict[str, Supervised]) -> None:
    """Write ``state`` atomically."""
    path = state_path(layout)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps({k: v.to_json() for k, v in state.items()}, indent=2) + "\n")
    partial.replace(path)


def hold(layout: Layout, component: str, held: bool) -> None:
    """Mark ``component`` as stopped on purpose (or not); the caller holds the test bed's lock."""
    state = load(layout)
    state[component] = replace(state.get(component, Supervised()), held=held, restart_at=None)
    save(layout, state)


@contextmanager
def bed_lock(layout: Layout) -> Iterator[None]:
    """The test bed's lock (the same file :class:`Testbed` locks)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with (layout.root / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _binaries(component: Component, last: process.ProcessRecord) -> dict[str, Path]:
    for binary in OPERATOR_BINARIES:
        if binary.name == component.binary and is_built(binary):
            return {binary.name: binary_path(binary)}
    return {component.binary: Path(last.binary)}


def supervise_once(
    layout: Layout,
    *,
    components: list[Component] | None = None,
    backoff: Backoff | None = None,
    now: Callable[[], float] = time.time,
) -> dict[str, Supervised]:
    """One round over the supervised components (under the test bed's lock); return the state."""
    backoff = backoff or Backoff()
    with bed_lock(layout):
        state = load(layout)
        for component in components or OPERATOR_COMPONENTS:
            record = process.read(layout.pid_file(component.name))
            alive = record is not None and process.is_alive(record)
            log_file = layout.log_file(component.name)
            entry, start = step(
                state.get(component.name, Supervised()),
                running=record if alive else None,
                exited=None if alive else record,
                now=now(),
                backoff=backoff,
                log_tail=functools.partial(process.log_tail, log_file, CRASH_LOG_LINES),
            )
            if start and record is not None:
                logger.warning("%s exited: starting it again", component.name)
                entry = replace(entry, restarts=entry.restarts + 1, restart_at=None)
                # On record before the new process can be seen: whoever reads the status then
                # finds its restart counted too.
                state[component.name] = entry
                save(layout, state)
                try:
                    start_component(layout, component, _binaries(component, record))
                except TestbedError as exc:  # its next round records the crash
                    logger.warning("%s did not start again: %s", component.name, exc)
            state[component.name] = entry
        save(layout, state)
    return state


def supervised_components(layout: Layout) -> list[Component]:
    """The operators, and the process node's agent when the test bed's state says it has one."""
    from kubedl_prefect.testbed.nodeagent.component import AGENT

    try:
        state = json.loads((layout.root / "state.json").read_text())
    except (OSError, ValueError):
        state = {}
    with_agent = isinstance(state, dict) and bool(state.get("process_node"))
    return [*OPERATOR_COMPONENTS, *([AGENT] if with_agent else [])]


def run(layout: Layout, *, interval: float = 1.0) -> None:
    """Supervise until the test bed is down (its ``state.json`` is gone)."""
    logger.info("supervising %s", ", ".join(c.name for c in OPERATOR_COMPONENTS))
    while (layout.root / "state.json").is_file():
        supervise_once(layout, components=supervised_components(layout))
        time.sleep(interval)
    logger.info("test bed %s is down: supervisor exits", layout.name)


def start(layout: Layout) -> process.ProcessRecord:
    """Start the supervisor of the test bed in ``layout``, unless it runs already."""
    pid_file = layout.pid_file(SUPERVISOR)
    record = process.read(pid_file)
    if record is not None and process.is_alive(record):
        return record
    argv = [sys.executable, "-m", __name__, layout.name, str(layout.ports.base)]
    return process.start(argv, log_file=layout.log_file(SUPERVISOR), pid_file=pid_file)


def stop(layout: Layout) -> None:
    """Stop the supervisor of the test bed in ``layout``, if it runs."""
    pid_file = layout.pid_file(SUPERVISOR)
    record = process.read(pid_file)
    if record is not None:
        process.stop(record)
    pid_file.unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    """``python -m kubedl_prefect.testbed.supervise NAME PORT_BASE``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    name, base = argv
    run(Layout(name=name, ports=Ports(base=int(base))))


if __name__ == "__main__":
    main(sys.argv[1:])
