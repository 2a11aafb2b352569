"""Pod networking on a process node: a bridge, one network namespace per pod, names in hosts.

Each test bed with process nodes owns a Linux bridge and a /24 of link-local space
(169.254.0.0/16, never a private or public range): the bridge holds ``.1`` on this machine, and
every pod gets a network namespace of its own with one end of a veth pair (the other end on the
bridge) and the address ``.2`` .. ``.254``. The host reaches every pod and pods reach each
other; no default route exists in a pod and nothing is forwarded, so no pod traffic leaves the
machine. Two pods may listen on the same port: each has its own namespace.

Names: a pod's ``/etc/hosts`` (bind-mounted over the machine's in its mount namespace) holds its
own host name (and ``<hostname>.<subdomain>.<namespace>.svc.cluster.local``) and the names of
the Services of the cluster, each resolving to the addresses of the process pods it selects
(:func:`service_endpoints`, :func:`render_hosts`, pure), rewritten in place when a Service or
a pod changes. (Endpoints cannot help: the API server refuses link-local addresses in them.)
Its ``resolv.conf`` names no reachable server, so other names fail at once.

Every name this module gives a namespace or link starts with the test bed's tag
(:func:`bed_tag`), which is how :func:`leftovers` and :func:`teardown` find them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubedl_prefect.errors import TestbedError

logger = logging.getLogger(__name__)

KubeObject = dict[str, Any]

#: Where ``ip netns`` keeps the namespaces it names.
NETNS_DIR = Path("/run/netns")
#: The cluster's DNS domain.
CLUSTER_DOMAIN = "cluster.local"


def bed_tag(name: str) -> str:
    """Six hex digits naming one test bed's links and namespaces (interface names are short).

    Example:
        >>> bed_tag("default")
        '37a8ee'
    """
    return hashlib.sha256(name.encode()).hexdigest()[:6]


def subnet(port_base: int) -> ipaddress.IPv4Network:
    """The test bed's pod network: a /24 in 169.254.100.0 .. 169.254.149.0, from its port base.

    Link-local space only, away from 169.254.169.254 (the cloud metadata address) and from the
    first and last /24 (reserved by RFC 3927).

    Example:
        >>> str(subnet(28400)), str(subnet(30400))
        ('169.254.134.0/24', '169.254.104.0/24')
    """
    third = 100 + (port_base // 100) % 50
    return ipaddress.IPv4Network(f"169.254.{third}.0/24")


@dataclass(frozen=True)
class BedNetwork:
    """The names and addresses of one test bed's pod network.

    Attributes:
        tag: :func:`bed_tag` of the test bed.
        network: Its /24.
    """

    tag: str
    network: ipaddress.IPv4Network

    @property
    def bridge(self) -> str:
        """The bridge's name."""
        return f"kdpb{self.tag}"

    @property
    def gateway(self) -> str:
        """The bridge's own address (this machine, seen from the pods)."""
        return str(self.network.network_address + 1)

    @property
    def slots(self) -> int:
        """How many pods may have an address at once."""
        return self.network.num_addresses - 3

    def address(self, slot: int) -> str:
        """The address of pod slot ``slot`` (0-based)."""
        if not 0 <= slot < self.slots:
            raise TestbedError(f"pod slot {slot} is outside the pod network {self.network}")
        return str(self.network.network_address + 2 + slot)

    def netns(self, slot: int) -> str:
        """The network namespace of slot ``slot``."""
        return f"kdp-{self.tag}-{slot}"

    def veth(self, slot: int) -> str:
        """The host end of slot ``slot``'s veth pair (the pod's end is ``eth0``)."""
        return f"kdpv{self.tag}{slot}"

    def owns_link(self, name: str) -> bool:
        """Whether link ``name`` is one of this network's."""
        return name == self.bridge or name.startswith(f"kdpv{self.tag}")

    def owns_netns(self, name: str) -> bool:
        """Whether network namespace ``name`` is one of this network's."""
        return name.startswith(f"kdp-{self.tag}-")


def free_slot(used: Iterable[int], slots: int) -> int:
    """The lowest slot not in ``used``.

    Raises:
        TestbedError: All are used.
    """
    taken = set(used)
    for slot in range(slots):
        if slot not in taken:
            return slot
    raise TestbedError(f"all {slots} pod addresses of the process node are in use")


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


def ensure_bridge(net: BedNetwork) -> None:
    """Create the bridge with the gateway address (no-op when it exists)."""
    if _ip("link", "show", net.bridge, check=False):
        return
    _ip("link", "add", net.bridge, "type", "bridge")
    _ip("addr", "add", f"{net.gateway}/{net.network.prefixlen}", "dev", net.bridge)
    _ip("link", "set", net.bridge, "up")


def add_pod_network(net: BedNetwork, slot: int) -> str:
    """Create slot ``slot``'s namespace, veth pair and address; return the namespace's path."""
    name = net.netns(slot)
    delete_pod_network(net, slot)  # a leftover of an earlier run
    _ip("netns", "add", name)
    veth = net.veth(slot)
    _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
    _ip("link", "set", f"{veth}p", "netns", name)
    _ip("link", "set", veth, "master", net.bridge)
    _ip("link", "set", veth, "up")
    _ip("link", "set", f"{veth}p", "name", "eth0", netns=name)
    _ip("addr", "add", f"{net.address(slot)}/{net.network.prefixlen}", "dev", "eth0", netns=name)
    _ip("link", "set", "eth0", "up", netns=name)
    _ip("link", "set", "lo", "up", netns=name)
    return str(NETNS_DIR / name)


def delete_pod_network(net: BedNetwork, slot: int) -> None:
    """Remove slot ``slot``'s namespace (its veth pair goes with it); no error if absent."""
    _ip("netns", "delete", net.netns(slot), check=False)
    _ip("link", "delete", net.veth(slot), check=False)


def netns_names() -> list[str]:
    """The network namespaces ``ip netns`` knows."""
    return [line.split()[0] for line in _ip("netns", "list", check=False).splitlines() if line]


def link_names() -> list[str]:
    """The links of this machine's own network namespace."""
    names = []
    for line in _ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def leftovers(net: BedNetwork) -> list[str]:
    """This test bed's namespaces and links that exist (empty once it is down)."""
    found = [f"netns {n}" for n in netns_names() if net.owns_netns(n)]
    found += [f"link {n}" for n in link_names() if net.owns_link(n)]
    return found


def teardown(net: BedNetwork) -> None:
    """Remove every namespace and link of this test bed's pod network."""
    for name in netns_names():
        if net.owns_netns(name):
            _ip("netns", "delete", name, check=False)
    for name in link_names():
        if net.owns_link(name) and name != net.bridge:
            _ip("link", "delete", name, check=False)
    _ip("link", "delete", net.bridge, check=False)


def _service_names(service: str, namespace: str, own_namespace: str) -> list[str]:
    names = [
        f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}",
    ]
    if namespace == own_namespace:
        names.append(service)
    return names


@dataclass(frozen=True)
class PodName:
    """What a pod's own ``/etc/hosts`` line says about it.

    Attributes:
        address: Its address.
        hostname: Its host name.
        subdomain: Its ``spec.subdomain`` (a headless Service's name), if any.
        namespace: Its namespace.
    """

    address: str
    hostname: str
    subdomain: str
    namespace: str


@dataclass(frozen=True)
class PodEntry:
    """A pod of the process node, as Services select it.

    Attributes:
        namespace: Its namespace.
        labels: Its labels.
        address: Its address.
        hostname: Its ``spec.hostname`` (empty: none).
        subdomain: Its ``spec.subdomain``.
        ready: All its containers run.
    """

    namespace: str
    labels: Mapping[str, str]
    address: str
    hostname: str
    subdomain: str
    ready: bool


def service_endpoints(services: Sequence[KubeObject], pods: Sequence[PodEntry]) -> list[KubeObject]:
    """Each selecting Service's endpoints among ``pods``, shaped as ``Endpoints`` objects.

    The API server refuses link-local addresses in Endpoints and EndpointSlices, so the
    endpoints controller cannot list process pods: the node agent selects them itself, as that
    controller would (ready pods, or all with ``publishNotReadyAddresses``; a pod's host name
    when its subdomain is the Service).

    Example:
        >>> svc = {"metadata": {"name": "s", "namespace": "a"},
        ...        "spec": {"selector": {"app": "x"}}}
        >>> pod = PodEntry("a", {"app": "x"}, "169.254.104.2", "h", "s", True)
        >>> service_endpoints([svc], [pod])[0]["subsets"]
        [{'addresses': [{'ip': '169.254.104.2', 'hostname': 'h'}]}]
    """
    found = []
    for service in services:
        meta, spec = service.get("metadata") or {}, service.get("spec") or {}
        selector = spec.get("selector") or {}
        if not selector:
            continue
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        everyone = bool(spec.get("publishNotReadyAddresses"))
        addresses = []
        for pod in pods:
            if pod.namespace != namespace or not (pod.ready or everyone):
                continue
            if any(pod.labels.get(k) != v for k, v in selector.items()):
                continue
            address: dict[str, str] = {"ip": pod.address}
            if pod.hostname and pod.subdomain == name:
                address["hostname"] = pod.hostname
            addresses.append(address)
        if addresses:
            found.append(
                {
                    "metadata": {"name": name, "namespace": namespace},
                    "subsets": [{"addresses": addresses}],
                }
            )
    return found


def render_hosts(own: PodName, endpoints: Sequence[KubeObject]) -> str:
    """The ``/etc/hosts`` of a pod: itself, then each Service's names for its endpoints.

    Every Service resolves (short name in its own namespace; ``<svc>.<ns>``, ``<svc>.<ns>.svc``
    and the ``svc.cluster.local`` name everywhere) to its ready endpoints' addresses; an
    endpoint with a host name (a pod whose subdomain is the Service) also gets
    ``<hostname>.<svc>`` in the same forms (``/etc/hosts`` knows no search path). There are no
    cluster IPs: a Service's name is its pods' addresses, so a client must use the pods'
    (target) port.

    Example:
        >>> ep = {"metadata": {"name": "job", "namespace": "a"},
        ...       "subsets": [{"addresses": [{"ip": "169.254.104.3", "hostname": "m"}]}]}
        >>> print(render_hosts(PodName("169.254.104.2", "w", "", "a"), [ep]), end="")
        127.0.0.1 localhost
        ::1 localhost ip6-localhost ip6-loopback
        169.254.104.2 w
        169.254.104.3 job.a.svc.cluster.local job.a.svc job.a job
        169.254.104.3 m.job.a.svc.cluster.local m.job.a.svc m.job.a m.job
    """
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    if own.subdomain:
        fqdn = f"{own.hostname}.{own.subdomain}.{own.namespace}.svc.{CLUSTER_DOMAIN}"
        lines.append(f"{own.address} {fqdn} {own.hostname}")
    else:
        lines.append(f"{own.address} {own.hostname}")
    for item in sorted(
        endpoints,
        key=lambda e: (e["metadata"].get("namespace", ""), e["metadata"].get("name", "")),
    ):
        service = str(item["metadata"]["name"])
        namespace = str(item["metadata"].get("namespace", ""))
        names = " ".join(_service_names(service, namespace, own.namespace))
        for subset in item.get("subsets") or []:
            for address in subset.get("addresses") or []:
                ip = str(address.get("ip", ""))
                if not ip:
                    continue
                lines.append(f"{ip} {names}")
                if address.get("hostname"):
                    host = f"{address['hostname']}.{service}"
                    lines.append(f"{ip} {' '.join(_service_names(host, namespace, own.namespace))}")
    return "\n".join(lines) + "\n"


def render_resolv_conf(namespace: str) -> str:
    """A pod's ``resolv.conf``: the cluster's search path and no reachable server.

    Example:
        >>> print(render_resolv_conf("a"), end="")
        search a.svc.cluster.local svc.cluster.local cluster.local
        nameserver 127.0.0.1
        options ndots:5 timeout:1 attempts:1
    """
    return (
        f"search {namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
        "nameserver 127.0.0.1\n"
        "options ndots:5 timeout:1 attempts:1\n"
    )


def write_in_place(path: Path, text: str) -> None:
    """Replace ``path``'s content without replacing the file (bind mounts keep seeing it)."""
    if path.is_file() and path.read_text() == text:
        return
    with path.open("r+" if path.exists() else "w") as handle:
        handle.write(text)
        handle.truncate()


def mount_points_under(root: Path, mounts: Mapping[str, str] | None = None) -> list[str]:
    """Mount points of this machine's mount namespace at or under ``root`` (``/proc/mounts``)."""
    if mounts is None:
        table = Path("/proc/mounts").read_text().splitlines()
        points = [line.split()[1] for line in table if len(line.split()) > 1]
    else:
        points = list(mounts)
    prefix = str(root).rstrip("/") + "/"
    return [p for p in points if p == str(root) or p.startswith(prefix)]
