"""Run one container of a process-node pod (``python -m <this module> SPEC AGENT_PID``).

The node agent starts this launcher for each container run, with the container's output on its
stdout and stderr, and ``SPEC`` a JSON file (:class:`SandboxSpec`). The launcher joins the pod's
network namespace, unshares a mount, UTS and PID namespace and forks the namespace's first
process, which:

1. makes every mount private (nothing it mounts is seen outside), sets the pod's host name;
2. builds the container's root: an overlay of this machine's ``/`` with a scratch upper layer on
   a tmpfs (what the container writes outside its volumes stays its own and goes with it), the
   machine's ``/dev`` and ``/sys``, a new ``/proc``; the pod's ``/etc/hosts``, ``resolv.conf``
   and ``hostname``; each volume bind-mounted at its ``mountPath`` (read-only when asked);
3. changes root into it and to the working directory, and runs the command as its only child,
   passing on SIGTERM/SIGINT and reaping orphans, like a container's init.

Its exit code is the command's (128 + N for signal N). When the launcher dies, for any reason,
the kernel kills the namespace's first process (``PR_SET_PDEATHSIG``) and with it every process
of the container: deleting a pod kills its whole process tree. Linux only; needs root.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1

#: Exit code when the command cannot be executed (a kubelet reports ``StartError``, 128).
START_ERROR = 128
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


@dataclass(frozen=True)
class SandboxSpec:
    """What the launcher runs, as the node agent writes it.

    Attributes:
        netns: Path of the pod's network namespace (``/run/netns/...``).
        hostname: The pod's host name.
        scratch: An empty folder for the container's root (a tmpfs is mounted on it inside).
        etc: ``{"/etc/hosts": host file, ...}``: files bind-mounted over the machine's.
        mounts: ``[[source, target, read_only], ...]``: volumes.
        argv: The command.
        env: Its whole environment.
        working_dir: Its working directory (made when missing, as container runtimes do).
    """

    netns: str
    hostname: str
    scratch: str
    etc: dict[str, str]
    mounts: list[tuple[str, str, bool]]
    argv: list[str]
    env: dict[str, str]
    working_dir: str

    def to_json(self) -> str:
        """As JSON."""
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> SandboxSpec:
        """From :meth:`to_json`."""
        data: dict[str, Any] = json.loads(text)
        data["mounts"] = [(str(s), str(t), bool(r)) for s, t, r in data["mounts"]]
        return cls(**data)


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _die_with_parent() -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")


def inside(root: str, path: str, *, hops: int = 40) -> str:
    """``path`` of the container (whose root is ``root``) as a path of this mount namespace.

    Symbolic links on the way are followed as the container would see them (an absolute link
    starts again from ``root``), so that a mount target such as ``/var/run/...`` (``/var/run``
    links to ``/run``) never reaches outside the container's root. Missing components are
    kept as they are (they are created under ``root``).

    Raises:
        OSError: More than ``hops`` links.
    """
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        if os.path.islink(candidate):
            hops -= 1
            if hops < 0:
                raise OSError(f"too many symbolic links in {path}")
            link = os.readlink(candidate)
            if link.startswith("/"):
                resolved = []
            parts = [p for p in link.split("/") if p not in ("", ".")] + parts
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def _bind(source: str, target: str, *, read_only: bool = False, recursive: bool = False) -> None:
    if Path(source).is_dir():
        Path(target).mkdir(parents=True, exist_ok=True)
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).touch(exist_ok=True)
    _mount(source, target, None, MS_BIND | (MS_REC if recursive else 0), None)
    if read_only:
        _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)


def build_root(spec: SandboxSpec) -> str:
    """Mount the container's root under ``spec.scratch``; return it (inside the namespace)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    scratch = spec.scratch
    _mount("tmpfs", scratch, "tmpfs", 0, "mode=0755")
    for part in ("upper", "work", "root"):
        os.mkdir(f"{scratch}/{part}")
    root = f"{scratch}/root"
    _mount(
        "overlay",
        root,
        "overlay",
        0,
        f"lowerdir=/,upperdir={scratch}/upper,workdir={scratch}/work",
    )
    _bind("/dev", f"{root}/dev", recursive=True)
    _bind("/sys", f"{root}/sys", recursive=True)
    _mount("proc", f"{root}/proc", "proc", 0, None)
    for target, source in spec.etc.items():
        _bind(source, inside(root, target))
    for source, target, read_only in spec.mounts:
        _bind(source, inside(root, target), read_only=read_only)
    return root


def _init(spec: SandboxSpec) -> int:
    """The namespace's first process: build the root, run the command, pass signals on."""
    _die_with_parent()
    socket.sethostname(spec.hostname)
    root = build_root(spec)
    os.chroot(root)
    Path(spec.working_dir).mkdir(parents=True, exist_ok=True)
    os.chdir(spec.working_dir)
    child = os.fork()
    if child == 0:
        for number in _FORWARDED:
            signal.signal(number, signal.SIG_DFL)
        try:
            os.execvpe(spec.argv[0], spec.argv, spec.env)
        except OSError as exc:
            os.write(2, f"exec {spec.argv[0]!r} failed: {exc.strerror}\n".encode())
        os._exit(START_ERROR)

    def forward(number: int, frame: FrameType | None) -> None:
        del frame
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, number)

    for number in _FORWARDED:
        signal.signal(number, forward)
    while True:
        pid, status = os.waitpid(-1, 0)  # orphans of the container are reaped too
        if pid == child:
            return (
                os.waitstatus_to_exitcode(status)
                if os.WIFEXITED(status)
                else (128 + os.WTERMSIG(status))
            )


def main(argv: list[str]) -> int:
    """Launch the container described by the file ``argv[0]``; return its exit code."""
    spec = SandboxSpec.from_json(Path(argv[0]).read_text())
    parent = int(argv[1]) if len(argv) > 1 else None
    _die_with_parent()
    if parent is not None and os.getppid() != parent:
        return START_ERROR  # the agent died before we could follow it
    fd = os.open(spec.netns, os.O_RDONLY)
    _check(_libc.setns(fd, CLONE_NEWNET), "setns")
    os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        try:
            code = _init(spec)
        except BaseException as exc:  # the container could not be set up
            os.write(2, f"container setup failed: {exc}\n".encode())
            code = START_ERROR
        os._exit(code)

    def forward(number: int, frame: FrameType | None) -> None:
        del frame
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, number)

    for number in _FORWARDED:
        signal.signal(number, forward)
    _, status = os.waitpid(child, 0)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
