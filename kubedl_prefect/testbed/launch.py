"""Start one component and wait until it is ready; probe health endpoints.

A component is started detached (:func:`~kubedl_prefect.testbed.process.start`) with its own log
and pid file, then watched: it must stay alive until its health check answers 200, or the start
fails with the tail of its log.
"""

from __future__ import annotations

import logging
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import process
from kubedl_prefect.testbed.components import (
    Component,
    ComponentContext,
    HealthCheck,
    Layout,
    ephemeral_port_range,
)

logger = logging.getLogger(__name__)


def probe(check: HealthCheck, layout: Layout) -> bool:
    """Whether ``check``'s endpoint answers 200 (within 2 seconds).

    Args:
        check: The endpoint and how to talk TLS to it.
        layout: The test bed (its CA and admin client certificate, for HTTPS).
    """
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]  # loopback
    if check.url.startswith("https:"):
        context = ssl.create_default_context()
        if check.verify_ca:
            context.load_verify_locations(cafile=str(layout.ca_file))
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if check.client_cert:
            context.load_cert_chain(str(layout.admin_cert_file), str(layout.admin_key_file))
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(check.url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def start_component(
    layout: Layout,
    component: Component,
    binaries: Mapping[str, Path],
    *,
    timeout: float = 90.0,
) -> process.ProcessRecord:
    """Start ``component`` of the test bed in ``layout`` and wait until it is ready.

    Ready means its health check answers (or, without one, that it was started).

    Args:
        layout: The test bed's state folder and ports.
        component: What to start.
        binaries: Path of each binary by name; must hold ``component.binary``.
        timeout: How long it may take to become ready.

    Returns:
        The record of its process (also in its pid file).

    Raises:
        TestbedError: Unknown binary, it could not be executed, it exited during start-up, or it
            was not ready in time (the message ends with the tail of its log).
    """
    if component.binary not in binaries:
        raise TestbedError(f"component {component.name} needs unknown binary {component.binary}")
    kubeconfig = layout.kubeconfig(component.identity.user) if component.identity else None
    context = ComponentContext(layout=layout, binaries=binaries, kubeconfig=kubeconfig)
    argv = [str(binaries[component.binary]), *component.args(context)]
    log_file = layout.log_file(component.name)
    env = dict(component.env)
    if component.env_from is not None:
        env.update(component.env_from(context))
    if kubeconfig is not None:
        # Some components read their kubeconfig only from the environment.
        env.setdefault("KUBECONFIG", str(kubeconfig))
    record = process.start(
        argv, log_file=log_file, pid_file=layout.pid_file(component.name), env=env
    )
    check = component.health(layout) if component.health else None
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if not process.is_alive(record):
            raise TestbedError(
                f"{component.name} exited during start-up; last lines of {log_file}:\n"
                f"{process.log_tail(log_file)}",
                hint=layout.ports.ephemeral_clash(ephemeral_port_range()),
            )
        if check is None or probe(check, layout):
            elapsed = time.monotonic() - started
            logger.info("%s ready in %.1fs (pid %d)", component.name, elapsed, record.pid)
            return record
        if time.monotonic() > deadline:
            raise TestbedError(
                f"{component.name} not ready after {timeout:.0f}s ({check.url}); "
                f"last lines of {log_file}:\n{process.log_tail(log_file)}"
            )
        time.sleep(0.1)
