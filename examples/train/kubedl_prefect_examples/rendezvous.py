"""Join the job's process group with its rendezvous store listening where ``MASTER_ADDR`` is.

``init_process_group(init_method="env://")`` starts, on rank 0, a ``TCPStore`` server that
listens on every interface (``::``), whatever ``MASTER_ADDR`` says (checked with torch 2.15):
the store has no authentication, so anyone who reaches the port can read and write the
rendezvous while the job runs. On a cluster that is the pod's network, and ``MASTER_ADDR`` is the
master's service, whose address rank 0 cannot bind; locally (kubedl-prefect's local backend
gives ``MASTER_ADDR=127.0.0.1``) it is this machine's every network. The only way torch offers
to bind the server elsewhere is to hand it a listening socket (``master_listen_fd``), which
:func:`init_process_group` does when ``MASTER_ADDR`` is a loopback address literal
(``127.0.0.1``, ``::1``: what kubedl-prefect's local backend gives every replica)::

    from kubedl_prefect_examples.rendezvous import init_process_group

    init_process_group("gloo")  # instead of dist.init_process_group("gloo", init_method="env://")

The name ``localhost`` is not such an address here: KubeDL gives the master of a PyTorchJob
``MASTER_ADDR=localhost`` while the workers reach it by its Service name (``<job>-master-0``), so
the master's store must listen on the pod's own interfaces, as ``env://`` makes it (found when
the example first ran on real pods of the test bed's process node).

Gloo's own connections between ranks listen on the address the host name resolves to unless
``GLOO_SOCKET_IFNAME`` names an interface; the local backend sets it (and ``NCCL_SOCKET_IFNAME``)
to the loopback interface.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not in __all__
from torch.distributed.constants import default_pg_timeout


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) names this machine's loopback."""
    if address.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def store_on_loopback(address: str) -> bool:
    """Whether rank 0's store listens on ``address`` only: a loopback address literal.

    ``localhost`` is KubeDL's ``MASTER_ADDR`` for the master itself, whose workers connect to
    its Service: its store must listen on the pod's interfaces.

    Example:
        >>> [store_on_loopback(a) for a in ("127.0.0.1", "::1", "localhost", "job-master-0")]
        [True, True, False, False]
    """
    return is_loopback(address) and address.lower().rstrip(".") != "localhost"


def loopback_store(
    host: str, port: int, rank: int, world_size: int, timeout: timedelta = default_pg_timeout
) -> TCPStore:
    """The job's ``TCPStore``: served by rank 0 on ``host:port`` only, a client elsewhere.

    Args:
        host: A loopback address (:func:`is_loopback`); ``localhost`` means ``127.0.0.1``.
        port: The rendezvous port (``MASTER_PORT``).
        rank: This process's rank.
        world_size: How many processes join.
        timeout: How long to wait for the others.
    """
    if not is_loopback(host):
        raise ValueError(f"{host!r} is not a loopback address")
    if host.lower().rstrip(".") == "localhost":
        host = "127.0.0.1"
    if rank != 0:
        return TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=max(128, world_size))
    # The store takes the socket over (only its libuv server accepts one) and closes it.
    return TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        timeout=timeout,
        master_listen_fd=listener.detach(),
        use_libuv=True,
    )


def init_process_group(backend: str = "gloo", *, timeout: timedelta | None = None) -> None:
    """``dist.init_process_group`` from the operators' variables, the store on loopback if local.

    Reads ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``. With a loopback
    address literal in ``MASTER_ADDR`` (the local backend's) the store listens there only
    (:func:`loopback_store`); otherwise (a cluster, including KubeDL's ``localhost`` on the
    master) this is ``init_method="env://"``.
    """
    address = os.environ["MASTER_ADDR"]
    if not store_on_loopback(address):
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = loopback_store(
        address, int(os.environ["MASTER_PORT"]), rank, world_size, timeout or default_pg_timeout
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
