"""Detached component processes: start with a log file and a pid file, check, stop.

A binary is started directly (``posix_spawn``, no shell in between), in a session of its own (a
Ctrl-C in the shell that ran ``up`` does not reach it), with stdin from ``/dev/null`` and its
output appended to its log. The pid returned is the binary's own from the start. It outlives the
Python process that started it (the CLI, a pytest session): nothing stops it but :func:`stop` or
:func:`kill`. While that process lives, a component that exits is reaped by whoever checks on it
(:func:`is_alive`, :func:`stop`), so no zombie stays behind.

A pid file records the pid, the binary and the process's identity: its start time in clock ticks
since boot (``/proc/<pid>/stat``, field 22) and the boot's id. A pid counts as ours only while
both still match, so a recycled pid is never signalled. Identity is not read from the command
line: a process's ``/proc/<pid>/cmdline`` is that of its parent until it has exec'ed, and even
empty for a moment while it does (the race that made start-up checks report "exited during
start-up" with an empty log).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kubedl_prefect.errors import TestbedError

#: Signals whose disposition a started binary gets back to the default: Python ignores SIGPIPE and
#: SIGXFSZ, and a caller may ignore the others (``nohup``); ignored signals survive an exec.
_DEFAULT_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
)

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class ProcessRecord:
    """What a pid file holds.

    Attributes:
        pid: Process id.
        binary: Absolute path of the executable that was started.
        started_at: Wall-clock start time (seconds since the epoch).
        start_ticks: Start time of the process in clock ticks since boot (``/proc/<pid>/stat``);
            ``None`` in pid files written before it was recorded.
        boot_id: Id of the boot it was started in (``/proc/sys/kernel/random/boot_id``).
    """

    pid: int
    binary: str
    started_at: float
    start_ticks: int | None = None
    boot_id: str | None = None


def start(
    argv: Sequence[str],
    *,
    log_file: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
) -> ProcessRecord:
    """Start ``argv`` detached, appending its output to ``log_file``; record it in ``pid_file``.

    ``argv[0]`` is the path of the binary (it is not looked up on ``PATH``). The process has
    begun executing it when this returns.

    Raises:
        TestbedError: The binary could not be executed (missing, not executable); the reason is
            also appended to the log.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as log:
        log.write(f"\n==> {time.strftime('%Y-%m-%dT%H:%M:%S%z')} starting: {' '.join(argv)}\n")
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    file_actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_file), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    try:
        # The parent is suspended until the child has exec'ed (or failed to: glibc reports the
        # exec's error here), so the pid is the binary's. Only 0-2 are passed on: Python opens
        # every other descriptor non-inheritable.
        pid = os.posix_spawn(
            argv[0],
            list(argv),
            full_env,
            file_actions=file_actions,
            setsid=True,
            setsigdef=_DEFAULT_SIGNALS,
            setsigmask=(),
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        with log_file.open("a") as log:
            log.write(f"cannot execute {argv[0]}: {reason}\n")
        raise TestbedError(
            f"could not start {argv[0]}: {reason}",
            hint="rebuild the test bed's binaries (`kubedl-prefect testbed build`)",
        ) from exc
    # Read before anything could reap it: an unreaped child keeps its /proc entry, even dead.
    stat = _stat(pid)
    record = ProcessRecord(
        pid=pid,
        binary=str(argv[0]),
        started_at=time.time(),
        start_ticks=stat[1] if stat else None,
        boot_id=_boot_id(),
    )
    pid_file.write_text(json.dumps(asdict(record)) + "\n")
    return record


def read(pid_file: Path) -> ProcessRecord | None:
    """The record in ``pid_file``, or ``None`` when there is none (or it is unreadable)."""
    try:
        data = json.loads(pid_file.read_text())
        ticks = data.get("start_ticks")
        boot_id = data.get("boot_id")
        return ProcessRecord(
            pid=int(data["pid"]),
            binary=str(data["binary"]),
            started_at=float(data["started_at"]),
            start_ticks=None if ticks is None else int(ticks),
            boot_id=None if boot_id is None else str(boot_id),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def is_alive(record: ProcessRecord) -> bool:
    """Whether the recorded process still runs (and is not a zombie, nor a recycled pid).

    Also true before the process has exec'ed its binary. A dead child of this process is reaped.
    """
    stat = _stat(record.pid)
    if stat is None:
        return False
    state, ticks = stat
    if state in ("Z", "X"):
        _reap(record.pid)
        return False
    if record.start_ticks is not None:
        return ticks == record.start_ticks and record.boot_id in (None, _boot_id())
    # A pid file without the start time (written by an older kubedl-prefect, long after the
    # exec): the command line is the binary's.
    try:
        cmdline = (Path("/proc") / str(record.pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return cmdline[0].decode(errors="replace") == record.binary


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


def _stat(pid: int) -> tuple[str, int] | None:
    """State (field 3) and start time in clock ticks (field 22) of ``pid``; ``None`` if gone."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2, in parentheses) may contain spaces and parentheses.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def _reap(pid: int) -> bool:
    """Reap ``pid`` if it is a child of ours that has exited; whether it was."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (or reaped already)
        return False
    return done == pid


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(pid):
            return True
        time.sleep(0.05)
    return False


def _exited(pid: int) -> bool:
    """Whether ``pid`` has finished exiting (gone, reaped, or a zombie waiting to be reaped).

    The main thread of a multi-threaded process turns zombie before its other threads are
    done exiting, and those still hold its files and sockets: wait for them too, or a port the
    process listened on may not be free yet. (A child of ours is reaped only once they are all
    done.)
    """
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: see /proc
    else:
        return done == pid
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
