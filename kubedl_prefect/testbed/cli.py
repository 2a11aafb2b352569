"""``kubedl-prefect testbed up|down|status|services|build|restart``: the test bed as a sandbox.

``up`` prints progress on stderr and, as the last line on stdout, ``KUBECONFIG=<path>``, so
``eval "$(kubedl-prefect testbed up)"`` points a shell at the sandbox. A test bed started with
``--port-base`` is found by its name alone afterwards (``status``, ``down``, ``restart``...): its
state folder records the base while it runs.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed.build import build_times
from kubedl_prefect.testbed.components import Ports
from kubedl_prefect.testbed.testbed import Testbed, TestbedStatus

if TYPE_CHECKING:
    from kubedl_prefect.testbed.nodeagent.forwarder import Forward

app = typer.Typer(
    name="testbed",
    help="A local Kubernetes test bed: real control plane, simulated GPU nodes, operators.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

NameOption = Annotated[
    str, typer.Option("--name", help="Name of the test bed (its state folder and identity).")
]
PortBaseOption = Annotated[
    int | None,
    typer.Option(
        "--port-base",
        help="First port on 127.0.0.1 (default: the one the test bed was started with, while "
        "it runs; else 28400 or $KUBEDL_PREFECT_TESTBED_PORT_BASE).",
        min=1024,
        max=65400,
    ),
]


def _testbed(
    name: str,
    port_base: int | None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    operators: bool = True,
    process_node: bool | None = None,
) -> Testbed:
    ports = Ports(port_base) if port_base is not None else None
    return Testbed(
        name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        ports=ports,
        operators=operators,
        process_node=process_node,
    )


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    package_logger = logging.getLogger("kubedl_prefect.testbed")
    package_logger.handlers[:] = [handler]
    package_logger.setLevel(logging.INFO if verbose else logging.WARNING)
    package_logger.propagate = False


def _fail(error: TestbedError) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(1)


@app.command()
def up(
    name: NameOption = "default",
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", min=1, help="Number of simulated GPU nodes (default 2)."),
    ] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option("--gpus-per-node", min=0, help="nvidia.com/gpu per node (default 8)."),
    ] = None,
    port_base: PortBaseOption = None,
    operators: Annotated[
        bool, typer.Option(help="Also start Volcano, the KubeDL and the Kubeflow operators.")
    ] = True,
    process_node: Annotated[
        bool,
        typer.Option(
            "--process-node",
            help="Also run a process node, whose pods run as processes of this machine "
            "(root, Linux; see docs/testbed.md).",
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress messages.")] = False,
) -> None:
    """Build what is missing, start the test bed (or keep it running) and print its KUBECONFIG."""
    _setup_logging(verbose=not quiet)
    bed = _testbed(name, port_base, nodes, gpus_per_node, operators, process_node or None)
    try:
        kubeconfig = bed.up()
    except TestbedError as exc:
        raise _fail(exc) from exc
    typer.echo(f"KUBECONFIG={kubeconfig}")


@app.command()
def build(
    operators: Annotated[
        bool, typer.Option(help="Also build Volcano, the KubeDL and the Kubeflow operators.")
    ] = True,
) -> None:
    """Build every binary that is missing or out of date (as ``up`` would); list them."""
    _setup_logging(verbose=True)
    try:
        built = Testbed(operators=operators).build()
    except TestbedError as exc:
        raise _fail(exc) from exc
    seconds = build_times()
    for name, path in built.items():
        took = f"  (last build {seconds[name]:.0f}s)" if name in seconds else ""
        typer.echo(f"{name}: {path}{took}")


@app.command()
def down(name: NameOption = "default", port_base: PortBaseOption = None) -> None:
    """Stop the test bed and drop its cluster data (certificates and logs are kept)."""
    _setup_logging(verbose=True)
    bed = _testbed(name, port_base)
    try:
        bed.down()
    except TestbedError as exc:
        raise _fail(exc) from exc
    typer.echo(f"test bed {name} is down")


@app.command()
def restart(
    component: Annotated[
        str, typer.Argument(help="Component to crash and restart, e.g. kube-apiserver or kwok.")
    ],
    name: NameOption = "default",
    port_base: PortBaseOption = None,
) -> None:
    """Kill one component (SIGKILL, a crash), start it again with its data; print the downtime."""
    _setup_logging(verbose=True)
    bed = _testbed(name, port_base)
    try:
        downtime = bed.restart(component)
    except TestbedError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{component} of test bed {name} restarted after {downtime:.1f}s down")


@app.command("stop-operator")
def stop_operator(
    component: Annotated[str, typer.Argument(help="kubedl-operator, training-operator, ...")],
    name: NameOption = "default",
    port_base: PortBaseOption = None,
) -> None:
    """Stop one operator and keep it stopped (its supervisor leaves it alone) until started."""
    _setup_logging(verbose=True)
    try:
        _testbed(name, port_base).stop(component)
    except TestbedError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{component} of test bed {name} stopped")


@app.command("start-operator")
def start_operator(
    component: Annotated[str, typer.Argument(help="kubedl-operator, training-operator, ...")],
    name: NameOption = "default",
    port_base: PortBaseOption = None,
) -> None:
    """Start an operator stopped with stop-operator again and wait until it is ready."""
    _setup_logging(verbose=True)
    try:
        _testbed(name, port_base).start(component)
    except TestbedError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{component} of test bed {name} started")


@app.command()
def status(name: NameOption = "default", port_base: PortBaseOption = None) -> None:
    """Show each component (pid, health, memory) and the kubeconfig; exit 1 unless all are up."""
    bed = _testbed(name, port_base)
    state = bed.status()
    typer.echo(_format_status(state))
    if not state.up:
        raise typer.Exit(1)


@app.command()
def services(name: NameOption = "default", port_base: PortBaseOption = None) -> None:
    """List the Services of process-node pods and where this machine reaches them."""
    from kubedl_prefect.testbed.nodeagent.forwarder import read_forwards

    forwards = read_forwards(_testbed(name, port_base).layout)
    if not forwards:
        typer.echo(f"test bed {name}: no Service selects a pod of a process node", err=True)
        raise typer.Exit(1)
    typer.echo(_format_services(forwards))


def _format_services(forwards: Sequence[Forward]) -> str:
    """The table of ``testbed services``: one row a Service port, columns sized to the content.

    Example:
        >>> from kubedl_prefect.testbed.nodeagent.forwarder import Forward, ServicePort
        >>> print(_format_services([
        ...     Forward(ServicePort("ml", "tiny-predictor", 80), "127.0.0.1:41873",
        ...             ("169.254.124.3:8080",)),
        ...     Forward(ServicePort("ml", "x", 8080), "127.0.0.1:5", ())]))
        SERVICE               ADDRESS          PODS
        ml/tiny-predictor:80  127.0.0.1:41873  169.254.124.3:8080
        ml/x:8080             127.0.0.1:5      (none ready)
    """
    rows = [("SERVICE", "ADDRESS", "PODS")]
    for forward in forwards:
        key = forward.port
        where = f"{key.namespace}/{key.service}:{key.port}"
        rows.append((where, forward.address, ", ".join(forward.targets) or "(none ready)"))
    service_width = max(len(row[0]) for row in rows)
    address_width = max(len(row[1]) for row in rows)
    return "\n".join(
        f"{where:<{service_width}}  {address:<{address_width}}  {pods}"
        for where, address, pods in rows
    )


def _format_status(state: TestbedStatus) -> str:
    if state.stopped:
        summary = "stopped"
    elif state.up:
        summary = "up"
    else:
        summary = "degraded"
    lines = [f"test bed {state.name}: {summary}"]
    if state.up:
        lines.append(f"  API server:  {state.api_url}")
        lines.append(f"  nodes:       {state.nodes} x {state.gpus_per_node} nvidia.com/gpu")
        lines.append(f"  memory:      {state.rss_bytes / 2**20:.0f} MiB resident")
    lines.append(f"  {'COMPONENT':<26}{'PID':>8}  {'STATE':<10}{'RSS':>9}{'RESTARTS':>10}  LOG")
    for c in state.components:
        if not c.running:
            health = "held" if c.held else "stopped"
        elif c.healthy:
            health = "healthy"
        else:
            health = "unhealthy"
        pid = str(c.pid) if c.running and c.pid else "-"
        rss = f"{c.rss_bytes / 2**20:.0f} MiB" if c.running else "-"
        lines.append(f"  {c.name:<26}{pid:>8}  {health:<10}{rss:>9}{c.restarts:>10}  {c.log}")
    for c in state.components:
        if c.last_crash is not None:
            crash = c.last_crash
            when = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(crash.at))
            lines.append(f"  last crash of {c.name}: {when}, after {crash.uptime_s:.0f}s up:")
            lines += [f"    | {line}" for line in crash.log_tail.splitlines()[-5:]]
    if state.up:
        lines.append(f"KUBECONFIG={state.kubeconfig}")
    return "\n".join(lines)
