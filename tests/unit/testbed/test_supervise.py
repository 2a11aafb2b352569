"""The operators' supervisor: back-off, crash records, held components, and real restarts."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.testbed import process, supervise
from kubedl_prefect.testbed.cli import _format_status
from kubedl_prefect.testbed.components import Component, ComponentContext, Layout, Ports
from kubedl_prefect.testbed.supervise import Backoff, Crash, Supervised, step
from kubedl_prefect.testbed.testbed import Testbed

RECORD = process.ProcessRecord(pid=4242, binary="/bin/true", started_at=1000.0)


def no_tail() -> str:
    raise AssertionError("the log is read only when a crash is recorded")


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(initial=2, cap=30)
    assert [backoff.delay(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    assert backoff.delay(0) == 2


def test_a_crash_is_recorded_once_then_restarted_when_due() -> None:
    backoff = Backoff(initial=4, cap=60)
    entry, start = step(
        Supervised(), running=None, exited=RECORD, now=1010.0, backoff=backoff, log_tail=lambda: "x"
    )
    assert not start
    assert entry.crashes_in_a_row == 1
    assert entry.restart_at == 1014.0
    assert entry.last_crash == Crash(at=1010.0, uptime_s=10.0, log_tail="x")
    waiting, start = step(
        entry, running=None, exited=RECORD, now=1013.9, backoff=backoff, log_tail=no_tail
    )
    assert (waiting, start) == (entry, False)
    _, start = step(
        entry, running=None, exited=RECORD, now=1014.0, backoff=backoff, log_tail=no_tail
    )
    assert start
    # It crashes again at once: the next delay doubles.
    again = Supervised(restarts=1, crashes_in_a_row=1, last_crash=entry.last_crash)
    entry, _ = step(
        again, running=None, exited=RECORD, now=1020.0, backoff=backoff, log_tail=lambda: "y"
    )
    assert (entry.crashes_in_a_row, entry.restart_at) == (2, 1028.0)


def test_running_long_enough_resets_the_backoff_and_keeps_the_history() -> None:
    backoff = Backoff(reset_after=60)
    crashed = Supervised(restarts=3, crashes_in_a_row=3, last_crash=Crash(1.0, 2.0, "z"))
    short, _ = step(
        crashed, running=RECORD, exited=None, now=1059.0, backoff=backoff, log_tail=no_tail
    )
    assert short.crashes_in_a_row == 3
    long, start = step(
        crashed, running=RECORD, exited=None, now=1060.0, backoff=backoff, log_tail=no_tail
    )
    assert not start
    assert (long.crashes_in_a_row, long.restarts, long.last_crash) == (0, 3, crashed.last_crash)


def test_held_and_never_started_components_are_left_alone() -> None:
    held = Supervised(held=True)
    assert step(
        held, running=None, exited=RECORD, now=2e9, backoff=Backoff(), log_tail=no_tail
    ) == (
        held,
        False,
    )
    fresh = Supervised()
    assert step(fresh, running=None, exited=None, now=2e9, backoff=Backoff(), log_tail=no_tail) == (
        fresh,
        False,
    )


def test_state_round_trips_through_its_file(cache: Path) -> None:
    layout = Layout(name="sup", ports=Ports(29700))
    assert supervise.load(layout) == {}
    layout.root.mkdir(parents=True)
    state = {
        "a": Supervised(restarts=2, crashes_in_a_row=1, last_crash=Crash(5.0, 1.5, "boom\n")),
        "b": Supervised(held=True, restart_at=9.0),
    }
    supervise.save(layout, state)
    assert supervise.load(layout) == state
    supervise.hold(layout, "b", False)
    supervise.hold(layout, "c", True)
    loaded = supervise.load(layout)
    assert loaded["b"] == Supervised()
    assert loaded["c"] == Supervised(held=True)
    supervise.state_path(layout).write_text("not json")
    assert supervise.load(layout) == {}


def _sleeper(ctx: ComponentContext) -> list[str]:
    return ["300"]


SLEEPER = Component(name="sleeper", binary="sleep", args=_sleeper)


@pytest.fixture
def sleeper_layout(cache: Path) -> Iterator[Layout]:
    layout = Layout(name="sup", ports=Ports(29700))
    yield layout
    record = process.read(layout.pid_file(SLEEPER.name))
    if record is not None:
        process.kill(record)


def test_a_killed_process_is_started_again_and_the_crash_recorded(sleeper_layout: Layout) -> None:
    layout = sleeper_layout
    first = process.start(
        ["/bin/sleep", "300"],
        log_file=layout.log_file(SLEEPER.name),
        pid_file=layout.pid_file(SLEEPER.name),
    )
    backoff = Backoff(initial=0.2)
    state = supervise.supervise_once(layout, components=[SLEEPER], backoff=backoff)
    assert state[SLEEPER.name] == Supervised()
    os.kill(first.pid, signal.SIGKILL)
    process.kill(first)  # reaps it: we are its parent here
    state = supervise.supervise_once(layout, components=[SLEEPER], backoff=backoff)
    entry = state[SLEEPER.name]
    assert entry.crashes_in_a_row == 1
    assert entry.restarts == 0
    assert entry.last_crash is not None
    assert "starting: /bin/sleep 300" in entry.last_crash.log_tail
    time.sleep(0.25)
    state = supervise.supervise_once(layout, components=[SLEEPER], backoff=backoff)
    assert state[SLEEPER.name].restarts == 1
    second = process.read(layout.pid_file(SLEEPER.name))
    assert second is not None
    assert second.pid != first.pid
    assert process.is_alive(second)
    assert supervise.load(layout)[SLEEPER.name].restarts == 1
    # Held: killed or not, it stays down.
    supervise.hold(layout, SLEEPER.name, True)
    process.kill(second)
    for _ in range(2):
        state = supervise.supervise_once(layout, components=[SLEEPER], backoff=backoff)
    assert state[SLEEPER.name].held
    assert state[SLEEPER.name].restarts == 1
    after = process.read(layout.pid_file(SLEEPER.name))
    assert after is not None
    assert after.pid == second.pid
    assert not process.is_alive(after)


def test_status_shows_restarts_held_operators_and_the_last_crash(cache: Path) -> None:
    bed = Testbed("sup", ports=Ports(29700))
    bed.layout.root.mkdir(parents=True)
    (bed.layout.root / "state.json").write_text('{"operators": true}')
    supervise.save(
        bed.layout,
        {
            "kubedl-operator": Supervised(
                restarts=3, last_crash=Crash(0.0, 2.0, "line 1\npanic: nil pointer\n")
            ),
            "training-operator": Supervised(held=True),
        },
    )
    state = bed.status()
    kubedl = next(c for c in state.components if c.name == "kubedl-operator")
    assert (kubedl.restarts, kubedl.running) == (3, False)
    assert kubedl.last_crash is not None
    text = _format_status(state)
    assert "RESTARTS" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("kubedl-operator"))
    assert row.split()[1:4] == ["-", "stopped", "-"]
    assert row.split()[4] == "3"
    held = next(line for line in text.splitlines() if line.strip().startswith("training-op"))
    assert held.split()[2] == "held"
    assert "last crash of kubedl-operator" in text
    assert "| panic: nil pointer" in text


def test_a_restart_is_on_record_before_the_new_process_can_be_seen(
    sleeper_layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader (``testbed status``) that sees the new process must also see its restart: the
    # integration test read restarts=0 beside a new, healthy pid while another operator of the
    # same round was still starting.
    layout = sleeper_layout
    first = process.start(
        ["/bin/sleep", "300"],
        log_file=layout.log_file(SLEEPER.name),
        pid_file=layout.pid_file(SLEEPER.name),
    )
    backoff = Backoff(initial=0.0)
    supervise.supervise_once(layout, components=[SLEEPER], backoff=backoff)
    process.kill(first)
    supervise.supervise_once(layout, components=[SLEEPER], backoff=backoff)  # the crash
    seen_while_starting: list[int] = []
    real_start = supervise.start_component

    def start_and_look(*args: Any, **kwargs: Any) -> Any:
        seen_while_starting.append(supervise.load(layout)[SLEEPER.name].restarts)
        return real_start(*args, **kwargs)

    monkeypatch.setattr(supervise, "start_component", start_and_look)
    state = supervise.supervise_once(layout, components=[SLEEPER], backoff=backoff)
    assert state[SLEEPER.name].restarts == 1
    assert seen_while_starting == [1]
