"""Detached component processes: start with a log file and a pid file, check, stop.

Processes are started through ``/bin/sh`` which puts them in the background and exits at once, so
they are not children of the calling Python process (no zombie to reap, no ``Popen`` left behind
when a pytest session or the CLI ends) and live in a session of their own (a Ctrl-C in the shell
that ran ``up`` does not reach them). A pid file records the pid and the binary; a pid counts as
ours only while its command line (``/proc/<pid>/cmdline``) still starts with that binary, so a
recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kubedl_prefect.errors import TestbedError

_LAUNCH = 'log="$1"; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'


@dataclass(frozen=True)
class ProcessRecord:
    """What a pid file holds.

    Attributes:
        pid: Process id.
        binary: Absolute path of the executable that was started.
        started_at: Wall-clock start time (seconds since the epoch).
    """

    pid: int
    binary: str
    started_at: float


def start(
    argv: Sequence[str],
    *,
    log_file: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
) -> ProcessRecord:
    """Start ``argv`` detached, appending its output to ``log_file``; record it in ``pid_file``.

    Raises:
        TestbedError: The process could not be launched.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as log:
        log.write(f"\n==> {time.strftime('%Y-%m-%dT%H:%M:%S%z')} starting: {' '.join(argv)}\n")
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        ["/bin/sh", "-c", _LAUNCH, "sh", str(log_file), *argv],
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=False,
    )
    try:
        pid = int(proc.stdout.strip())
    except ValueError:
        raise TestbedError(
            f"could not start {argv[0]}: {proc.stderr.strip() or 'no pid reported'}"
        ) from None
    record = ProcessRecord(pid=pid, binary=str(argv[0]), started_at=time.time())
    pid_file.write_text(json.dumps(record.__dict__) + "\n")
    return record


def read(pid_file: Path) -> ProcessRecord | None:
    """The record in ``pid_file``, or ``None`` when there is none (or it is unreadable)."""
    try:
        data = json.loads(pid_file.read_text())
        return ProcessRecord(
            pid=int(data["pid"]), binary=str(data["binary"]), started_at=float(data["started_at"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_alive(record: ProcessRecord) -> bool:
    """Whether the recorded process still runs (and is not a zombie, nor a recycled pid)."""
    proc = Path("/proc") / str(record.pid)
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # Field 3 of /proc/<pid>/stat is the state; the command name before it may contain spaces.
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == record.binary


def stop(record: ProcessRecord, *, timeout: float = 15.0) -> None:
    """Stop the process: SIGTERM, then SIGKILL after ``timeout`` seconds. No-op when gone.

    Returns once the process has exited (its sockets are closed), not merely once it started
    exiting.
    """
    if not is_alive(record):
        return
    _signal(record.pid, signal.SIGTERM)
    if _wait_gone(record.pid, timeout):
        return
    _signal(record.pid, signal.SIGKILL)
    _wait_gone(record.pid, 5.0)


def kill(record: ProcessRecord, *, timeout: float = 10.0) -> None:
    """Kill the process at once (SIGKILL, as a crash would) and wait until it has exited.

    No-op when it is gone already.

    Raises:
        TestbedError: It still runs after ``timeout`` seconds (stuck in the kernel).
    """
    if not is_alive(record):
        return
    _signal(record.pid, signal.SIGKILL)
    if not _wait_gone(record.pid, timeout):
        raise TestbedError(f"process {record.pid} ({record.binary}) survived SIGKILL")


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(pid):
            return True
        time.sleep(0.05)
    return False


def _exited(pid: int) -> bool:
    """Whether ``pid`` has finished exiting (gone, or a zombie waiting to be reaped).

    The main thread of a multi-threaded process turns zombie before its other threads are
    done exiting, and those still hold its files and sockets: wait for them too, or a port the
    process listened on may not be free yet.
    """
    proc = Path("/proc") / str(pid)
    try:
        stat = (proc / "stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X"):
            return False
        return len(list((proc / "task").iterdir())) <= 1
    except OSError:
        return True


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def rss_bytes(record: ProcessRecord) -> int:
    """Resident memory of the process in bytes (0 when it is gone)."""
    try:
        for line in (Path("/proc") / str(record.pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return 0


def log_tail(log_file: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file (empty when there is none)."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
