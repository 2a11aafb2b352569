"""The table ``kubedl-prefect testbed services`` prints: columns sized to what they hold."""

from __future__ import annotations

import doctest

import kubedl_prefect.testbed.cli
from kubedl_prefect.testbed.cli import _format_services
from kubedl_prefect.testbed.nodeagent.forwarder import Forward, ServicePort


def test_long_service_names_keep_every_column_apart_and_aligned() -> None:
    forwards = [
        Forward(
            ServicePort(
                "t-test-a-job-that-fits-only-by-borrowing-1a2b3c",
                "sklearn-iris-predictor-00001-private",
                8012,
            ),
            "127.0.0.1:41873",
            ("169.254.124.3:8080", "169.254.124.4:8080"),
        ),
        Forward(ServicePort("ml", "x", 80), "127.0.0.1:5", ()),
    ]
    header, *rows = _format_services(forwards).splitlines()
    address, pods = header.index("ADDRESS"), header.index("PODS")
    assert header.startswith("SERVICE  ")
    for row, forward in zip(rows, forwards, strict=True):
        key = forward.port
        service = f"{key.namespace}/{key.service}:{key.port}"
        assert row[:address].rstrip() == service
        assert row[address - 2 : address] == "  "  # never run together
        assert row[address:pods].rstrip() == forward.address
        assert row[pods - 2 : pods] == "  "
        assert row[pods:] == (", ".join(forward.targets) or "(none ready)")
    # Sized to the content: the longest name is followed by exactly the two-space gap.
    longest = (
        "t-test-a-job-that-fits-only-by-borrowing-1a2b3c/sklearn-iris-predictor-00001-private:8012"
    )
    assert address == len(longest) + 2


def test_the_documented_example_holds() -> None:
    result = doctest.testmod(kubedl_prefect.testbed.cli, raise_on_error=False)
    assert result.attempted >= 1
    assert result.failed == 0
