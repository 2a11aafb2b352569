"""What every replica of a function task runs: ``python -m kubedl_prefect.prefect.bootstrap``.

It reads the operators' environment (:func:`~kubedl_prefect.prefect.replica.current_replica`),
joins the job's torch process group when torch is importable and the job has more than one
replica (``gloo`` on the CPU, ``nccl`` where CUDA is; ``$KUBEDL_PREFECT_PROCESS_GROUP`` says
otherwise), loads the function and its arguments the task sent (only that payload: its SHA-256
is checked), calls it, and leaves in the job's checkpoint directory rank 0's return value, or
the error record of a replica whose function raised (and exits 1, its traceback on stderr). On a
Kubernetes cluster (``$KUBEDL_PREFECT_TERMINATION_MESSAGE`` set) it also leaves the same in the
container's termination message, where the flow reads it from the pod's status.

With a loopback address literal in ``MASTER_ADDR`` (``127.0.0.1``: a ``LocalCluster``) the
rendezvous store listens there only: torch's own ``env://`` store would listen on every
interface of the machine. Any other ``MASTER_ADDR`` is a cluster's, and rank 0's store listens
on every interface of its pod, as ``env://`` makes it: that includes ``localhost``, which KubeDL
gives its master while the workers reach it by the master's Service name
(:func:`store_listen_address`).

Neither this module nor :mod:`~kubedl_prefect.prefect.replica` imports Prefect or torch at
import time; torch is imported only to join the process group.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import ipaddress
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from kubedl_prefect.prefect.replica import (
    CHECKPOINT_ENV,
    EXIT_FUNCTION_RAISED,
    EXIT_OTHER_RANK_FAILED,
    PROCESS_GROUP_ENV,
    TERMINATION_MESSAGE_ENV,
    Replica,
    ReplicaError,
    clear_outputs,
    current_replica,
    load_call,
    read_payload,
    termination_message,
    write_error,
    write_result,
    write_termination_message,
)


def store_listen_address(master_addr: str) -> str | None:
    """Where rank 0's rendezvous store listens: a loopback address only, or ``None`` (everywhere).

    Only a loopback address literal (``127.0.0.1``, ``::1``: what a ``LocalCluster`` gives every
    replica) keeps the store on loopback. The name ``localhost`` does not: KubeDL gives a
    PyTorchJob's master ``MASTER_ADDR=localhost`` while its workers connect to the master's
    Service name, that is the master pod's own address, so the store must listen on the pod's
    interfaces, as torch's ``env://`` makes it (a store on the pod's loopback leaves every
    worker waiting until its store timeout, 300 s). A real cluster does the same as the test bed.

    Example:
        >>> [store_listen_address(a) for a in ("127.0.0.1", "::1", "localhost", "job-master-0")]
        ['127.0.0.1', '::1', None, None]
    """
    try:
        return master_addr if ipaddress.ip_address(master_addr).is_loopback else None
    except ValueError:  # a name: a Service's, or localhost
        return None


def process_group_backend(replica: Replica, requested: str | None) -> str | None:
    """The torch process group to join: ``None`` alone, without torch, or when asked not to.

    Example:
        >>> process_group_backend(Replica(rank=0, world_size=1), "auto") is None
        True
        >>> process_group_backend(Replica(rank=0, world_size=2), "none") is None
        True
    """
    choice = (requested or "auto").lower()
    if choice == "none" or replica.world_size < 2 or replica.master_addr is None:
        return None
    if importlib.util.find_spec("torch") is None:
        return None
    if choice != "auto":
        return choice
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(replica: Replica, backend: str) -> Any:
    """Join the job's process group; its rendezvous store (on loopback only, when local).

    The store is made here rather than by ``env://`` for two reasons: torch's own would listen
    on every interface of the machine even with a loopback ``MASTER_ADDR``, and the replicas
    tell each other through it how their function ended (:func:`report_and_wait`). Where it
    listens: :func:`store_listen_address`.
    """
    import torch.distributed as dist
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not in __all__

    assert replica.master_addr is not None
    assert replica.master_port is not None
    host = replica.master_addr
    if host.lower().rstrip(".") == "localhost":
        host = "127.0.0.1"
    listen = store_listen_address(replica.master_addr)
    if replica.rank != 0:
        store = TCPStore(host, replica.master_port, replica.world_size, is_master=False)
    elif listen is not None:
        family = socket.AF_INET6 if ":" in listen else socket.AF_INET
        listener = socket.create_server(
            (listen, replica.master_port), family=family, backlog=max(128, replica.world_size)
        )
        store = TCPStore(
            host,
            replica.master_port,
            replica.world_size,
            is_master=True,
            master_listen_fd=listener.detach(),
            use_libuv=True,
        )
    else:  # a cluster: every interface of the pod (the workers come by its Service), as env://
        store = TCPStore(host, replica.master_port, replica.world_size, is_master=True)
    dist.init_process_group(backend, store=store, rank=replica.rank, world_size=replica.world_size)
    return store


STATUS_KEY = "kubedl-prefect/function-status/"
"""Store keys: ``<prefix><rank>`` is ``ok`` or ``failed`` once that rank's function ended."""


def report_and_wait(store: Any, replica: Replica, *, ok: bool) -> list[int]:
    """Tell the others how this rank's function ended; rank 0 waits for every rank's word.

    A PyTorch job succeeds when its master does, whatever the workers did: so rank 0 does not
    return the result (nor exit 0) before every rank has said it returned too.

    Returns:
        For rank 0, the ranks whose function failed (or never said: a killed replica); for the
        others, nothing.
    """
    from datetime import timedelta

    try:
        store.set(f"{STATUS_KEY}{replica.rank}", "ok" if ok else "failed")
    except Exception:  # rank 0, which serves the store, is gone: nobody is left to tell
        return []
    if replica.rank != 0:
        return []
    failed: list[int] = []
    for rank in range(1, replica.world_size):
        try:
            store.wait([f"{STATUS_KEY}{rank}"], timedelta(seconds=STATUS_WAIT_S))
            status = store.get(f"{STATUS_KEY}{rank}")
        except Exception:
            failed.append(rank)
            continue
        if status != b"ok":
            failed.append(rank)
    return failed


STATUS_WAIT_S = 1800.0
"""How long rank 0 waits for the others' word once its own function returned (torch's default
collective timeout)."""


def _leave_process_group() -> None:
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    value = fn(*args, **kwargs)
    if inspect.iscoroutine(value):
        value = asyncio.run(value)
    return value


def _leave_message(**what: Any) -> None:
    """Leave rank 0's value or this replica's error in the termination message, if asked to."""
    path = os.environ.get(TERMINATION_MESSAGE_ENV)
    if not path:
        return
    try:
        write_termination_message(Path(path), termination_message(**what))
    except OSError as exc:  # the flow then says the message is missing; the log says why
        print(f"cannot write the termination message {path}: {exc}", file=sys.stderr, flush=True)


def main() -> int:
    """Run the task's function as this replica; 0 when it (and every other rank's) returned."""
    replica = current_replica()
    outputs = Path(os.environ.get(CHECKPOINT_ENV) or "checkpoints")
    clear_outputs(outputs, replica.rank)
    store: Any = None
    try:
        try:
            data, expected = read_payload()
            fn, args, kwargs = load_call(data, expected)
            backend = process_group_backend(replica, os.environ.get(PROCESS_GROUP_ENV))
            if backend is not None:
                store = init_process_group(replica, backend)
            value = _call(fn, args, kwargs)
        except BaseException as exc:
            traceback.print_exc()
            sys.stderr.flush()
            error = ReplicaError.of(replica.rank, exc)
            write_error(outputs, error)
            _leave_message(error=error)
            if store is not None:
                report_and_wait(store, replica, ok=False)
            return EXIT_FUNCTION_RAISED
        failed = report_and_wait(store, replica, ok=True) if store is not None else []
        if failed:
            print(
                f"rank 0: the function failed on rank(s) {', '.join(map(str, failed))}: "
                "no result is returned",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_OTHER_RANK_FAILED
        if replica.is_rank_zero:
            try:
                write_result(outputs, value)
            except Exception as exc:  # a value cloudpickle cannot write
                traceback.print_exc()
                error = ReplicaError.of(replica.rank, exc)
                write_error(outputs, error)
                _leave_message(error=error)
                return EXIT_FUNCTION_RAISED
            _leave_message(value=value)
        return 0
    finally:
        _leave_process_group()


if __name__ == "__main__":
    sys.exit(main())
