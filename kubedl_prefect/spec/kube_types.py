"""Kubernetes pod settings the spec carries through: environment, resources, placement, storage.

These models follow the pod API closely (``tolerations``, ``affinity``, ``env`` references...) or
are a flat spelling of it (:class:`Resources`, :class:`Volume`), and check what the API server
would check, so that an invalid value is refused with its field path instead of by the cluster.
"""

# No `from __future__ import annotations`: pydantic takes these modules' annotations as they
# are instead of compiling and evaluating each one's text when the classes are made (a start-up
# cost of kubedl-prefect validate); a class named before its definition is written in quotes.

import ipaddress
import re
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias, cast

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from kubedl_prefect.spec.fields import (
    AbsolutePath,
    ConfigKey,
    DNS1123Label,
    EnvName,
    Int32,
    LabelValue,
    LazyModel,
    ObjectName,
    PodFieldPath,
    PortNumber,
    QualifiedName,
    Quantity,
    SpecModel,
    StrictBool,
    StrictInt,
    SubPath,
    spec_error,
)
from kubedl_prefect.spec.reader import data_issue, plain_numbers, source_text

# --- environment ---------------------------------------------------------------------------


class KeyRef(SpecModel):
    """A key of a Secret or ConfigMap."""

    name: ObjectName = Field(description="Name of the Secret or ConfigMap.")
    key: ConfigKey = Field(description="Key inside it.")
    optional: StrictBool | None = Field(default=None, description="Whether the key may be missing.")


class FieldRef(SpecModel):
    """A field of the pod, e.g. ``metadata.name`` or ``status.podIP``."""

    field_path: PodFieldPath = Field(description="Path of the pod field.")


def _scalar_to_env_value(value: Any) -> Any:
    if isinstance(value, bool):
        return {"value": "true" if value else "false"}
    if isinstance(value, int | float):
        return {"value": source_text(value)}  # as written: `LR: 1.0e-5` stays "1.0e-5"
    if isinstance(value, str):
        return {"value": value}
    return value


class EnvValue(SpecModel):
    """The value of one environment variable: a literal or a reference (exactly one).

    In YAML a plain scalar is a literal: ``OMP_NUM_THREADS: 4`` means ``{value: "4"}``.
    """

    value: str | None = Field(default=None, description="Literal value.")
    secret_key_ref: KeyRef | None = Field(default=None, description="Value from a Secret key.")
    config_map_key_ref: KeyRef | None = Field(
        default=None, description="Value from a ConfigMap key."
    )
    field_ref: FieldRef | None = Field(default=None, description="Value from a pod field.")

    @model_validator(mode="after")
    def _exactly_one(self) -> "EnvValue":
        given = [
            name
            for name in ("value", "secret_key_ref", "config_map_key_ref", "field_ref")
            if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise spec_error(
                f"an environment value needs exactly one source, got {len(given)}",
                "give one of value, secretKeyRef, configMapKeyRef or fieldRef",
            )
        return self


EnvValueField = Annotated[EnvValue, BeforeValidator(_scalar_to_env_value)]
Env = dict[EnvName, EnvValueField]


# --- resources -----------------------------------------------------------------------------


class Resources(SpecModel):
    """Compute resources of each replica of a role.

    ``cpu`` and ``memory`` set both the request and the limit; ``gpus`` sets the
    ``nvidia.com/gpu`` limit (the scheduler reads GPUs from limits only). ``requests`` and
    ``limits`` add any other resource (``ephemeral-storage``, ``hugepages-2Mi``...).
    """

    cpu: Quantity | None = Field(default=None, description="CPU request and limit, e.g. 4, 500m.")
    memory: Quantity | None = Field(
        default=None, description="Memory request and limit, e.g. 16Gi."
    )
    gpus: Int32 = Field(default=0, description="GPUs per replica, rendered as limits only.")
    requests: dict[QualifiedName, Quantity] = Field(
        default_factory=dict, description="Further requests, by resource name."
    )
    limits: dict[QualifiedName, Quantity] = Field(
        default_factory=dict, description="Further limits, by resource name."
    )


# --- placement -----------------------------------------------------------------------------


class Toleration(SpecModel):
    """A toleration of a node taint (as in a Kubernetes pod)."""

    key: QualifiedName | None = Field(
        default=None, description="Taint key; empty with Exists matches all."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (the default)."
    )
    value: LabelValue | None = Field(default=None, description="Taint value, for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: StrictInt | None = Field(
        default=None, description="For NoExecute: how long the pod stays after the taint."
    )

    @model_validator(mode="after")
    def _consistent(self) -> "Toleration":
        if self.operator == "Exists" and self.value:
            raise spec_error(
                "a toleration with operator Exists cannot have a value",
                "remove value, or use operator Equal",
            )
        if not self.key and self.operator != "Exists":
            raise spec_error(
                "a toleration without a key must use operator Exists",
                "set key, or set operator: Exists",
            )
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise spec_error(
                "tolerationSeconds applies only to effect NoExecute",
                "set effect: NoExecute, or remove tolerationSeconds",
            )
        return self


# --- affinity and autoscaling metrics, validated when a spec holds them -----------------------

# Their twenty models live in modules of their own (kubedl_prefect.spec.affinity and .metrics),
# imported and built the first time a spec holds one (fields.LazyModel): most specs have neither,
# and making and building their models was 6% of the work of a `kubedl-prefect validate`.
if TYPE_CHECKING:
    from kubedl_prefect.spec.affinity import Affinity
    from kubedl_prefect.spec.metrics import MetricSpec

    AffinityField: TypeAlias = Affinity
    MetricSpecField: TypeAlias = MetricSpec
else:
    AffinityField = Annotated[Any, LazyModel("kubedl_prefect.spec.affinity", "Affinity")]
    MetricSpecField = Annotated[Any, LazyModel("kubedl_prefect.spec.metrics", "MetricSpec")]


# --- storage -------------------------------------------------------------------------------


class EmptyDir(SpecModel):
    """A scratch directory that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = Field(
        default=None, description="'Memory' for tmpfs (e.g. /dev/shm), empty for node disk."
    )
    size_limit: Quantity | None = Field(default=None, description="Size limit, e.g. 8Gi.")


class HostPath(SpecModel):
    """A directory of the node."""

    path: AbsolutePath = Field(description="Path on the node.")
    type: (
        Literal[
            "",
            "DirectoryOrCreate",
            "Directory",
            "FileOrCreate",
            "File",
            "Socket",
            "CharDevice",
            "BlockDevice",
        ]
        | None
    ) = Field(default=None, description="What must exist at the path.")


class Volume(SpecModel):
    """A volume mounted into the training container of every role (exactly one source)."""

    name: DNS1123Label = Field(description="Volume name, unique in the spec.")
    mount_path: AbsolutePath = Field(description="Where the volume appears in the container.")
    read_only: StrictBool | None = Field(default=None, description="Mount read-only.")
    sub_path: SubPath | None = Field(
        default=None, description="Mount only this relative sub-path of the volume."
    )
    pvc: ObjectName | None = Field(default=None, description="PersistentVolumeClaim name.")
    empty_dir: EmptyDir | None = Field(default=None, description="A scratch directory.")
    host_path: HostPath | None = Field(default=None, description="A node directory.")
    config_map: ObjectName | None = Field(default=None, description="ConfigMap name.")
    secret: ObjectName | None = Field(default=None, description="Secret name.")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "Volume":
        sources = [
            name
            for name in ("pvc", "empty_dir", "host_path", "config_map", "secret")
            if getattr(self, name) is not None
        ]
        if len(sources) != 1:
            raise spec_error(
                f"volume {self.name!r} needs exactly one source, got {len(sources)}",
                "give one of pvc, emptyDir, hostPath, configMap or secret",
            )
        return self


# --- ports ----------------------------------------------------------------------------------

_PORT_NAME: Final = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")


def _check_port_name(value: str) -> str:
    if (
        len(value) > 15
        or not _PORT_NAME.match(value)
        or "--" in value
        or not re.search("[a-z]", value)
    ):
        raise spec_error(
            f"{value!r} is not a valid port name (IANA service name)",
            "use at most 15 lower-case letters, digits and single '-', with at least one letter, "
            "starting and ending with a letter or digit (e.g. metrics)",
        )
    return value


def _check_ip(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise spec_error(f"{value!r} is not an IP address", "write e.g. 0.0.0.0") from None
    return value


PortName = Annotated[str, AfterValidator(_check_port_name)]
"""A port name: an IANA service name (at most 15 characters, at least one letter)."""


class ContainerPort(SpecModel):
    """A port the training container exposes (as in a Kubernetes container).

    The operators find their own port by name (``pytorchjob-port``, ``tfjob-port``,
    ``mpi-port``, ``xgboostjob-port``): a port of that name replaces the operator's default.
    """

    container_port: PortNumber = Field(description="The port number in the container.")
    name: PortName | None = Field(default=None, description="Port name, unique in the pod.")
    protocol: Literal["TCP", "UDP", "SCTP"] | None = Field(
        default=None, description="TCP (the default), UDP or SCTP."
    )
    host_port: PortNumber | None = Field(
        default=None, description="Expose the port on the node too (rarely needed)."
    )
    host_ip: Annotated[str, AfterValidator(_check_ip)] | None = Field(
        default=None, description="Node address the host port binds to."
    )


def _unique_ports(ports: list[ContainerPort] | None) -> list[ContainerPort] | None:
    if ports is None:
        return None
    names: set[str] = set()
    numbers: set[tuple[int, str]] = set()
    for port in ports:
        key = (port.container_port, port.protocol or "TCP")
        if key in numbers:
            raise spec_error(
                f"port {port.container_port}/{key[1]} is listed twice",
                "list each port and protocol once",
            )
        numbers.add(key)
        if port.name is not None:
            if port.name in names:
                raise spec_error(f"port name {port.name!r} is used twice", "name each port once")
            names.add(port.name)
    return ports


Ports = Annotated[list[ContainerPort], AfterValidator(_unique_ports)]
"""Container ports: unique by number and protocol, and by name."""


# --- raw pod template (the escape hatch) ------------------------------------------------------

POD_TEMPLATE_METADATA: Final = frozenset({"labels", "annotations"})
"""What ``podTemplate.metadata`` may hold (the operators set the pods' names)."""


def _check_pod_template(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    bounded = data_issue(value)  # before anything walks it (a model built directly, not parsed)
    if bounded is not None:
        where = "" if bounded.path == "(document)" else f"at {bounded.path}: "
        raise spec_error(f"{where}{bounded.problem}", bounded.fix)
    unknown = sorted(set(value) - {"metadata", "spec"})
    if unknown:
        raise spec_error(
            f"a pod template has only metadata and spec, not {', '.join(map(repr, unknown))}",
            "put pod fields under spec (e.g. spec: {priorityClassName: high})",
        )
    if not value:
        raise spec_error(
            "the pod template is empty", "remove podTemplate, or give metadata or spec"
        )
    for part in ("metadata", "spec"):
        if part in value and not isinstance(value[part], dict):
            raise spec_error(f"podTemplate.{part} must be a mapping", f"write {part}: {{...}}")
    _check_template_metadata(value.get("metadata") or {})
    _check_template_spec(value.get("spec") or {})
    return cast("dict[str, Any]", plain_numbers(value))


def _check_template_metadata(metadata: dict[str, Any]) -> None:
    unknown = sorted(set(metadata) - POD_TEMPLATE_METADATA)
    if unknown:
        raise spec_error(
            f"podTemplate.metadata may hold labels and annotations only, not "
            f"{', '.join(map(repr, unknown))} (the operators name the pods themselves)",
            "remove it; use the spec's labels and annotations for the job and its pods",
        )
    for part in sorted(POD_TEMPLATE_METADATA & set(metadata)):
        entries = metadata[part]
        if not isinstance(entries, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in entries.items()
        ):
            raise spec_error(
                f"podTemplate.metadata.{part} must map names to strings (or null to remove one)",
                "quote the values",
            )


def _check_template_spec(spec: dict[str, Any]) -> None:
    if "restartPolicy" in spec:
        raise spec_error(
            "podTemplate.spec.restartPolicy is overwritten by the operator with the role's "
            "restart policy",
            "set the role's restartPolicy instead (OnFailure, ExitCode or Never)",
        )
    if "containers" in spec and spec["containers"] in (None, []):
        raise spec_error(
            f"podTemplate.spec.containers: {'null' if spec['containers'] is None else '[]'} "
            "would remove the training container",
            "list only the containers to add or change",
        )
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        if items is None:
            continue
        if not isinstance(items, list) or not all(
            isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"]
            for item in items
        ):
            raise spec_error(
                f"podTemplate.spec.{field} must be a list of containers, each with a name",
                "write e.g. - {name: sidecar, image: busybox:1.36}",
            )
        names = [item["name"] for item in items]
        if len(set(names)) != len(names):
            raise spec_error(
                f"podTemplate.spec.{field} names a container twice", "list each container once"
            )


PodTemplate = Annotated[dict[str, Any] | None, AfterValidator(_check_pod_template)]
"""Raw pod-template fields (``metadata`` and/or ``spec``), deep-merged last by the renderers."""
