"""Where the example program's rendezvous store listens, for each operator's MASTER_ADDR."""

from __future__ import annotations

import doctest

from kubedl_prefect_examples import rendezvous


def test_docstring_examples() -> None:
    result = doctest.testmod(rendezvous)
    assert result.attempted >= 1
    assert result.failed == 0


def test_kubedls_localhost_on_the_master_is_served_on_the_pods_interfaces() -> None:
    # KubeDL v0.5.0 gives the master MASTER_ADDR=localhost and the workers <job>-master-0
    # (controllers/pytorch/pytorchjob_controller.go): a store on loopback would be unreachable.
    assert rendezvous.is_loopback("localhost")
    assert not rendezvous.store_on_loopback("localhost")
    assert not rendezvous.store_on_loopback("LOCALHOST.")
    # The local backend's address keeps the store off every other interface.
    assert rendezvous.store_on_loopback("127.0.0.1")
    assert not rendezvous.store_on_loopback("ddp-spirals-master-0")
