"""The files of a local workspace, read and written the same way by the backend and supervisors.

::

    <workspace>/
      jobs/<job name>/           one directory per attempt (the local job object)
        job.json                 what the job is (JobDocument), written once
        state.json               how it is doing (JobState), rewritten by its supervisor
        supervisor.log           the supervisor's own errors, if any
        logs/<replica>.log       each replica's output, one "<RFC 3339 time> <text>" per line
      jobs/.new-<uid>/           a job being created (renamed into place by its supervisor)
      records/<name>-<key hash>.json   the run record of each logical job (records.RunRecord)
      checkpoints/<name>-<digest>/     checkpoints of jobs whose location is not a file:// URI

Every JSON file is replaced atomically (written aside, then renamed), so a reader sees the old
content or the new, never half of it. A job's wake-up socket lives under the temporary directory,
whose path is short enough for a Unix socket wherever the workspace is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psutil

from kubedl_prefect.lifecycle.local.state import ProcessIdentity

JOB_FILE: Final = "job.json"
STATE_FILE: Final = "state.json"
SUPERVISOR_LOG: Final = "supervisor.log"
LOG_DIR: Final = "logs"
NEW_PREFIX: Final = ".new-"

MAX_LINE_BYTES: Final = 1 << 20
"""Longest log line kept whole; a longer one is cut into lines of this size."""


def jobs_dir(workspace: str | Path) -> Path:
    """The directory of every job of the workspace."""
    return Path(workspace) / "jobs"


def job_dir(workspace: str | Path, name: str) -> Path:
    """The directory of the job ``name``."""
    return jobs_dir(workspace) / name


def record_path(workspace: str | Path, name: str) -> Path:
    """The file of the run record called ``name``."""
    return Path(workspace) / "records" / f"{name}.json"


def log_path(directory: Path, replica: str) -> Path:
    """The log file of one replica of the job in ``directory``."""
    return directory / LOG_DIR / f"{replica}.log"


def socket_path(directory: str | Path, uid: str) -> str:
    """Where the supervisor of the job in ``directory`` (of ``uid``) listens for watchers."""
    digest = hashlib.sha256(f"{directory}\0{uid}".encode()).hexdigest()[:24]
    return str(Path(tempfile.gettempdir()) / f"kubedl-prefect-{os.getuid()}" / f"{digest}.sock")


def write_json(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(data, out, sort_keys=True)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON content of ``path`` (``FileNotFoundError`` when it is not there)."""
    with open(path, encoding="utf-8") as file:
        return json.load(file)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) across processes and threads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def identity(pid: int) -> ProcessIdentity | None:
    """The identity of the running process ``pid``, ``None`` if there is none."""
    try:
        return ProcessIdentity(pid, psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def process_of(who: ProcessIdentity | None) -> psutil.Process | None:
    """The process ``who`` names if it still runs (not a later one with its pid, not a zombie)."""
    if who is None:
        return None
    try:
        process = psutil.Process(who.pid)
        if abs(process.create_time() - who.create_time) > 0.01:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return process


def format_log_line(timestamp: str, text: bytes) -> bytes:
    """One line of a replica log file."""
    return timestamp.encode() + b" " + text.rstrip(b"\r") + b"\n"


def parse_log_line(line: bytes) -> tuple[str, str]:
    """``(timestamp, text)`` of one line of a replica log file (without its newline)."""
    stamp, _, text = line.rstrip(b"\n").partition(b" ")
    return stamp.decode("ascii", "replace"), text.decode("utf-8", "replace")
