"""Detached processes: pid files, liveness that survives pid reuse, ordered stop."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubedl_prefect.errors import TestbedError
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


def _environ_after_exec(pid: int) -> list[bytes]:
    """``/proc/<pid>/environ``, once the exec has set it up (empty for a moment during it)."""
    deadline = time.monotonic() + 10
    while not (environ := Path(f"/proc/{pid}/environ").read_bytes()):
        assert time.monotonic() < deadline, "the process never got its environment"
        time.sleep(0.01)
    return environ.split(b"\0")


def test_start_detaches_records_and_stops(tmp_path: Path) -> None:
    log, pid_file = tmp_path / "logs" / "x.log", tmp_path / "run" / "x.pid"
    record = process.start([SLEEP, "30"], log_file=log, pid_file=pid_file, env={"A": "1"})
    try:
        assert process.is_alive(record)
        assert process.read(pid_file) == record
        assert record.start_ticks is not None
        assert record.boot_id
        # The binary itself, not a shell around it.
        assert Path(f"/proc/{record.pid}/exe").resolve() == Path(SLEEP).resolve()
        assert os.getsid(record.pid) == record.pid != os.getsid(0)  # its own session
        assert b"A=1" in _environ_after_exec(record.pid)
        assert process.rss_bytes(record) > 0
        assert f"starting: {SLEEP} 30" in log.read_text()
    finally:
        process.stop(record, timeout=5)
    assert not process.is_alive(record)
    assert process.rss_bytes(record) == 0
    with pytest.raises(ChildProcessError):  # reaped by stop: no zombie left
        os.waitpid(record.pid, os.WNOHANG)


def test_a_started_process_outlives_the_python_process_that_started_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "x.pid"
    launcher = (
        "import sys\n"
        "from pathlib import Path\n"
        "from kubedl_prefect.testbed import process\n"
        f"process.start([{SLEEP!r}, '30'], log_file=Path(sys.argv[1]),"
        " pid_file=Path(sys.argv[2]))\n"
    )
    subprocess.run(
        [sys.executable, "-c", launcher, str(tmp_path / "x.log"), str(pid_file)],
        check=True,
        timeout=30,
    )
    record = process.read(pid_file)
    assert record is not None
    try:
        assert process.is_alive(record)  # its parent has exited
        with pytest.raises(ChildProcessError):
            os.waitpid(record.pid, os.WNOHANG)  # and it is not ours either
    finally:
        process.stop(record, timeout=5)
    assert not process.is_alive(record)


def test_a_dead_child_is_reaped_when_checked(tmp_path: Path) -> None:
    record = process.start(
        [SH, "-c", "exit 3"], log_file=tmp_path / "x.log", pid_file=tmp_path / "p"
    )
    assert _wait_dead(record)
    assert not Path(f"/proc/{record.pid}").exists()  # no zombie: is_alive reaped it


def test_a_process_that_delays_its_exec_is_alive_from_the_start(tmp_path: Path) -> None:
    # The start-up race: is_alive, called before the process has exec'ed its binary, must not
    # take it for dead. Its command line is not the binary's yet (here: the shell's, for
    # half a second), so identity cannot come from the command line.
    script = tmp_path / "delayed-exec"
    script.write_text(f"#!{SH}\nsleep 0.5\nexec {SLEEP} 30\n")
    script.chmod(0o755)
    record = process.start([str(script)], log_file=tmp_path / "x.log", pid_file=tmp_path / "p")
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].decode() != str(script)  # not (yet) the binary's command line
        assert process.is_alive(record)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{record.pid}/exe").resolve() != Path(SLEEP).resolve():
            assert time.monotonic() < deadline
            assert process.is_alive(record)
            time.sleep(0.02)
        assert process.is_alive(record)  # after the exec: the same process
    finally:
        process.stop(record, timeout=5)
    assert not process.is_alive(record)


def test_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    record = process.start([SLEEP, "30"], log_file=tmp_path / "x.log", pid_file=tmp_path / "x.pid")
    try:
        # The same pid, started at another time (or in another boot): another process.
        for impostor in (
            dataclasses.replace(record, start_ticks=(record.start_ticks or 0) - 1),
            dataclasses.replace(record, boot_id="another-boot"),
        ):
            assert not process.is_alive(impostor)
            process.stop(impostor)  # must not signal the sleeper
            process.kill(impostor)
        assert process.is_alive(record)
    finally:
        process.stop(record, timeout=5)


def test_pid_files_without_a_start_time_are_checked_by_command_line(tmp_path: Path) -> None:
    # As written by earlier versions, for processes that still run.
    record = process.start([SLEEP, "30"], log_file=tmp_path / "x.log", pid_file=tmp_path / "x.pid")
    try:
        legacy = tmp_path / "legacy.pid"
        legacy.write_text(
            json.dumps({"pid": record.pid, "binary": SLEEP, "started_at": record.started_at})
        )
        old = process.read(legacy)
        assert old == ProcessRecord(record.pid, SLEEP, record.started_at)
        assert process.is_alive(old)
        assert not process.is_alive(ProcessRecord(record.pid, "/usr/bin/other", 0.0))
    finally:
        process.stop(record, timeout=5)
    assert not process.is_alive(old)


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    record = process.start(
        [SH, "-c", "trap '' TERM; sleep 30"], log_file=tmp_path / "x.log", pid_file=tmp_path / "p"
    )
    time.sleep(0.2)  # let the trap be installed
    started = time.monotonic()
    process.stop(record, timeout=0.5)
    assert not process.is_alive(record)
    assert time.monotonic() - started < 5


def test_a_binary_that_cannot_run_is_refused_with_its_reason_logged(tmp_path: Path) -> None:
    log, pid_file = tmp_path / "x.log", tmp_path / "p"
    with pytest.raises(TestbedError, match=r"could not start .*missing-binary: No such file"):
        process.start([str(tmp_path / "missing-binary")], log_file=log, pid_file=pid_file)
    assert "missing-binary: No such file or directory" in process.log_tail(log)
    assert not pid_file.exists()


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
