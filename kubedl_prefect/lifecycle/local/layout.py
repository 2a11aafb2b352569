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

The workspace is private and taken literally: folders are created ``0700`` and files ``0600``;
a symbolic link where a folder or file of a job is expected is refused, never followed; a job
name is a DNS-1123 label (no ``/``, no ``.`` or ``..``) and a workspace an absolute path without
``.``, ``..`` or symbolic links, so that whatever a reference or a file names stays inside it. A
process named in ``state.json`` is signalled only when it is verifiably the job's
(:func:`job_process`): the same start time, and the job's marker in its environment.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final

import psutil

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.lifecycle.local.state import ProcessIdentity

JOB_FILE: Final = "job.json"
STATE_FILE: Final = "state.json"
SUPERVISOR_LOG: Final = "supervisor.log"
LOG_DIR: Final = "logs"
NEW_PREFIX: Final = ".new-"

MAX_LINE_BYTES: Final = 1 << 20
"""Longest log line kept whole; a longer one is cut into lines of this size."""

JOB_MARKER_ENV: Final = "KUBEDL_PREFECT_LOCAL_JOB"
"""Set to the job's uid in the environment of its supervisor and of every replica: what tells
a process of the job apart from any other process (see :func:`job_process`)."""

JOB_NAME_PATTERN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""A local job's name: a DNS-1123 label (matched whole), at most :data:`JOB_NAME_MAX` long."""

JOB_NAME_MAX: Final = 63

_PRIVATE_DIR: Final = 0o700
_PRIVATE_FILE: Final = 0o600
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


def check_job_name(name: str) -> str:
    """``name`` if it is a valid local job name (a DNS-1123 label); else refuse it.

    Example:
        >>> check_job_name("mnist-siru7c5qacsk-a1")
        'mnist-siru7c5qacsk-a1'
        >>> check_job_name("../../victim")
        Traceback (most recent call last):
        ...
        kubedl_prefect.errors.KubeDLPrefectError: '../../victim' is not a valid ...
    """
    if len(name) > JOB_NAME_MAX or JOB_NAME_PATTERN.fullmatch(name) is None:
        raise KubeDLPrefectError(
            f"{name!r} is not a valid local job name (a DNS-1123 label of at most "
            f"{JOB_NAME_MAX} characters)",
            hint="use the reference the backend returned; job names are <spec>-<key hash>-a<N>",
        )
    return name


def check_workspace(workspace: str) -> Path:
    """``workspace`` as a path if it is absolute, plain and free of symbolic links.

    Plain: no ``.`` or ``..`` segment, no doubled or trailing ``/``, no NUL. The backend resolves
    its workspace once, so every reference it makes passes.

    Raises:
        KubeDLPrefectError: It is not.
    """
    if (
        "\0" in workspace
        or not os.path.isabs(workspace)
        or os.path.normpath(workspace) != workspace
    ):
        raise KubeDLPrefectError(
            f"the workspace {workspace!r} of the reference is not a plain absolute path",
            hint="use the reference the backend returned (its namespace is the workspace)",
        )
    path = Path(workspace)
    if path.resolve() != path:
        raise KubeDLPrefectError(
            f"the workspace {workspace} goes through a symbolic link (it resolves to "
            f"{path.resolve()})",
            hint="use the resolved path of the workspace",
        )
    return path


def jobs_dir(workspace: str | Path) -> Path:
    """The directory of every job of the workspace."""
    return Path(workspace) / "jobs"


def job_dir(workspace: str | Path, name: str) -> Path:
    """The directory of the job ``name`` (checked with :func:`check_job_name`)."""
    return jobs_dir(workspace) / check_job_name(name)


def record_path(workspace: str | Path, name: str) -> Path:
    """The file of the run record called ``name``."""
    return Path(workspace) / "records" / f"{name}.json"


def check_no_link(path: Path, what: str = "folder") -> None:
    """Refuse ``path`` if it is a symbolic link (it may not exist)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise KubeDLPrefectError(
            f"{path} is a symbolic link where a {what} of the local workspace is expected: "
            "refusing to follow it",
            hint="someone planted it: remove the link (and check what it points to)",
        )


def check_inside(path: Path, root: Path) -> Path:
    """``path`` if it is ``root`` or below it with no symbolic link on the way; else refuse."""
    for part in (path, *path.parents):
        if part == root or not part.is_relative_to(root):
            break
        check_no_link(part)
    check_no_link(root)
    if not path.resolve().is_relative_to(root.resolve()):
        raise KubeDLPrefectError(
            f"{path} resolves outside the local workspace folder {root}",
            hint="remove what redirects it (a symbolic link)",
        )
    return path


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) ``0700``; refuse a link or a folder of another user.

    An existing folder is used as it is, if it is a real folder of this user.
    """
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, _PRIVATE_DIR)
    check_no_link(path)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise KubeDLPrefectError(
            f"{path} is not a folder, where a folder of the local workspace is expected",
            hint="remove it, or choose another workspace",
        )
    if info.st_uid != os.getuid():
        raise KubeDLPrefectError(
            f"{path} belongs to another user (uid {info.st_uid})",
            hint="choose a workspace (and TMPDIR) of your own",
        )
    return path


def _open(path: Path, flags: int, mode: int = _PRIVATE_FILE) -> int:
    """``os.open`` that never follows a symbolic link at ``path``."""
    try:
        return os.open(path, flags | _NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and os.path.islink(path)):
            check_no_link(path, "file")
        raise


def open_private(path: Path, *, append: bool = False) -> IO[bytes]:
    """``path`` opened to write (truncated) or ``append`` to, created ``0600``, never a link."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(_open(path, flags), "ab" if append else "wb")


def open_read(path: Path) -> IO[bytes]:
    """``path`` opened to read, refused if it is a symbolic link (``FileNotFoundError``...)."""
    return os.fdopen(_open(path, os.O_RDONLY), "rb")


def log_path(directory: Path, replica: str) -> Path:
    """The log file of one replica of the job in ``directory``."""
    return directory / LOG_DIR / f"{replica}.log"


def socket_path(directory: str | Path, uid: str) -> str:
    """Where the supervisor of the job in ``directory`` (of ``uid``) listens for watchers."""
    digest = hashlib.sha256(f"{directory}\0{uid}".encode()).hexdigest()[:24]
    return str(Path(tempfile.gettempdir()) / f"kubedl-prefect-{os.getuid()}" / f"{digest}.sock")


def checked_socket(directory: str | Path, uid: str, recorded: str) -> str:
    """``recorded``, the socket ``job.json`` names, if it is the one :func:`socket_path` gives.

    The temporary folder may differ between processes; the socket's own name (a digest of the
    job's folder and uid) and its folder's name may not.

    Raises:
        KubeDLPrefectError: ``recorded`` is another path (``job.json`` was changed).
    """
    path, expected = Path(recorded), Path(socket_path(directory, uid))
    if not path.is_absolute() or (path.parent.name, path.name) != (
        expected.parent.name,
        expected.name,
    ):
        raise KubeDLPrefectError(
            f"the wake-up socket {recorded!r} in {Path(directory) / JOB_FILE} is not the job's "
            f"(expected .../{expected.parent.name}/{expected.name})",
            hint="the file was changed by someone else: remove the job's folder by hand",
        )
    return recorded


def remove_socket(path: str | Path) -> None:
    """Remove the Unix socket at ``path``, if that is what is there (nothing else is touched)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def write_json(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically (a new ``0600`` file renamed over it).

    The rename replaces a symbolic link at ``path`` itself; nothing is written through one.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.unlink(missing_ok=True)  # left by a writer of the same pid that died; a link goes too
    with os.fdopen(_open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w", encoding="utf-8") as out:
        json.dump(data, out, sort_keys=True)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON content of ``path`` (``FileNotFoundError`` when it is not there).

    Raises:
        KubeDLPrefectError: ``path`` is a symbolic link.
    """
    with open_read(path) as file:
        return json.load(file)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) across processes and threads."""
    private_dir(path.parent)
    with os.fdopen(_open(path, os.O_RDWR | os.O_CREAT), "rb+") as handle:
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


def job_process(who: ProcessIdentity | None, uid: str) -> psutil.Process | None:
    """The process ``who`` names if it still runs and is verifiably of the job ``uid``.

    ``None`` when it is gone (or its pid now names a later process). A process that has the
    recorded pid and start time but not the job's marker (:data:`JOB_MARKER_ENV`) is refused:
    ``state.json`` was forged or the process cannot be inspected, and it is not signalled.

    Raises:
        KubeDLPrefectError: The process is not verifiably the job's.
    """
    process = process_of(who)
    if process is None or who is None:
        return None
    try:
        marker = process.environ().get(JOB_MARKER_ENV)
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        marker = None
    if not uid or marker != uid:
        raise KubeDLPrefectError(
            f"pid {who.pid}, named in the job's state.json, is not a process of this job (it "
            f"does not carry {JOB_MARKER_ENV}={uid or '?'}): refusing to signal it",
            hint="the job's state.json was changed by someone else: check the process with ps "
            "and remove the job's folder by hand",
        )
    return process


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
