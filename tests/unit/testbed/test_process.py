"""Detached processes: pid files, liveness that survives pid reuse, ordered stop."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from kubedl_prefect.testbed import process
from kubedl_prefect.testbed.process import ProcessRecord

SLEEP = shutil.which("sleep") or "/bin/sleep"
SH = shutil.which("sh") or "/bin/sh"


def _wait_dead(record: ProcessRecord, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.is_alive(record):
            return True
        time.sleep(0.05)
    return False


def test_start_detaches_records_and_stops(tmp_path: Path) -> None:
    log, pid_file = tmp_path / "logs" / "x.log", tmp_path / "run" / "x.pid"
    record = process.start([SLEEP, "30"], log_file=log, pid_file=pid_file, env={"A": "1"})
    try:
        assert process.is_alive(record)
        assert process.read(pid_file) == record
        with pytest.raises(ChildProcessError):  # not our child: nothing to reap
            os.waitpid(record.pid, os.WNOHANG)
        assert os.getsid(record.pid) != os.getsid(0)  # its own session
        assert process.rss_bytes(record) > 0
        assert f"starting: {SLEEP} 30" in log.read_text()
    finally:
        process.stop(record, timeout=5)
    assert not process.is_alive(record)
    assert process.rss_bytes(record) == 0


def test_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    record = process.start([SLEEP, "30"], log_file=tmp_path / "x.log", pid_file=tmp_path / "x.pid")
    try:
        impostor = ProcessRecord(record.pid, "/usr/bin/something-else", record.started_at)
        assert not process.is_alive(impostor)
        process.stop(impostor)  # must not signal the sleeper
        assert process.is_alive(record)
    finally:
        process.stop(record, timeout=5)


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    record = process.start(
        [SH, "-c", "trap '' TERM; sleep 30"], log_file=tmp_path / "x.log", pid_file=tmp_path / "p"
    )
    time.sleep(0.2)  # let the trap be installed
    started = time.monotonic()
    process.stop(record, timeout=0.5)
    assert not process.is_alive(record)
    assert time.monotonic() - started < 5


def test_a_binary_that_cannot_run_dies_with_its_reason_logged(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    record = process.start(
        [str(tmp_path / "missing-binary")], log_file=log, pid_file=tmp_path / "p"
    )
    assert _wait_dead(record)
    assert "missing-binary" in process.log_tail(log)


def test_unreadable_pid_files_read_as_none(tmp_path: Path) -> None:
    assert process.read(tmp_path / "absent.pid") is None
    (tmp_path / "bad.pid").write_text("not json")
    assert process.read(tmp_path / "bad.pid") is None
    assert process.log_tail(tmp_path / "absent.log") == ""


def test_kill_ends_a_process_at_once_even_if_it_ignores_sigterm(tmp_path: Path) -> None:
    record = process.start(
        [SH, "-c", "trap '' TERM; sleep 30"], log_file=tmp_path / "x.log", pid_file=tmp_path / "p"
    )
    time.sleep(0.2)
    started = time.monotonic()
    process.kill(record)
    assert not process.is_alive(record)
    assert time.monotonic() - started < 2
    process.kill(record)  # gone already: nothing to do


def test_a_killed_multithreaded_server_has_released_its_port(tmp_path: Path) -> None:
    # The main thread turns zombie before the others are done: kill() waits for them, so the
    # port is free for the restarted process.
    script = tmp_path / "server.py"
    script.write_text(
        "import socket, sys, threading, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "open(sys.argv[1], 'w').write(str(s.getsockname()[1]))\n"
        "for _ in range(8): threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "time.sleep(60)\n"
    )
    port_file = tmp_path / "port"
    record = process.start(
        [sys.executable, str(script), str(port_file)],
        log_file=tmp_path / "x.log",
        pid_file=tmp_path / "p",
    )
    deadline = time.monotonic() + 10
    while not port_file.is_file() or not port_file.read_text():
        assert time.monotonic() < deadline, process.log_tail(tmp_path / "x.log")
        time.sleep(0.05)
    port = int(port_file.read_text())
    process.kill(record)
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # no EADDRINUSE
