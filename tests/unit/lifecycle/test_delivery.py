"""Callbacks run in order on a thread of their own, never on the caller's or the runtime loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kubedl_prefect.kube.delivery import CallbackThread, delivered


async def test_calls_run_in_order_on_another_thread_and_are_all_done_on_exit() -> None:
    seen: list[tuple[int, str]] = []
    async with delivered(lambda n: seen.append((n, threading.current_thread().name)), "t") as cb:
        assert cb is not None
        for n in range(100):
            cb(n)
    assert [n for n, _ in seen] == list(range(100))
    assert {name for _, name in seen} == {"t"}


async def test_a_blocking_callback_does_not_block_the_loop() -> None:
    async with delivered(lambda _: time.sleep(0.5), "slow") as cb:
        assert cb is not None
        started = time.monotonic()
        cb(1)
        await asyncio.sleep(0.01)
        assert time.monotonic() - started < 0.2


async def test_a_raising_callback_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[int] = []

    def callback(n: int) -> None:
        if n == 1:
            raise RuntimeError("boom")
        seen.append(n)

    async with delivered(callback, "raises") as cb:
        assert cb is not None
        for n in range(3):
            cb(n)
    assert seen == [0, 2]
    assert "boom" in caplog.text


async def test_none_stays_none_and_an_unused_thread_is_never_started() -> None:
    async with delivered(None, "none") as cb:
        assert cb is None
    thread = CallbackThread(print)
    await thread.drain()
    assert thread.delivered == 0


def test_a_drain_given_up_before_its_loop_closed_still_delivers_all_and_raises_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A wait cancelled (or a process's loop closed) while its callback thread is still busy:
    # the thread must deliver every queued item and end quietly, not die with "Event loop is
    # closed" when it tells the drainer's closed loop it is done.
    errors: list[object] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    release = threading.Event()
    seen: list[int] = []

    def callback(n: int) -> None:
        release.wait(10)
        seen.append(n)

    thread: CallbackThread[int] = CallbackThread(callback, "given-up")

    async def drain_then_give_up() -> None:
        for n in range(3):
            thread(n)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(thread.drain(), 0.2)

    asyncio.run(drain_then_give_up())  # its loop is closed now; the thread is still busy
    (worker,) = [t for t in threading.enumerate() if t.name == "given-up"]
    release.set()
    worker.join(10)
    assert not worker.is_alive()
    assert seen == [0, 1, 2]
    assert errors == []
