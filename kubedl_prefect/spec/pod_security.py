"""Pod Security Standards: which settings of a spec break the Baseline or the Restricted level.

Kubernetes' Pod Security Standards
(https://kubernetes.io/docs/concepts/security/pod-security-standards/) define three cumulative
levels: *Privileged* (no restriction), *Baseline* (no known privilege escalation; a pod that sets
nothing passes) and *Restricted* (hardened). A namespace enforces one with Pod Security
Admission (the label ``pod-security.kubernetes.io/enforce: baseline``).

:func:`pod_security_findings` lists every setting of a spec that breaks one of them, with its
field path in the spec, the level and a fix; the typed fields (``network.hostNetwork``,
``volumes[].hostPath``, ``ports[].hostPort``), the job's annotations and the raw
``podTemplate`` fragments (pod, containers, init and ephemeral containers) are all looked at.
The spec's policy (``docs/spec.md``, "Pod security"):

- a setting that breaks **Baseline** (a privileged container, the node's network, PID or IPC
  namespace, a hostPath volume, a host port, a capability beyond the default set, unconfined
  seccomp or AppArmor, custom SELinux options, an unmasked ``/proc``, an unsafe sysctl, a
  Windows host process, a probe sent to another host) is refused
  (:func:`baseline_issues`, one of the model's checks) unless the spec opts in with
  ``podSecurity: privileged``;
- a setting that breaks only **Restricted** (``runAsUser: 0``, ``runAsNonRoot: false``,
  ``allowPrivilegeEscalation: true``, a capability other than ``NET_BIND_SERVICE``, a volume type
  other than configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected
  and secret) is a warning (:func:`pod_security_warnings`), and so is a Baseline one the spec
  opted into.

Only what a spec sets is reported. Restricted also asks for settings a spec has to add
(``runAsNonRoot: true``, a ``RuntimeDefault`` seccomp profile, capabilities ``drop: [ALL]``,
``allowPrivilegeEscalation: false``); a warning on every spec that leaves them out would bury the
real ones, so their absence is not reported (``docs/spec.md`` shows the ``podTemplate`` that
adds them).

Pure: it reads a validated spec.

Example:
    >>> from kubedl_prefect.spec import parse_spec
    >>> spec = parse_spec({"name": "m", "image": "i", "replicas": {"worker": 1},
    ...     "podTemplate": {"spec": {"securityContext": {"runAsUser": 0}}}})
    >>> print(pod_security_warnings(spec)[0])  # doctest: +NORMALIZE_WHITESPACE
    podTemplate.spec.securityContext.runAsUser: runAsUser: 0 runs the containers as root,
    which the Restricted Pod Security level forbids (fix: run as a user other than root, e.g.
    runAsUser: 1000 with runAsNonRoot: true, in an image that allows it)
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from kubedl_prefect.errors import SpecIssue
from kubedl_prefect.spec.paths import format_path, parse_path

if TYPE_CHECKING:
    from kubedl_prefect.spec.model import TrainingJobSpec

__all__ = [
    "BASELINE_CAPABILITIES",
    "PRIVILEGED",
    "SAFE_SYSCTLS",
    "PodSecurityFinding",
    "PodSecurityLevel",
    "baseline_issues",
    "pod_security_findings",
    "pod_security_warnings",
]

PRIVILEGED: Final = "privileged"
"""The value of the spec's ``podSecurity`` that allows settings breaking the Baseline level."""


class PodSecurityLevel(StrEnum):
    """A Pod Security Standards level a setting breaks."""

    BASELINE = "Baseline"
    """Breaking it is refused unless the spec says ``podSecurity: privileged``."""
    RESTRICTED = "Restricted"
    """Breaking only it is a warning."""


@dataclass(frozen=True)
class PodSecurityFinding:
    """One setting of a spec that breaks a Pod Security Standards level.

    Attributes:
        path: The field path in the spec (``replicas.worker.podTemplate.spec.hostPID``).
        level: The level it breaks (the lowest one, when it breaks both).
        problem: What the setting does.
        fix: What to do instead.
        line: The line of the spec it is on, when the spec was read from YAML.
        allowed: Whether the spec allows it (a Baseline breaker under ``podSecurity:
            privileged``; Restricted breakers are always allowed, with a warning).
    """

    path: str
    level: PodSecurityLevel
    problem: str
    fix: str
    line: int | None = None
    allowed: bool = False

    def __str__(self) -> str:
        text = f"{self.path}: {self.problem}, which the {self.level} Pod Security level forbids"
        if self.allowed and self.level is PodSecurityLevel.BASELINE:
            text += (
                f"; podSecurity: {PRIVILEGED} allows it, so the namespace must allow privileged "
                "pods (pod-security.kubernetes.io/enforce: privileged)"
            )
        if self.line is not None:
            text += f" (line {self.line})"
        if self.allowed and self.level is PodSecurityLevel.BASELINE:
            return f"{text} (to run under Baseline: {self.fix})"
        return f"{text} (fix: {self.fix})"

    def issue(self) -> SpecIssue:
        """The finding as a spec problem, for a spec that does not allow it."""
        return SpecIssue(
            self.path,
            f"{self.problem}, which the {self.level} Pod Security level forbids",
            f"{self.fix}; or, if the job really needs it, set `podSecurity: {PRIVILEGED}` "
            "(its namespace must then allow privileged pods)",
        )


BASELINE_CAPABILITIES: Final = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
"""The capabilities the Baseline level lets a container add (the container runtimes' default)."""

RESTRICTED_CAPABILITIES: Final = frozenset({"NET_BIND_SERVICE"})
"""The only capability the Restricted level lets a container add."""

SAFE_SYSCTLS: Final = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
"""The sysctls the Baseline level allows (the kubelet's safe, namespaced set, Kubernetes 1.32)."""

_SELINUX_TYPES: Final = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
_RESTRICTED_VOLUMES: Final = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
_APPARMOR_ANNOTATION: Final = "container.apparmor.security.beta.kubernetes.io/"
_CONTAINER_LISTS: Final = ("containers", "initContainers", "ephemeralContainers")
_PROBES: Final = ("livenessProbe", "readinessProbe", "startupProbe")

_B: Final = PodSecurityLevel.BASELINE
_R: Final = PodSecurityLevel.RESTRICTED


def pod_security_findings(spec: TrainingJobSpec) -> list[PodSecurityFinding]:
    """Every setting of ``spec`` that breaks the Baseline or the Restricted level, in order."""
    found = [*_typed_findings(spec), *_annotation_findings(("annotations",), spec.annotations)]
    fragments = [("podTemplate", spec.pod_template)] + [
        (f"replicas.{role.value}.podTemplate", role_spec.pod_template)
        for role, role_spec in spec.replicas.items()
    ]
    for path, fragment in fragments:
        if fragment:
            found += _template_findings(tuple(parse_path(path)), fragment)
    return list(dict.fromkeys(found))


def baseline_issues(spec: TrainingJobSpec) -> list[SpecIssue]:
    """The Baseline breakers of ``spec`` as problems, unless it says ``podSecurity: privileged``."""
    if spec.pod_security == PRIVILEGED:
        return []
    return [f.issue() for f in pod_security_findings(spec) if f.level is PodSecurityLevel.BASELINE]


def pod_security_warnings(
    spec: TrainingJobSpec, *, line_of: Callable[[Sequence[str | int]], int | None] | None = None
) -> list[PodSecurityFinding]:
    """What to warn about: the Restricted breakers, and the Baseline ones the spec allows.

    Args:
        spec: A valid spec (its Baseline breakers are allowed, or it would not be valid).
        line_of: Maps a field location to its line in the YAML the spec was read from.
    """
    warnings = []
    for finding in pod_security_findings(spec):
        line = line_of(parse_path(finding.path)) if line_of is not None else None
        warnings.append(replace(finding, line=line, allowed=True))
    return warnings


# --- the typed fields ------------------------------------------------------------------------


def _typed_findings(spec: TrainingJobSpec) -> Iterator[PodSecurityFinding]:
    if spec.network is not None and spec.network.host_network:
        yield PodSecurityFinding(
            "network.hostNetwork",
            _B,
            "hostNetwork: true puts the pods in the node's network namespace (every port and "
            "interface of the node)",
            "remove network.hostNetwork: NCCL and Gloo work over the pod network "
            "(network.ncclSocketIfname picks the interface)",
        )
    for index, volume in enumerate(spec.volumes or []):
        if volume.host_path is not None:
            yield _host_path(f"volumes[{index}].hostPath", volume.name, volume.host_path.path)
    ports = [("", spec.ports)] + [
        (f"replicas.{role.value}.", role_spec.ports) for role, role_spec in spec.replicas.items()
    ]
    for prefix, listed in ports:
        for index, port in enumerate(listed or []):
            if port.host_port:
                yield _host_port(f"{prefix}ports[{index}].hostPort", port.host_port)


def _host_path(path: str, name: object, node_path: object) -> PodSecurityFinding:
    whole = isinstance(node_path, str) and posixpath.normpath(node_path) in ("/", "//")
    return PodSecurityFinding(
        path,
        _B,
        f"volume {name!r} mounts the node's directory {node_path!r}"
        + (", the node's whole filesystem" if whole else ""),
        "use a persistentVolumeClaim, emptyDir, configMap or secret volume instead",
    )


def _host_port(path: str, port: object) -> PodSecurityFinding:
    return PodSecurityFinding(
        path,
        _B,
        f"hostPort {port} opens the port on the node itself",
        "remove hostPort: the replicas reach each other through the operator's services",
    )


def _annotation_findings(
    loc: tuple[str | int, ...], annotations: Mapping[str, Any] | None
) -> Iterator[PodSecurityFinding]:
    for key, value in (annotations or {}).items():
        if not (isinstance(key, str) and key.startswith(_APPARMOR_ANNOTATION)):
            continue
        if value is None or value in ("", "runtime/default") or str(value).startswith("localhost/"):
            continue
        yield PodSecurityFinding(
            format_path((*loc, key)),
            _B,
            f"the AppArmor profile {value!r} replaces the runtime's default confinement",
            "use runtime/default or localhost/<profile>, or remove the annotation",
        )


# --- the raw pod template ----------------------------------------------------------------------


def _template_findings(
    loc: tuple[str | int, ...], fragment: Mapping[str, Any]
) -> Iterator[PodSecurityFinding]:
    metadata = fragment.get("metadata")
    if isinstance(metadata, Mapping):
        annotations = metadata.get("annotations")
        if isinstance(annotations, Mapping):
            yield from _annotation_findings((*loc, "metadata", "annotations"), annotations)
    pod = fragment.get("spec")
    if not isinstance(pod, Mapping):
        return
    here = (*loc, "spec")
    yield from _host_namespaces(here, pod)
    context = pod.get("securityContext")
    if isinstance(context, Mapping):
        yield from _context_findings((*here, "securityContext"), context, container=False)
    volumes = pod.get("volumes")
    for index, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if isinstance(volume, Mapping):
            yield from _volume_findings((*here, "volumes", index), volume)
    for field in _CONTAINER_LISTS:
        containers = pod.get(field)
        for index, container in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(container, Mapping):
                yield from _container_findings((*here, field, index), container)


def _host_namespaces(
    loc: tuple[str | int, ...], pod: Mapping[str, Any]
) -> Iterator[PodSecurityFinding]:
    shared = {
        "hostNetwork": (
            "puts the pods in the node's network namespace (every port and interface of the node)",
            "remove it (or use network.hostNetwork, which also needs podSecurity: privileged)",
        ),
        "hostPID": (
            "lets the containers see, trace and signal every process of the node",
            "remove it",
        ),
        "hostIPC": (
            "shares the node's IPC namespace (its shared memory) with the pods",
            "remove it; for shared memory between the processes of a pod, mount an emptyDir "
            "with medium: Memory at /dev/shm",
        ),
    }
    for field, (problem, fix) in shared.items():
        if pod.get(field) is True:
            yield PodSecurityFinding(
                format_path((*loc, field)), _B, f"{field}: true {problem}", fix
            )


def _volume_findings(
    loc: tuple[str | int, ...], volume: Mapping[str, Any]
) -> Iterator[PodSecurityFinding]:
    name = volume.get("name")
    if "hostPath" in volume:
        source = volume["hostPath"]
        node_path = source.get("path") if isinstance(source, Mapping) else None
        yield _host_path(format_path((*loc, "hostPath")), name, node_path)
        return
    kinds = [key for key in volume if key != "name" and volume[key] is not None]
    for kind in kinds:
        if kind not in _RESTRICTED_VOLUMES:
            yield PodSecurityFinding(
                format_path((*loc, kind)),
                _R,
                f"volume {name!r} is a {kind} volume, a type only PersistentVolumes should bring",
                "mount it through a persistentVolumeClaim bound to a PersistentVolume of that "
                f"type (Restricted allows {', '.join(_RESTRICTED_VOLUMES)})",
            )


def _container_findings(
    loc: tuple[str | int, ...], container: Mapping[str, Any]
) -> Iterator[PodSecurityFinding]:
    context = container.get("securityContext")
    if isinstance(context, Mapping):
        yield from _context_findings((*loc, "securityContext"), context, container=True)
    ports = container.get("ports")
    for index, port in enumerate(ports if isinstance(ports, list) else []):
        if isinstance(port, Mapping) and port.get("hostPort") not in (None, 0):
            yield _host_port(format_path((*loc, "ports", index, "hostPort")), port["hostPort"])
    handlers = [(probe, container.get(probe)) for probe in _PROBES]
    lifecycle = container.get("lifecycle")
    if isinstance(lifecycle, Mapping):
        handlers += [
            (f"lifecycle.{hook}", lifecycle.get(hook)) for hook in ("postStart", "preStop")
        ]
    for name, handler in handlers:
        if not isinstance(handler, Mapping):
            continue
        for action in ("httpGet", "tcpSocket"):
            target = handler.get(action)
            if isinstance(target, Mapping) and target.get("host") not in (None, ""):
                yield PodSecurityFinding(
                    format_path((*loc, *name.split("."), action, "host")),
                    _B,
                    f"{name}.{action}.host sends the kubelet's request to {target['host']!r}, "
                    "another host than the pod",
                    "remove host: the request then goes to the pod's own address",
                )


def _context_findings(
    loc: tuple[str | int, ...], context: Mapping[str, Any], *, container: bool
) -> Iterator[PodSecurityFinding]:
    """The settings of a pod's (``container=False``) or a container's security context."""

    def at(*parts: str | int) -> str:
        return format_path((*loc, *parts))

    whose = "the container" if container else "the containers"
    if container and context.get("privileged") is True:
        yield PodSecurityFinding(
            at("privileged"),
            _B,
            "privileged: true gives the container every capability and the node's devices",
            "remove privileged; add the one capability the program needs instead, if any",
        )
    if container:
        yield from _capability_findings(loc, context.get("capabilities"))
        if context.get("procMount") not in (None, "Default"):
            yield PodSecurityFinding(
                at("procMount"),
                _B,
                f"procMount: {context['procMount']} unmasks the node's /proc paths",
                "remove procMount (Default)",
            )
        if context.get("allowPrivilegeEscalation") is True:
            yield PodSecurityFinding(
                at("allowPrivilegeEscalation"),
                _R,
                "allowPrivilegeEscalation: true lets a process gain more privileges than its "
                "parent (setuid programs)",
                "set allowPrivilegeEscalation: false",
            )
    else:
        sysctls = context.get("sysctls")
        for index, sysctl in enumerate(sysctls if isinstance(sysctls, list) else []):
            name = sysctl.get("name") if isinstance(sysctl, Mapping) else None
            if isinstance(name, str) and name not in SAFE_SYSCTLS:
                yield PodSecurityFinding(
                    at("sysctls", index, "name"),
                    _B,
                    f"sysctl {name} is not one of the safe, namespaced sysctls",
                    "remove it, or set it on the nodes (safe: "
                    + ", ".join(sorted(SAFE_SYSCTLS))
                    + ")",
                )
    yield from _profile_findings(loc, context)
    yield from _selinux_findings(loc, context.get("seLinuxOptions"))
    windows = context.get("windowsOptions")
    if isinstance(windows, Mapping) and windows.get("hostProcess") is True:
        yield PodSecurityFinding(
            at("windowsOptions", "hostProcess"),
            _B,
            f"hostProcess: true runs {whose} as processes of the Windows node",
            "remove windowsOptions.hostProcess",
        )
    user = context.get("runAsUser")
    if user == 0 and not isinstance(user, bool):
        yield PodSecurityFinding(
            at("runAsUser"),
            _R,
            f"runAsUser: 0 runs {whose} as root",
            "run as a user other than root, e.g. runAsUser: 1000 with runAsNonRoot: true, in an "
            "image that allows it",
        )
    if context.get("runAsNonRoot") is False:
        yield PodSecurityFinding(
            at("runAsNonRoot"),
            _R,
            f"runAsNonRoot: false lets {whose} run as root",
            "set runAsNonRoot: true (the image must then run as a user other than root)",
        )


def _capability_findings(
    loc: tuple[str | int, ...], capabilities: Any
) -> Iterator[PodSecurityFinding]:
    added = capabilities.get("add") if isinstance(capabilities, Mapping) else None
    for index, name in enumerate(added if isinstance(added, list) else []):
        if not isinstance(name, str) or name in RESTRICTED_CAPABILITIES:
            continue
        where = format_path((*loc, "capabilities", "add", index))
        if name not in BASELINE_CAPABILITIES:
            yield PodSecurityFinding(
                where,
                _B,
                f"capability {name} is beyond the container runtimes' default set",
                f"remove {name} from capabilities.add (Baseline allows "
                + ", ".join(sorted(BASELINE_CAPABILITIES))
                + ")",
            )
        else:
            yield PodSecurityFinding(
                where,
                _R,
                f"capability {name} is added",
                f"remove {name} from capabilities.add (Restricted allows only NET_BIND_SERVICE)",
            )


def _profile_findings(
    loc: tuple[str | int, ...], context: Mapping[str, Any]
) -> Iterator[PodSecurityFinding]:
    seccomp = context.get("seccompProfile")
    if isinstance(seccomp, Mapping) and seccomp.get("type") == "Unconfined":
        yield PodSecurityFinding(
            format_path((*loc, "seccompProfile", "type")),
            _B,
            "seccompProfile type Unconfined turns system-call filtering off",
            "use type RuntimeDefault (or Localhost with a profile of the node)",
        )
    apparmor = context.get("appArmorProfile")
    kind = apparmor.get("type") if isinstance(apparmor, Mapping) else None
    if kind is not None and kind not in ("RuntimeDefault", "Localhost"):
        yield PodSecurityFinding(
            format_path((*loc, "appArmorProfile", "type")),
            _B,
            f"appArmorProfile type {kind} turns AppArmor confinement off",
            "use type RuntimeDefault (or Localhost with a profile of the node)",
        )


def _selinux_findings(loc: tuple[str | int, ...], options: Any) -> Iterator[PodSecurityFinding]:
    if not isinstance(options, Mapping):
        return
    kind = options.get("type")
    if kind is not None and kind not in _SELINUX_TYPES:
        yield PodSecurityFinding(
            format_path((*loc, "seLinuxOptions", "type")),
            _B,
            f"SELinux type {kind!r} is not a container type",
            "remove it, or use container_t, container_init_t, container_kvm_t or "
            "container_engine_t",
        )
    for field in ("user", "role"):
        if options.get(field) not in (None, ""):
            yield PodSecurityFinding(
                format_path((*loc, "seLinuxOptions", field)),
                _B,
                f"a custom SELinux {field} is set",
                f"remove seLinuxOptions.{field}",
            )
