"""A real Kubernetes control plane on loopback, with simulated GPU nodes: the local test bed.

``Testbed(name).up()`` builds what is missing (see :mod:`.build`), then starts, in order and each
detached with its own log and pid file under ``cache_root()/testbed/<name>/``:

1. ``kube-apiserver-etcd``: kube-apiserver with an embedded etcd (TLS, RBAC, 127.0.0.1 only);
2. the CRDs (KubeDL, Kubeflow training, Volcano scheduling, KServe serving, Trainer, JobSet,
   kwok Logs);
3. ``kube-controller-manager``, ``kube-scheduler`` and the ``kwok`` controller with our stages
   (kwok also serves the nodes' kubelet API for container logs, see :mod:`.podlogs`);
4. the simulated nodes (default 2 x 8 ``nvidia.com/gpu``), waited on until Ready;
5. the operators (:mod:`.operators`: Volcano, KubeDL, Kubeflow's, the KServe controller,
   JobSet and Kubeflow Trainer v2) after the objects they need, then the webhook registrations
   and training runtimes written through them (:mod:`.trainer`).

It returns the path of an administrator kubeconfig. ``up`` is idempotent: on a running test bed it
only adjusts what was asked differently (nodes, operators); over a stale state folder (dead
processes) it stops what is left and starts afresh. Each fresh start begins with an empty cluster
(a copy of the etcd data saved right after the first CRD installation); certificates are kept.

For tests of failure handling, :meth:`Testbed.restart` kills one component as a crash would and
starts it again with its data (:mod:`.restarts`), and :meth:`Testbed.pod_log` says what a pod's
containers print.

The pieces live in their own modules: the control plane's components and flags in
:mod:`.controlplane`, starting one component and probing its health in :mod:`.launch`, the
processes in :mod:`.process`, what is written into the cluster in :mod:`.cluster`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import cluster, content, podlogs, process, restarts, supervise
from kubedl_prefect.testbed import operators as training_operators
from kubedl_prefect.testbed.build import GoBinary, bin_dir, build_all, last_built
from kubedl_prefect.testbed.components import (
    LOOPBACK,
    Component,
    HealthCheck,
    Identity,
    Layout,
    Ports,
    ephemeral_port_range,
)
from kubedl_prefect.testbed.controlplane import (
    ADMIN,
    APISERVER,
    APISERVER_BINARY,
    APISERVER_KUBELET_CLIENT,
    CLUSTER_NAME,
    CONTROL_PLANE,
    CONTROL_PLANE_AFTER_CRDS,
    CONTROL_PLANE_BINARIES,
    CONTROLLER_MANAGER,
    CONTROLLER_MANAGER_BINARY,
    KCM_CONTROLLERS,
    KUBELET_CLIENT_STEM,
    KWOK,
    KWOK_BINARY,
    SCHEDULER,
    SCHEDULER_BINARY,
    SERVICE_CIDR,
)
from kubedl_prefect.testbed.kubeconfig import render_kubeconfig, write_kubeconfig
from kubedl_prefect.testbed.launch import probe, start_component
from kubedl_prefect.testbed.nodeagent import component as process_node
from kubedl_prefect.testbed.pki import CertificateAuthority, service_account_key
from kubedl_prefect.testbed.podlogs import PodLog
from kubedl_prefect.testbed.upstream import KWOK as KWOK_MODULE

__all__ = [
    # The control plane's rows, binaries and names, defined in .controlplane (imported from
    # here before it existed).
    "ADMIN",
    "APISERVER",
    "APISERVER_BINARY",
    "APISERVER_KUBELET_CLIENT",
    "CLUSTER_NAME",
    "CONTROLLER_MANAGER",
    "CONTROLLER_MANAGER_BINARY",
    "CONTROL_PLANE",
    "CONTROL_PLANE_AFTER_CRDS",
    "CONTROL_PLANE_BINARIES",
    "DEFAULT_GPUS_PER_NODE",
    "DEFAULT_NODES",
    "KCM_CONTROLLERS",
    "KWOK",
    "KWOK_BINARY",
    "SCHEDULER",
    "SCHEDULER_BINARY",
    "SERVICE_CIDR",
    "ComponentStatus",
    "Testbed",
    "TestbedStatus",
]

logger = logging.getLogger(__name__)

DEFAULT_NODES = 2
DEFAULT_GPUS_PER_NODE = 8


def recorded_port_base(name: str) -> int | None:
    """The port base test bed ``name`` was started with, while its state says it runs.

    ``up`` writes it into the state folder before the first component starts and ``down``
    removes it, so ``status``, ``down`` and ``restart`` find a test bed by its name alone.
    """
    try:
        state = json.loads((Layout(name=name, ports=Ports()).root / "state.json").read_text())
        base = state["ports_base"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return base if isinstance(base, int) and 1024 <= base <= 65400 else None


@dataclass(frozen=True)
class ComponentStatus:
    """State of one component process.

    Attributes:
        name: Component name.
        pid: Its pid, when a pid file exists.
        running: The process is alive.
        healthy: Its health check answers (``None``: not checked because it is not running).
        rss_bytes: Its resident memory.
        log: Its log file.
        restarts: How often the supervisor started it again after it exited (operators only).
        last_crash: Its last exit nobody asked for, if any.
        held: Stopped on purpose with :meth:`Testbed.stop`.
    """

    name: str
    pid: int | None
    running: bool
    healthy: bool | None
    rss_bytes: int
    log: Path
    restarts: int = 0
    last_crash: supervise.Crash | None = None
    held: bool = False


@dataclass(frozen=True)
class TestbedStatus:
    """State of a test bed.

    Attributes:
        name: Test bed name.
        kubeconfig: The administrator kubeconfig.
        api_url: URL of the API server.
        components: One entry per component.
        nodes: Number of simulated nodes it was started with (0 when never started).
        gpus_per_node: GPUs per node it was started with.
        operators: Whether the training operators are part of it.
        process_node: Whether it has a process node (see :mod:`.nodeagent`).
    """

    __test__ = False  # not a pytest test class

    name: str
    kubeconfig: Path
    api_url: str
    components: tuple[ComponentStatus, ...]
    nodes: int
    gpus_per_node: int
    operators: bool
    process_node: bool = False

    @property
    def up(self) -> bool:
        """Every component runs and answers its health check."""
        return bool(self.components) and all(c.running and c.healthy for c in self.components)

    @property
    def stopped(self) -> bool:
        """No component runs."""
        return not any(c.running for c in self.components)

    @property
    def rss_bytes(self) -> int:
        """Resident memory of all components together."""
        return sum(c.rss_bytes for c in self.components)


class Testbed:
    """One local test bed, addressed by name.

    Args:
        name: Name of the test bed; its state lives in ``cache_root()/testbed/<name>/``.
        nodes: Number of simulated GPU nodes (default 2). ``None``: on a running test bed keep
            what it has.
        gpus_per_node: ``nvidia.com/gpu`` capacity of each node (default 8); ``None`` as above.
        ports: Ports to listen on (default: the base this test bed was started with, while its
            state folder says it runs; else :meth:`Ports.default`).
        operators: Start the training operators too (default: yes).
        process_node: Run a process node (``process-node-0``), whose pods run as processes of
            this machine (see docs/testbed.md, "Process nodes"). ``None`` (the default): on a
            running test bed keep what it has, else none.

    Example:
        >>> bed = Testbed()  # doctest: +SKIP
        >>> kubeconfig = bed.up()  # doctest: +SKIP
        >>> bed.status().up  # doctest: +SKIP
        True
        >>> bed.down()  # doctest: +SKIP
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        name: str = "default",
        *,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        ports: Ports | None = None,
        operators: bool = True,
        process_node: bool | None = None,
    ):
        if nodes is not None and nodes < 1:
            raise TestbedError(f"a test bed needs at least one node, got {nodes}")
        if gpus_per_node is not None and gpus_per_node < 0:
            raise TestbedError(f"gpus per node cannot be negative, got {gpus_per_node}")
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise TestbedError(f"test bed name must be alphanumeric (with - or _), got {name!r}")
        recorded = recorded_port_base(name)
        if ports is None:
            ports = Ports(recorded) if recorded is not None else Ports.default()
        self.layout = Layout(name=name, ports=ports)
        self._recorded_base = recorded
        self._requested_nodes = nodes
        self._requested_gpus = gpus_per_node
        self.nodes = DEFAULT_NODES if nodes is None else nodes
        self.gpus_per_node = DEFAULT_GPUS_PER_NODE if gpus_per_node is None else gpus_per_node
        self.operators = operators
        self._requested_process_node = process_node
        self.process_node = bool(process_node)

    @property
    def name(self) -> str:
        """Name of the test bed."""
        return self.layout.name

    @property
    def kubeconfig(self) -> Path:
        """Path of the administrator kubeconfig (valid while the test bed is up)."""
        return self.layout.admin_kubeconfig

    def components(self) -> list[Component]:
        """Every process of this test bed, in start order."""
        found = list(CONTROL_PLANE)
        if self.operators:
            found += training_operators.OPERATOR_COMPONENTS
        return found

    def binaries(self) -> list[GoBinary]:
        """Every binary this test bed runs, in build order."""
        found = list(CONTROL_PLANE_BINARIES)
        if self.operators:
            found += training_operators.OPERATOR_BINARIES
        return found

    def crd_sources(self) -> tuple[content.CrdSource, ...]:
        """The CRDs this test bed installs: kwok's, and the operators' when it runs them.

        Without the operators none of their modules is downloaded or built (``testbed up
        --no-operators`` needs only the control plane's).
        """
        if self.operators:
            return content.CRD_SOURCES
        return tuple(source for source in content.CRD_SOURCES if source.module == KWOK_MODULE)

    def build(self) -> dict[str, Path]:
        """Build every binary that is missing or out of date; return ``{name: path}``."""

        def announce(binary: GoBinary) -> None:
            logger.warning("building %s (a cold build takes minutes)...", binary.name)

        return build_all(self.binaries(), on_start=announce)

    def up(self) -> Path:
        """Start the test bed unless it is already up; return the administrator kubeconfig.

        Raises:
            TestbedError: Go is missing and a binary is not built, a build failed, a component
                did not become ready (the message ends with the tail of its log), or the test
                bed runs on other ports than asked.
        """
        self._check_go_or_built()  # fail early and clearly
        with self._locked():
            current = self.status()
            self._check_same_ports(current)
            if current.up or self._only_operators_down(current):
                logger.info("test bed %s is already up", self.name)
                self._start_operators_not_running(current)
                self._keep_running(current)
                if self.operators:
                    supervise.start(self.layout)
                return self.kubeconfig
            if not current.stopped:
                logger.warning("test bed %s is partly running: restarting it", self.name)
            self._stop_all()
            binaries = self.build()
            clash = self.layout.ports.ephemeral_clash(ephemeral_port_range())
            if clash:
                logger.warning("test bed %s: %s", self.name, clash)
            started = time.monotonic()
            self._prepare()
            self._write_state()  # its ports, for status, down and restart by name meanwhile
            try:
                self._start_apiserver_with_crds(binaries)
                for component in CONTROL_PLANE_AFTER_CRDS:
                    start_component(self.layout, component, binaries)
                self._reconcile_nodes()
                if self.operators:
                    cluster.call(self.layout, training_operators.install_prerequisites)
                for component in self.components()[len(CONTROL_PLANE) :]:
                    start_component(self.layout, component, binaries)
                if self.operators:
                    self._install_after_start()
                if self.process_node:
                    self._start_process_node()
            except BaseException:
                self._stop_all()
                raise
            self._write_state()
            if self.operators:
                supervise.start(self.layout)
            logger.info("test bed %s up in %.1fs", self.name, time.monotonic() - started)
            return self.kubeconfig

    def _check_go_or_built(self) -> None:
        """Without ``go`` on PATH, every binary must be built already (it is then used as is)."""
        if shutil.which("go") is not None:
            return
        missing = [binary.name for binary in self.binaries() if last_built(binary) is None]
        if missing:
            raise TestbedError(
                f"no `go` command was found on PATH, and {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not built in {bin_dir()}",
                hint="install Go 1.26 (https://go.dev/dl/) and make sure `go` is on PATH, or "
                "run `kubedl-prefect testbed build` where Go is, with the same cache "
                "(KUBEDL_PREFECT_CACHE)",
            )

    def _check_same_ports(self, current: TestbedStatus) -> None:
        """Refuse to start over a running test bed whose ports are not the ones asked for."""
        recorded = self._recorded_base
        if recorded is None or recorded == self.layout.ports.base:
            return
        if any(c.running for c in current.components):
            raise TestbedError(
                f"test bed {self.name} runs on port base {recorded}, not {self.layout.ports.base}",
                hint=f"leave --port-base out to use it, or stop it first "
                f"(kubedl-prefect testbed down --name {self.name})",
            )

    @staticmethod
    def _only_operators_down(current: TestbedStatus) -> bool:
        # The control plane runs: operators that crashed (their supervisor is backing off) or
        # were stopped on purpose are no reason to start the whole test bed over.
        operators = {c.name for c in training_operators.OPERATOR_COMPONENTS}
        operators.add(process_node.AGENT.name)
        control_plane = [c for c in current.components if c.name not in operators]
        return bool(control_plane) and all(c.running and c.healthy for c in control_plane)

    def _start_operators_not_running(self, current: TestbedStatus) -> None:
        agent = next((c for c in current.components if c.name == process_node.AGENT.name), None)
        if agent is not None and not agent.running:
            logger.warning("the process node of test bed %s is down: starting it", self.name)
            self._start_process_node()
        operators = {c.name: c for c in training_operators.OPERATOR_COMPONENTS}
        down = [c for c in current.components if c.name in operators and not c.running]
        if not any(not c.held for c in down):
            return
        binaries = build_all(training_operators.OPERATOR_BINARIES)
        if any(c.pid is None for c in down):
            # An operator this test bed never ran (one added since it started, such as the
            # KServe controller): its CRDs and prerequisites may be missing. Both converge.
            cluster.call(self.layout, cluster.apply_crds, content.crd_manifests())
            cluster.call(self.layout, training_operators.install_prerequisites)
        for entry in down:
            if not entry.held:
                logger.warning("%s of test bed %s is down: starting it", entry.name, self.name)
                start_component(self.layout, operators[entry.name], binaries)
        if any(c.pid is None for c in down):
            self._install_after_start()

    def _keep_running(self, current: TestbedStatus) -> None:
        """Adjust a running test bed to what was asked of this instance, if anything."""
        self.nodes = self._requested_nodes or current.nodes or DEFAULT_NODES
        if self._requested_gpus is not None:
            self.gpus_per_node = self._requested_gpus
        elif current.nodes:
            self.gpus_per_node = current.gpus_per_node
        changed = False
        if (self.nodes, self.gpus_per_node) != (current.nodes, current.gpus_per_node):
            self._reconcile_nodes()
            changed = True
        if self.operators and not current.operators:
            binaries = self.build()
            # Started without the operators, it lacks their CRDs too.
            cluster.call(self.layout, cluster.apply_crds, content.crd_manifests(self.crd_sources()))
            cluster.call(self.layout, training_operators.install_prerequisites)
            for component in training_operators.OPERATOR_COMPONENTS:
                start_component(self.layout, component, binaries)
            self._install_after_start()
            changed = True
        else:
            self.operators = current.operators
        if self._requested_process_node and not current.process_node:
            self.process_node = True
            self._start_process_node()
            changed = True
        else:
            self.process_node = current.process_node
        if changed:
            self._write_state()

    def down(self) -> None:
        """Stop every component (API server before etcd) and drop the cluster's data."""
        with self._locked():
            self._stop_all()

    def status(self) -> TestbedStatus:
        """Which components run and answer their health checks."""
        state = self._read_state()
        with_operators = bool(state.get("operators", self.operators))
        with_process_node = bool(state.get("process_node", False))
        components = list(CONTROL_PLANE)
        if with_operators:
            components += training_operators.OPERATOR_COMPONENTS
        if with_process_node:
            components.append(process_node.AGENT)
        entries = []
        supervised = supervise.load(self.layout)
        for component in components:
            known = supervised.get(component.name, supervise.Supervised())
            record = process.read(self.layout.pid_file(component.name))
            running = record is not None and process.is_alive(record)
            healthy: bool | None = None
            if running and component.health is not None:
                healthy = probe(component.health(self.layout), self.layout)
            elif running:
                healthy = True
            entries.append(
                ComponentStatus(
                    name=component.name,
                    pid=record.pid if record else None,
                    running=running,
                    healthy=healthy,
                    rss_bytes=process.rss_bytes(record) if record and running else 0,
                    log=self.layout.log_file(component.name),
                    restarts=known.restarts,
                    last_crash=known.last_crash,
                    held=known.held,
                )
            )
        return TestbedStatus(
            name=self.name,
            kubeconfig=self.kubeconfig,
            api_url=self.layout.apiserver_url,
            components=tuple(entries),
            nodes=int(state.get("nodes", 0)),
            gpus_per_node=int(state.get("gpus_per_node", 0)),
            operators=with_operators,
            process_node=with_process_node,
        )

    def create_namespace(self, name: str, *, labels: dict[str, str] | None = None) -> str:
        """Create namespace ``name`` and wait until pods can be created in it; return ``name``."""
        cluster.call(self.layout, cluster.create_namespace, name, labels=labels)
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete namespace ``name`` (its objects are removed in the background)."""
        cluster.call(self.layout, cluster.delete_namespace, name)

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        rules: Sequence[dict[str, Any]],
        *,
        path: Path | None = None,
        expiration_seconds: int = 3600,
    ) -> Path:
        """A kubeconfig for a new ServiceAccount allowed only ``rules`` (a Role) in ``namespace``.

        For least-privilege tests: the kubeconfig authenticates with a bound token from the
        TokenRequest API and defaults to ``namespace``.

        Args:
            namespace: Namespace of the account, its Role and RoleBinding.
            name: Name of all three.
            rules: The Role's ``rules`` (``[{"apiGroups": [""], "resources": ["pods"],
                "verbs": ["get", "list"]}]``).
            path: Where to write the kubeconfig (default: in the test bed's config folder).
            expiration_seconds: Lifetime of the token.

        Returns:
            The kubeconfig's path.
        """
        token = cluster.call(
            self.layout,
            cluster.service_account_token,
            namespace,
            name,
            rules,
            expiration_seconds=expiration_seconds,
        )
        target = path or self.layout.config_dir / "serviceaccounts" / f"{namespace}.{name}.yaml"
        user = f"system:serviceaccount:{namespace}:{name}"
        document = render_kubeconfig(
            cluster=CLUSTER_NAME,
            server=self.layout.apiserver_url,
            ca_file=self.layout.ca_file,
            user=user,
            token=token,
            namespace=namespace,
        )
        return write_kubeconfig(target, document)

    def restart(self, component: str, *, timeout: float = 90.0, dependents: bool = True) -> float:
        """Kill one running component as a crash would, start it again, and return the downtime.

        The process gets SIGKILL (no clean shutdown: the API server's embedded etcd recovers
        from its write-ahead log) and is started again with the same command line and the same
        data, then waited on until it answers its health check. Clients see what they would on
        a real cluster: connections break (open watches, followed logs through kwok's server),
        and reconnecting works once it is back; objects persist.

        After an API server crash the other components reconnect by themselves, but slowly:
        client-go backs off up to 30 s (60 s with jitter) between attempts, and the new API
        server refuses them for a few seconds while its RBAC caches fill, so the scheduler,
        kwok and the operators may do nothing for up to a minute. With ``dependents`` (the
        default) they are therefore stopped (cleanly) while it is down and started again once
        it is back: the test bed works again as soon as this returns.

        Args:
            component: A component's name (``kube-apiserver``, ``kwok``, ... see
                :meth:`components`).
            timeout: How long it may take to become healthy again.
            dependents: After ``kube-apiserver``, restart the components that talk to it.

        Returns:
            Seconds from the kill until it was healthy again (not counting the dependents).

        Raises:
            TestbedError: Unknown component, it is not running, or it did not come back (the
                message ends with the tail of its log).
        """
        known = {c.name: c for c in self._all_known_components()}
        if component not in known:
            raise TestbedError(
                f"unknown test-bed component {component!r}",
                hint=f"one of: {', '.join(known)}",
            )
        with self._locked():
            return restarts.crash_and_restart(
                self.layout,
                known[component],
                components=self._all_known_components(),
                binaries=[*CONTROL_PLANE_BINARIES, *training_operators.OPERATOR_BINARIES],
                timeout=timeout,
                dependents=dependents,
            )

    def stop(self, component: str) -> None:
        """Stop one operator cleanly and keep it stopped (its supervisor leaves it alone).

        For tests of what clients see while an operator is down for longer than a restart;
        :meth:`start` brings it back. Only the supervised components (the operators) can be
        stopped this way: without the control plane there is no test bed.

        Args:
            component: ``kubedl-operator``, ``training-operator``, ``volcano-scheduler`` or
                ``kserve-controller``.

        Raises:
            TestbedError: Not an operator.

        Example:
            >>> bed = Testbed()  # doctest: +SKIP
            >>> bed.stop("kubedl-operator")  # doctest: +SKIP
            >>> bed.start("kubedl-operator")  # doctest: +SKIP
        """
        target = self._operator(component)
        with self._locked():
            supervise.hold(self.layout, target.name, True)
            record = process.read(self.layout.pid_file(target.name))
            if record is not None and process.is_alive(record):
                process.stop(record)
            logger.info("stopped %s of test bed %s", target.name, self.name)

    def start(self, component: str, *, timeout: float = 90.0) -> None:
        """Start an operator stopped with :meth:`stop` (or crashed) and wait until it is ready.

        A no-op when it already runs; either way the supervisor restarts it again after crashes.

        Args:
            component: An operator's name, as for :meth:`stop`.
            timeout: How long it may take to become healthy.

        Raises:
            TestbedError: Not an operator, or it did not become ready (with its log's tail).
        """
        target = self._operator(component)
        with self._locked():
            record = process.read(self.layout.pid_file(target.name))
            if record is None or not process.is_alive(record):
                binaries = build_all(training_operators.OPERATOR_BINARIES)
                start_component(self.layout, target, binaries, timeout=timeout)
            supervise.hold(self.layout, target.name, False)

    def start_process_node(self) -> None:
        """Start the process node (``process-node-0``) on this running test bed, if it is down.

        It is then part of the test bed (``status``, the supervisor, ``down``) until ``down``.

        Raises:
            TestbedError: It did not become Ready (see its log, ``logs/process-node-agent.log``).
        """
        with self._locked():
            supervise.hold(self.layout, process_node.AGENT.name, False)
            record = process.read(self.layout.pid_file(process_node.AGENT.name))
            if record is None or not process.is_alive(record):
                self._start_process_node()
            state = self._read_state()
            state["process_node"] = True
            (self.layout.root / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    def stop_process_node(self, *, crash: bool = False) -> None:
        """Stop the process node and remove what it made, as ``down`` does; keep it stopped.

        Args:
            crash: Kill its agent (SIGKILL) instead of stopping it, so that it cannot clean up
                itself: what is left is then removed as ``down`` removes it.
        """
        with self._locked():
            supervise.hold(self.layout, process_node.AGENT.name, True)
            record = process.read(self.layout.pid_file(process_node.AGENT.name))
            if record is not None and process.is_alive(record):
                (process.kill if crash else process.stop)(record)
            process_node.teardown(self.layout)

    def _operator(self, component: str) -> Component:
        known = {c.name: c for c in training_operators.OPERATOR_COMPONENTS}
        if component not in known:
            raise TestbedError(
                f"{component!r} cannot be stopped or started on its own",
                hint=f"one of: {', '.join(known)}",
            )
        return known[component]

    def pod_log(
        self, namespace: str, pod: str, container: str = "main", *, timeout: float = 30.0
    ) -> PodLog:
        """The log of ``container`` in ``namespace/pod``, to write what it prints.

        Creates (or extends) the pod's kwok ``Logs`` object so that the API server's
        ``.../pods/<pod>/log?container=<container>`` reads a file of ours, and waits until kwok
        serves it. The pod need not exist yet (a training job's pod names are known in advance,
        e.g. ``<job>-worker-1``). Calling it again returns the same log, its lines kept. The
        file lives until the test bed is stopped; deleting the namespace deletes the object.

        Example:
            >>> log = bed.pod_log("team-a", "mnist-worker-0", "pytorch")  # doctest: +SKIP
            >>> log.write("epoch 1 loss=0.3", "epoch 2 loss=0.2")  # doctest: +SKIP

        Args:
            namespace: The pod's namespace (it must exist).
            pod: The pod's name.
            container: The container's name.
            timeout: How long kwok may take to pick the configuration up.

        Raises:
            TestbedError: The object could not be written, or kwok did not serve it in time.
        """
        path = podlogs.pod_log_path(self.layout.pod_logs_dir, namespace, pod, container)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        podlogs.previous_path(path).touch()
        cluster.call(
            self.layout, cluster.ensure_pod_log, namespace, pod, container, path, self._empty_log
        )
        # kwok answers previous=true only for containers it has a Logs entry for (see
        # podlogs.logs_manifest): once it does, the API server reads our file.
        url = (
            f"http://{LOOPBACK}:{self.layout.ports.kwok}/containerLogs/"
            f"{namespace}/{pod}/{container}?previous=true"
        )
        deadline = time.monotonic() + timeout
        while not probe(HealthCheck(url), self.layout):
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"kwok did not pick up the log of {namespace}/{pod}/{container} in "
                    f"{timeout:.0f}s; last lines of {self.layout.log_file(KWOK.name)}:\n"
                    f"{process.log_tail(self.layout.log_file(KWOK.name))}"
                )
            time.sleep(0.05)
        return PodLog(namespace=namespace, pod=pod, container=container, path=path)

    # -- internals ---------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with (self.layout.root / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _prepare(self) -> None:
        layout = self.layout
        shutil.rmtree(layout.data_dir, ignore_errors=True)
        if layout.logs_dir.is_dir():
            previous = layout.logs_dir / "previous"
            shutil.rmtree(previous, ignore_errors=True)
            previous.mkdir(parents=True)
            for log in layout.logs_dir.glob("*.log"):
                log.rename(previous / log.name)
        for folder in (layout.logs_dir, layout.run_dir, layout.config_dir, layout.data_dir):
            folder.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority(layout.pki_dir)
        ca.serving()
        service_account_key(layout.pki_dir)
        identities = {ADMIN.user: ADMIN}
        identities.update({c.identity.user: c.identity for c in self.components() if c.identity})
        if self.process_node and process_node.AGENT.identity is not None:
            identities[process_node.AGENT.identity.user] = process_node.AGENT.identity
        for identity in identities.values():
            self._issue_kubeconfig(ca, identity)
        ca.client(APISERVER_KUBELET_CLIENT, KUBELET_CLIENT_STEM)
        shutil.rmtree(layout.pod_logs_dir, ignore_errors=True)
        layout.pod_logs_dir.mkdir(parents=True)
        self._empty_log.touch()
        documents = [
            content.kwok_configuration(node_port=layout.ports.kwok),
            podlogs.default_cluster_logs(self._empty_log),
        ]
        (layout.config_dir / "kwok.yaml").write_text(yaml.safe_dump_all(documents))

    def _issue_kubeconfig(self, ca: CertificateAuthority, identity: Identity) -> None:
        """A client certificate for ``identity`` and its kubeconfig."""
        layout = self.layout
        cert = ca.client(identity, "admin" if identity == ADMIN else None)
        path = layout.admin_kubeconfig if identity == ADMIN else layout.kubeconfig(identity.user)
        write_kubeconfig(
            path,
            render_kubeconfig(
                cluster=CLUSTER_NAME,
                server=layout.apiserver_url,
                ca_file=layout.ca_file,
                user=identity.user,
                client_cert=cert,
            ),
        )

    @property
    def _empty_log(self) -> Path:
        return self.layout.pod_logs_dir / "empty.log"

    def _start_apiserver_with_crds(self, binaries: dict[str, Path]) -> None:
        """Start the API server on a fresh etcd that already holds the CRDs.

        Installing ~10 MB of CRDs takes the API server tens of seconds, so the first start saves
        its etcd data right after (the *seed*, under ``seed/``, keyed by the API server binary,
        the CRD files and the ports) and later starts begin from a copy of it: a fresh cluster
        with the CRDs established.
        """
        layout = self.layout
        seed = layout.root / "seed"
        key = self._seed_key(binaries)
        if (seed / "key").is_file() and (seed / "key").read_text() == key:
            shutil.rmtree(layout.data_dir, ignore_errors=True)
            shutil.copytree(seed / "etcd", layout.data_dir)
            start_component(layout, APISERVER, binaries)
            self._install_crds(seeded=True)
            return
        start_component(layout, APISERVER, binaries)
        self._install_crds(seeded=False)
        # Stop it (nothing else is connected yet, so it exits at once), keep a copy, restart.
        record = process.read(layout.pid_file(APISERVER.name))
        if record is not None:
            process.stop(record)
        partial = layout.root / ".seed.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(layout.data_dir, partial / "etcd")
        (partial / "key").write_text(key)
        shutil.rmtree(seed, ignore_errors=True)
        partial.rename(seed)
        logger.info("saved the CRDs' etcd state as the seed of later starts")
        start_component(layout, APISERVER, binaries)

    def _seed_key(self, binaries: dict[str, Path]) -> str:
        digest = hashlib.sha256()
        ports = self.layout.ports
        digest.update(
            f"{binaries[APISERVER.binary].name}:{ports.etcd_client}:{ports.etcd_peer}".encode()
        )
        for path in content.crd_files(self.crd_sources()):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()

    def _stop_all(self) -> None:
        # The supervisor first (it would start the operators again), then reverse start order:
        # operators and controllers first, the API server (with its embedded etcd, which it
        # closes after itself) last.
        supervise.stop(self.layout)
        supervise.state_path(self.layout).unlink(missing_ok=True)
        for component in reversed(self._all_known_components()):
            pid_file = self.layout.pid_file(component.name)
            record = process.read(pid_file)
            if record is not None:
                process.stop(record)
                logger.info("stopped %s", component.name)
            pid_file.unlink(missing_ok=True)
        # What the process node's agent made and could not remove itself (it was killed).
        process_node.teardown(self.layout)
        shutil.rmtree(self.layout.data_dir, ignore_errors=True)
        shutil.rmtree(self.layout.pod_logs_dir, ignore_errors=True)
        (self.layout.root / "state.json").unlink(missing_ok=True)

    def _start_process_node(self) -> None:
        """Start the process node's agent and wait until its Node is Ready."""
        identity = process_node.AGENT.identity
        if identity is not None and not self.layout.kubeconfig(identity.user).is_file():
            self._issue_kubeconfig(CertificateAuthority(self.layout.pki_dir), identity)
        started = time.monotonic()
        start_component(self.layout, process_node.AGENT, process_node.binaries())
        cluster.call(self.layout, process_node.wait_ready)
        logger.info("process node ready in %.1fs", time.monotonic() - started)

    def _all_known_components(self) -> list[Component]:
        # Stop operators even when this instance was made with operators=False; the process
        # node's agent last in start order, so first to stop.
        return [*CONTROL_PLANE, *training_operators.OPERATOR_COMPONENTS, process_node.AGENT]

    def _install_after_start(self) -> None:
        # Webhook registrations and Trainer's runtimes: written through the running operators.
        started = time.monotonic()
        cluster.call(self.layout, training_operators.install_after_start, self.layout)
        logger.info("webhooks and training runtimes in %.1fs", time.monotonic() - started)

    def _install_crds(self, *, seeded: bool) -> None:
        started = time.monotonic()
        sources = self.crd_sources()
        if seeded:
            names = cluster.call(
                self.layout, cluster.wait_crds_established, content.crd_names(sources)
            )
        else:
            names = cluster.call(self.layout, cluster.apply_crds, content.crd_manifests(sources))
        logger.info("%d CRDs established in %.1fs", len(names), time.monotonic() - started)

    def _reconcile_nodes(self) -> None:
        started = time.monotonic()
        cluster.call(
            self.layout, cluster.ensure_nodes, count=self.nodes, gpus_per_node=self.gpus_per_node
        )
        cluster.call(self.layout, cluster.wait_default_service_account)
        logger.info(
            "%d nodes with %d GPUs each ready in %.1fs",
            self.nodes,
            self.gpus_per_node,
            time.monotonic() - started,
        )

    def _write_state(self) -> None:
        state = {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "operators": self.operators,
            "process_node": self.process_node,
            "ports_base": self.layout.ports.base,
            "api_url": self.layout.apiserver_url,
            "kubeconfig": str(self.kubeconfig),
        }
        (self.layout.root / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    def _read_state(self) -> dict[str, Any]:
        try:
            data = json.loads((self.layout.root / "state.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
