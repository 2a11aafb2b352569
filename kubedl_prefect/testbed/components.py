"""What a test-bed component is: a built binary, its command line, and how to tell it is healthy.

The control plane (:mod:`kubedl_prefect.testbed.testbed`) and the training operators
(:mod:`kubedl_prefect.testbed.operators`) describe their processes with the same
:class:`Component` rows; the runner starts them in order, detached, with a log file and a pid file
each under the test bed's state folder (:class:`Layout`), and waits on their health checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kubedl_prefect.testbed.upstream import cache_root

#: Every component listens on this address only.
LOOPBACK = "127.0.0.1"

#: Default first port of a test bed; each component sits at a fixed offset from it.
DEFAULT_PORT_BASE = 28400


#: Where Linux says which ports it gives to outgoing connections.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_port_range(path: Path | None = None) -> tuple[int, int] | None:
    """This machine's ephemeral port range (low, high), or None where the kernel does not say.

    Args:
        path: The file to read; :data:`EPHEMERAL_RANGE_FILE` when None.
    """
    try:
        text = (EPHEMERAL_RANGE_FILE if path is None else path).read_text()
        low, high = (int(word) for word in text.split())
    except (OSError, ValueError):
        return None
    return low, high


def _suggested_base(low: int, high: int) -> int:
    """A base whose hundred ports sit outside ``low``-``high``: the default, or just past it."""
    if not Ports().reaches_into(low, high):
        return DEFAULT_PORT_BASE + 100
    return high + 1 if high + 100 <= 65535 else max(1024, low - 100)


@dataclass(frozen=True)
class Ports:
    """Ports of one test bed, all on 127.0.0.1, at fixed offsets from ``base``.

    The default base (28400) is away from the usual development-server ports and below the Linux
    ephemeral range (32768-60999), so an outgoing connection never holds one of our ports. A second
    test bed takes another base (e.g. 28500); ``$KUBEDL_PREFECT_TESTBED_PORT_BASE`` overrides the
    default.

    Attributes:
        base: The first port; operators use :meth:`offset` for their own ports.
    """

    base: int = DEFAULT_PORT_BASE

    @classmethod
    def default(cls) -> Ports:
        """Ports from ``$KUBEDL_PREFECT_TESTBED_PORT_BASE``, else from :data:`DEFAULT_PORT_BASE`."""
        raw = os.environ.get("KUBEDL_PREFECT_TESTBED_PORT_BASE")
        return cls(int(raw)) if raw else cls()

    @property
    def last(self) -> int:
        """The last port a component may take (``base + 99``)."""
        return self.offset(99)

    def reaches_into(self, low: int, high: int) -> bool:
        """Whether any of these ports lies in ``low``-``high`` (both included)."""
        return self.base <= high and self.last >= low

    def ephemeral_clash(self, ephemeral: tuple[int, int] | None) -> str | None:
        """Why these ports can be taken by outgoing connections, or None when they cannot.

        Linux hands ports of its ephemeral range to outgoing connections; a component that starts
        while one of them holds its port cannot listen and exits during start-up.

        Args:
            ephemeral: The machine's ephemeral range, low and high, as
                :func:`ephemeral_port_range` reads it; None where it is not known.

        Example:
            >>> print(Ports(34400).ephemeral_clash((32768, 60999)))  # doctest: +ELLIPSIS
            ports 34400-34499 lie in ... (32768-60999): ...; take a base such as 28500
            >>> Ports(28400).ephemeral_clash((32768, 60999)) is None
            True
        """
        if ephemeral is None:
            return None
        low, high = ephemeral
        if not self.reaches_into(low, high):
            return None
        return (
            f"ports {self.base}-{self.last} lie in this machine's ephemeral port range "
            f"({low}-{high}): an outgoing connection can hold one of them and the component "
            f"listening on it then fails to start; take a base such as "
            f"{_suggested_base(low, high)}"
        )

    def offset(self, n: int) -> int:
        """The port ``base + n`` (0 <= n < 100)."""
        if not 0 <= n < 100:
            raise ValueError(f"port offset must be in [0, 100), got {n}")
        return self.base + n

    @property
    def apiserver(self) -> int:
        """HTTPS port of kube-apiserver."""
        return self.offset(43)

    @property
    def etcd_client(self) -> int:
        """Plain-HTTP client port of the embedded etcd (loopback only)."""
        return self.offset(79)

    @property
    def etcd_peer(self) -> int:
        """Peer port of the embedded etcd (single member; bound but unused)."""
        return self.offset(80)

    @property
    def controller_manager(self) -> int:
        """HTTPS port of kube-controller-manager (health and metrics)."""
        return self.offset(57)

    @property
    def scheduler(self) -> int:
        """HTTPS port of kube-scheduler (health and metrics)."""
        return self.offset(59)

    @property
    def kwok(self) -> int:
        """Port of the kwok controller: HTTP health and metrics, HTTPS kubelet API (logs)."""
        return self.offset(47)


@dataclass(frozen=True)
class Layout:
    """Where one test bed keeps its state: ``cache_root()/testbed/<name>/``.

    Attributes:
        name: Name of the test bed (several may coexist with different ports).
        ports: Its ports.
    """

    name: str = "default"
    ports: Ports = field(default_factory=Ports.default)

    @property
    def root(self) -> Path:
        """The state folder."""
        return cache_root() / "testbed" / self.name

    @property
    def pki_dir(self) -> Path:
        """Certificates and keys (kept across ``down``/``up``)."""
        return self.root / "pki"

    @property
    def logs_dir(self) -> Path:
        """One ``<component>.log`` per component."""
        return self.root / "logs"

    @property
    def run_dir(self) -> Path:
        """One ``<component>.pid`` per running component."""
        return self.root / "run"

    @property
    def data_dir(self) -> Path:
        """The etcd data (wiped by ``down``: each ``up`` starts an empty cluster)."""
        return self.root / "etcd"

    @property
    def config_dir(self) -> Path:
        """Generated configuration files (kubeconfigs, kwok configuration)."""
        return self.root / "config"

    @property
    def pod_logs_dir(self) -> Path:
        """What the simulated containers print: CRI-format files that kwok serves.

        See :mod:`.podlogs`; wiped with the cluster's data.
        """
        return self.root / "pod-logs"

    @property
    def admin_kubeconfig(self) -> Path:
        """The kubeconfig of the cluster administrator (``system:masters``)."""
        return self.root / "kubeconfig"

    def kubeconfig(self, user: str) -> Path:
        """The kubeconfig a component authenticates with (client certificate ``CN=user``)."""
        return self.config_dir / f"{user}.kubeconfig"

    def log_file(self, component: str) -> Path:
        """Log file of ``component``."""
        return self.logs_dir / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        """Pid file of ``component``."""
        return self.run_dir / f"{component}.pid"

    @property
    def apiserver_url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    @property
    def admin_cert_file(self) -> Path:
        """Client certificate of the administrator (``system:masters``)."""
        return self.pki_dir / "admin.crt"

    @property
    def admin_key_file(self) -> Path:
        """Key of :attr:`admin_cert_file`."""
        return self.pki_dir / "admin.key"

    @property
    def ca_file(self) -> Path:
        """The cluster CA certificate (signs serving and client certificates)."""
        return self.pki_dir / "ca.crt"


@dataclass(frozen=True)
class Identity:
    """A client certificate identity, issued by the test bed's CA for a component's kubeconfig.

    Attributes:
        user: Common name: the Kubernetes user name.
        groups: Organisations: the user's groups (``system:masters`` bypasses RBAC).
    """

    user: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class ComponentContext:
    """What a component's command line may refer to.

    Attributes:
        layout: The test bed's state folder and ports.
        binaries: Path of every built binary, by :class:`~kubedl_prefect.testbed.build.GoBinary`
            name.
        kubeconfig: The component's own kubeconfig (for its :attr:`Component.identity`);
            ``None`` for a component without identity (the API server itself).
    """

    layout: Layout
    binaries: Mapping[str, Path]
    kubeconfig: Path | None

    @property
    def serving_cert(self) -> Path:
        """A serving certificate for 127.0.0.1/localhost signed by the cluster CA."""
        return self.layout.pki_dir / "serving.crt"

    @property
    def serving_key(self) -> Path:
        """Key of :attr:`serving_cert`."""
        return self.layout.pki_dir / "serving.key"


@dataclass(frozen=True)
class HealthCheck:
    """How to tell a component is ready: an HTTP(S) GET answering 200.

    HTTPS endpoints are verified against the cluster CA when ``verify_ca`` is set; otherwise the
    serving certificate is not checked (components that generate their own self-signed one).

    Attributes:
        url: The endpoint, e.g. ``https://127.0.0.1:28457/healthz``.
        verify_ca: Verify the server certificate against the cluster CA.
        client_cert: Present the admin client certificate (endpoints behind authentication).
    """

    url: str
    verify_ca: bool = True
    client_cert: bool = False


@dataclass(frozen=True)
class Component:
    """One process of the test bed.

    Attributes:
        name: Unique name; also names its log and pid files.
        binary: Name of the :class:`~kubedl_prefect.testbed.build.GoBinary` it runs.
        args: Builds the command-line arguments (without the binary).
        identity: Client certificate for its kubeconfig (``ComponentContext.kubeconfig``);
            ``None``: no kubeconfig.
        health: Builds its readiness check; ``None``: ready once started and still alive.
        env: Extra environment variables.
        env_from: Builds more environment variables from the context (paths in the test bed's
            folder, say); they win over ``env``.
    """

    name: str
    binary: str
    args: Callable[[ComponentContext], list[str]]
    identity: Identity | None = None
    health: Callable[[Layout], HealthCheck] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    env_from: Callable[[ComponentContext], Mapping[str, str]] | None = None
