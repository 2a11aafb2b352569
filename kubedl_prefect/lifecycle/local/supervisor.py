"""The supervisor of one local job: what the operator and the kubelet do on a cluster.

:class:`~.backend.LocalBackend` starts one per job attempt as
``python -m kubedl_prefect.lifecycle.local.supervisor`` and hands it the launch plan on standard
input (the replicas' environment may hold secrets: it never touches the disk). The supervisor
detaches (double fork, a session of its own), so it outlives the caller: a flow process that
crashes leaves its job running, and the next one re-attaches to it instead of starting it twice.

It then:

1. claims the job's name by renaming the directory the backend prepared into place (a second
   submitter of the same attempt loses the rename and adopts the job instead);
2. listens on the job's wake-up socket: every watcher connected there gets a byte whenever a
   file of the job changes, and end-of-file when the supervisor is gone, so the backend follows
   the job without polling;
3. starts every replica in a process group of its own, writes each line it prints to the
   replica's log file with a timestamp, and records how each one ends;
4. settles the job like the operators (:func:`.state.settle`): a replica that fails ends the
   attempt, the master's success is the job's; then it stops what still runs — SIGTERM, a grace
   period, SIGKILL — down to the last descendant, and only then writes the final phase.

On Linux it is the child subreaper of everything below it, so a descendant that detached from its
replica's process group (a daemonised helper) is still found and stopped: when a job has ended,
no process of it is left. SIGTERM (what :meth:`~.backend.LocalBackend.cancel` sends) stops the
job the same way.

Only the standard library, psutil and the pure modules of this package are imported here: it
starts in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import sys
import traceback
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Final

import psutil

from kubedl_prefect.lifecycle.local.layout import (
    MAX_LINE_BYTES,
    STATE_FILE,
    SUPERVISOR_LOG,
    format_log_line,
    log_path,
    open_private,
    private_dir,
    remove_socket,
    write_json,
)
from kubedl_prefect.lifecycle.local.state import (
    JobDocument,
    JobState,
    ProcessIdentity,
    ReplicaPlan,
    Settlement,
    StoppedBy,
    now_rfc3339,
    settle,
)

_PR_SET_CHILD_SUBREAPER: Final = 36
_READ_CHUNK: Final = 1 << 16


def _become_subreaper() -> None:
    """Adopt orphaned descendants (Linux); elsewhere process groups are all there is."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Supervisor:
    """Runs the replicas of one job and keeps its ``state.json`` (see the module docstring).

    Args:
        plan: The launch plan :class:`~.backend.LocalBackend` wrote.
    """

    def __init__(self, plan: Mapping[str, Any]):
        self.document = JobDocument.from_dict(plan["job"])
        self.replicas = [ReplicaPlan.from_dict(r) for r in plan["replicas"]]
        self.success = frozenset(str(n) for n in plan["success"])
        self.success_grace_s = float(plan.get("successGraceS", 5.0))
        self.termination_grace_s = float(plan.get("terminationGraceS", 10.0))
        self.admission = str(plan.get("admission") or "admitted")
        deadline = plan.get("activeDeadlineSeconds")
        self.active_deadline_s = float(deadline) if deadline else None
        self.new_dir = Path(plan["newDir"])
        self.dir = Path(plan["jobDir"])
        self.state = self.document.initial_state()
        self.settlement: Settlement | None = None
        self.cancelled = False
        self._settled = asyncio.Event()
        self._sock: socket.socket | None = None
        self._watchers: dict[asyncio.StreamWriter, asyncio.Task[Any] | None] = {}
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._stopping: dict[str, StoppedBy] = {}
        self._waits: list[asyncio.Task[None]] = []
        self._pumps: list[asyncio.Task[None]] = []

    # -- claiming the job ------------------------------------------------------------------

    def claim(self) -> bool:
        """Listen on the wake-up socket and rename the prepared directory into place.

        Returns whether this supervisor got the job (``False``: it exists already).
        """
        path = Path(self.document.socket)
        private_dir(path.parent)  # a link or someone else's folder there is refused
        remove_socket(path)  # left by a supervisor of the same uid that died: nobody else's
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen(64)
        me = ProcessIdentity(os.getpid(), psutil.Process().create_time())
        self.state = replace(
            self.state,
            phase="Admitted",
            reason="JobAdmitted",
            message=self.admission,
            supervisor=me,
            version=1,
        )
        write_json(self.new_dir / STATE_FILE, self.state.to_dict())
        try:
            os.rename(self.new_dir, self.dir)
        except OSError:
            sock.close()
            path.unlink(missing_ok=True)
            shutil.rmtree(self.new_dir, ignore_errors=True)
            return False
        self._sock = sock
        return True

    # -- running it ------------------------------------------------------------------------

    async def run(self) -> None:
        """Start the replicas, follow them, settle and clean up; write the final state."""
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, self._cancel)
        assert self._sock is not None
        server = await asyncio.start_unix_server(self._serve_watcher, sock=self._sock)
        try:
            try:
                await self._start_all()
                try:
                    async with asyncio.timeout(self.active_deadline_s):
                        await self._settled.wait()
                except TimeoutError:
                    self.settlement = Settlement(
                        "Failed",
                        "DeadlineExceeded",
                        f"the job ran past activeDeadlineSeconds ({self.active_deadline_s:g}s)",
                    )
                await self._finish()
            except Exception as exc:
                traceback.print_exc()
                self.settlement = Settlement("Failed", "SupervisorError", f"{exc}")
                await self._stop_everything()
            settlement = self.settlement or Settlement("Failed", "SupervisorError", "unsettled")
            self._write(
                replace(
                    self.state,
                    phase=settlement.phase,
                    reason=settlement.reason,
                    message=settlement.message,
                    completion_time=now_rfc3339(),
                )
            )
        finally:
            server.close()
            handlers = [t for t in self._watchers.values() if t is not None]
            for watcher in list(self._watchers):
                watcher.close()
            if handlers:
                await asyncio.wait(handlers, timeout=2.0)
            _remove(Path(self.document.socket))

    async def _start_all(self) -> None:
        for plan in self.replicas:
            if self.settlement is not None:
                return
            await self._start(plan)
        if self.settlement is None:
            self._write(
                replace(
                    self.state,
                    phase="Running",
                    reason="JobRunning",
                    message=f"{len(self.replicas)} replicas are running",
                    start_time=now_rfc3339(),
                )
            )
        self._check()

    async def _start(self, plan: ReplicaPlan) -> None:
        out = _open_log(log_path(self.dir, plan.name))
        replica = self.state.replica(plan.name)
        try:
            process = await asyncio.create_subprocess_exec(
                *plan.argv,
                cwd=plan.cwd,
                env=dict(plan.env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            # What a container runtime reports: 127 not found, 126 found but not runnable.
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            what = "command not found" if code == 127 else "command cannot be run"
            text = f"{what}: {plan.argv[0] if plan.argv else '(none)'} ({exc.strerror or exc})"
            out.write(format_log_line(now_rfc3339(), text.encode()))
            out.close()
            now = now_rfc3339()
            started = replace(replica, started_at=now)
            self._write(self.state.with_replica(started.exited(code, at=now, message=text)))
            self._check()
            return
        self._processes[plan.name] = process
        try:
            created = psutil.Process(process.pid).create_time()
        except psutil.Error:
            created = 0.0
        self._write(
            self.state.with_replica(
                replace(
                    replica,
                    phase="running",
                    process=ProcessIdentity(process.pid, created),
                    started_at=now_rfc3339(),
                )
            )
        )
        assert process.stdout is not None
        self._pumps.append(asyncio.create_task(self._pump(process.stdout, out)))
        self._waits.append(asyncio.create_task(self._wait(plan.name, process)))

    async def _wait(self, name: str, process: asyncio.subprocess.Process) -> None:
        returncode = await process.wait()
        ended = self.state.replica(name).exited(
            returncode, at=now_rfc3339(), stopped_by=self._stopping.get(name)
        )
        self._write(self.state.with_replica(ended))
        self._check()

    async def _pump(self, stream: asyncio.StreamReader, out: IO[bytes]) -> None:
        """Copy one replica's output to its log file, a timestamp on each line."""
        pending = b""
        try:
            while chunk := await stream.read(_READ_CHUNK):
                pending += chunk
                lines = pending.split(b"\n")
                pending = lines.pop()
                while len(pending) > MAX_LINE_BYTES:
                    lines.append(pending[:MAX_LINE_BYTES])
                    pending = pending[MAX_LINE_BYTES:]
                if lines:
                    stamp = now_rfc3339()
                    out.write(b"".join(format_log_line(stamp, line) for line in lines))
                    out.flush()
                    self._notify()
            if pending:
                out.write(format_log_line(now_rfc3339(), pending))
                out.flush()
                self._notify()
        finally:
            out.close()

    def _check(self) -> None:
        if self.settlement is None:
            self.settlement = settle(self.state, self.success)
        if self.settlement is not None:
            self._settled.set()

    def _cancel(self) -> None:
        self.cancelled = True
        if self.settlement is None:
            self.settlement = Settlement("Failed", "JobCancelled", "the job was cancelled")
        self._settled.set()

    def _running(self) -> list[str]:
        return [n for n, p in self._processes.items() if p.returncode is None]

    async def _finish(self) -> None:
        settlement = self.settlement
        if settlement is not None and settlement.phase == "Succeeded" and not self.cancelled:
            # The others get a moment to end by themselves (a worker finishing its last step).
            waits = [t for t in self._waits if not t.done()]
            if waits:
                await asyncio.wait(waits, timeout=self.success_grace_s)
        await self._stop_everything()

    async def _stop_everything(self) -> None:
        """Stop every replica and every descendant, SIGTERM first, SIGKILL after the grace."""
        why: StoppedBy = "cancel" if self.cancelled else "supervisor"
        for name in self._running():
            self._stopping.setdefault(name, why)
        for number, grace in ((signal.SIGTERM, self.termination_grace_s), (signal.SIGKILL, 10.0)):
            direct = {self._processes[n].pid for n in self._running()}
            others = [p for p in _descendants() if p.pid not in direct]
            if not direct and not others:
                break
            for pid in direct:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, number)
            for process in others:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(number)
            waits = [t for t in self._waits if not t.done()]
            await asyncio.gather(
                asyncio.wait(waits, timeout=grace) if waits else asyncio.sleep(0),
                asyncio.to_thread(psutil.wait_procs, others, timeout=grace),
            )
        for _ in range(3):  # orphans that reached us while the rest was stopped
            left = _descendants()
            if not left:
                break
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            await asyncio.to_thread(psutil.wait_procs, left, timeout=5.0)
        if self._waits:
            await asyncio.wait(self._waits, timeout=10.0)
        if self._pumps:
            await asyncio.wait(self._pumps, timeout=5.0)
        _reap_orphans()

    # -- watchers --------------------------------------------------------------------------

    async def _serve_watcher(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._watchers[writer] = asyncio.current_task()
        try:
            await reader.read()  # until the watcher or the supervisor hangs up
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.pop(writer, None)
            writer.close()

    def _notify(self) -> None:
        for writer in list(self._watchers):
            if writer.is_closing():
                continue
            if writer.transport.get_write_buffer_size() < 4096:  # a slow watcher has news already
                writer.write(b".")

    def _write(self, state: JobState) -> None:
        self.state = replace(state, version=self.state.version + 1)
        write_json(self.dir / STATE_FILE, self.state.to_dict())
        self._notify()


def _open_log(path: Path) -> IO[bytes]:
    """The replica's log file, to append to (closed by its pump): ``0600``, never a link."""
    return open_private(path, append=True)


def _remove(path: Path) -> None:
    remove_socket(path)


def _descendants() -> list[psutil.Process]:
    try:
        return [
            p
            for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE
        ]
    except psutil.Error:
        return []


def _reap_orphans() -> None:
    """Collect the exit status of adopted orphans (never of a replica: they are waited for)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _daemonize(new_dir: Path) -> tuple[bool, int]:
    """Fork: ``(True, read end)`` in the parent, ``(False, write end)`` in the detached child.

    The child gets a session of its own (no terminal, no signal of the caller's process group
    reaches it), standard input and output on ``/dev/null`` (so that the backend's read of the
    parent's output ends with the parent) and standard error in the job's ``supervisor.log``.
    """
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        return True, read_end
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    log = open_private(new_dir / SUPERVISOR_LOG, append=True)
    os.dup2(log.fileno(), 2)
    os.close(devnull)
    log.close()
    return False, write_end


def main() -> int:
    """Read the plan, detach, claim the job and run it; the parent prints how the claim went."""
    plan = json.load(sys.stdin)
    new_dir = Path(plan["newDir"])  # made by the backend, with its logs folder, 0700
    parent, fd = _daemonize(new_dir)
    if parent:  # report what the child says, then let it go
        with os.fdopen(fd, "rb") as report:
            answer = report.read().decode() or "failed: the supervisor ended before the claim\n"
        sys.stdout.write(answer)
        sys.stdout.flush()
        return 0
    _become_subreaper()
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    reported = False
    try:
        supervisor = Supervisor(plan)
        claimed = supervisor.claim()
        os.write(fd, f"claimed {os.getpid()}\n".encode() if claimed else b"exists\n")
        os.close(fd)
        reported = True
        if claimed:
            asyncio.run(supervisor.run())
    except BaseException as exc:
        traceback.print_exc()
        if not reported:
            with contextlib.suppress(OSError):
                os.write(fd, f"failed: {exc}\n".encode())
    finally:
        sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
