"""``python -m kubedl_prefect.testbed.nodeagent NAME PORT_BASE``: run a test bed's process node."""

from __future__ import annotations

import asyncio
import logging
import sys

from kubedl_prefect.testbed.components import Layout, Ports
from kubedl_prefect.testbed.nodeagent.agent import serve
from kubedl_prefect.testbed.nodeagent.component import AGENT
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_NAME


def main(argv: list[str]) -> None:
    """Serve the process node of test bed ``NAME`` (ports from ``PORT_BASE``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    name, base = argv[:2]
    layout = Layout(name=name, ports=Ports(base=int(base)))
    assert AGENT.identity is not None
    asyncio.run(serve(layout, layout.kubeconfig(AGENT.identity.user), PROCESS_NODE_NAME))


if __name__ == "__main__":
    main(sys.argv[1:])
