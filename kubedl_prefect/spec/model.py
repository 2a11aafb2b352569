"""The framework-neutral training-job spec: frozen pydantic v2 models.

One :class:`TrainingJobSpec` describes a distributed training job once; the renderers turn it
into a KubeDL or a Kubeflow custom resource. Field names are snake_case in Python and camelCase
in YAML (``node_selector`` / ``nodeSelector``); unknown fields are refused, never pruned.

Settings such as ``image``, ``env`` or ``resources`` given at the top level apply to every role;
a role (``replicas.worker``) may override them. ``docs/spec.md`` is the reference.

Constructing a model directly raises :class:`pydantic.ValidationError` on bad input;
:func:`kubedl_prefect.spec.parse_spec` and :func:`kubedl_prefect.spec.load_spec` raise
:class:`kubedl_prefect.errors.SpecError` with field paths and fixes instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from kubedl_prefect.spec.checks import spec_issues
from kubedl_prefect.spec.naming import DNS1035_PATTERN
from kubedl_prefect.spec.quantity import is_quantity, parse_quantity
from kubedl_prefect.spec.types import (
    FRAMEWORKS,
    CleanPodPolicy,
    Framework,
    ImagePullPolicy,
    RestartPolicy,
    Role,
    default_restart_policy,
)

SPEC_API_VERSION: Final = "kubedl-prefect.io/v1alpha1"
"""The ``apiVersion`` of a spec document (our format's version, not a Kubernetes API)."""

SPEC_KIND: Final = "TrainingJob"
"""The ``kind`` of a spec document."""

INT32_MAX: Final = 2**31 - 1

_T = TypeVar("_T")


def _pick(own: _T | None, top: _T | None) -> _T | None:
    return own if own is not None else top


def spec_error(problem: str, fix: str) -> PydanticCustomError:
    """A pydantic error carrying our problem text and fix, for the SpecError translation."""
    return PydanticCustomError("spec_field", "{problem}", {"problem": problem, "fix": fix})


# --- constrained scalars -------------------------------------------------------------------

_QUALIFIED_NAME: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME: Final = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CONFIG_KEY: Final = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
_POD_FIELD: Final = re.compile(
    r"^(metadata\.(name|namespace|uid|labels\['[^']+'\]|annotations\['[^']+'\])"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$"
)


def _check_dns1035(value: str) -> str:
    if not DNS1035_PATTERN.match(value):
        raise spec_error(
            f"{value!r} is not a DNS-1035 label",
            "use lower-case letters, digits and '-', start with a letter and end with a letter "
            "or digit",
        )
    return value


def _check_dns1123_label(value: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise spec_error(
            f"{value!r} is not a DNS-1123 label",
            "use at most 63 lower-case letters, digits and '-', starting and ending with a "
            "letter or digit",
        )
    return value


def _check_dns1123_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise spec_error(
            f"{value!r} is not a valid object name (DNS-1123 subdomain)",
            "use lower-case letters, digits, '-' and '.', starting and ending with a letter "
            "or digit",
        )
    return value


def _check_qualified_name(value: str) -> str:
    prefix, slash, name = value.rpartition("/")
    prefix_ok = not slash or (len(prefix) <= 253 and _DNS1123_SUBDOMAIN.match(prefix) is not None)
    if not (prefix_ok and len(name) <= 63 and _QUALIFIED_NAME.match(name)):
        raise spec_error(
            f"{value!r} is not a valid key",
            "use an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or "
            "'.', starting and ending with a letter or digit (e.g. example.com/team)",
        )
    return value


def _check_label_value(value: str) -> str:
    if value and (len(value) > 63 or not _QUALIFIED_NAME.match(value)):
        raise spec_error(
            f"{value!r} is not a valid label value",
            "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
            "or digit (or an empty string)",
        )
    return value


def _check_env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise spec_error(
            f"{value!r} is not a valid environment variable name",
            "use letters, digits, '_', '-' and '.', not starting with a digit",
        )
    return value


def _check_config_key(value: str) -> str:
    if not _CONFIG_KEY.match(value):
        raise spec_error(
            f"{value!r} is not a valid Secret or ConfigMap key",
            "use letters, digits, '-', '_' and '.'",
        )
    return value


def _check_pod_field(value: str) -> str:
    if not _POD_FIELD.match(value):
        raise spec_error(
            f"{value!r} is not a pod field the API server can expose",
            "use metadata.name, metadata.namespace, metadata.uid, metadata.labels['KEY'], "
            "metadata.annotations['KEY'], spec.nodeName, spec.serviceAccountName, status.hostIP "
            "or status.podIP",
        )
    return value


def _check_sub_path(value: str) -> str:
    if value.startswith("/") or ".." in value.split("/"):
        raise spec_error(
            f"sub-path {value!r} must be relative and stay inside the volume",
            "use a relative path without '..'",
        )
    return value


def _check_absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise spec_error(f"{value!r} is not an absolute path", "start the path with '/'")
    return value


def _number_to_text(value: Any) -> Any:
    # YAML turns `cpu: 4` and `memory: 1e9` into numbers; quantities are strings in Kubernetes.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, "g") if isinstance(value, float) else str(value)
    return value


def _check_quantity(value: str) -> str:
    if not is_quantity(value):
        raise spec_error(
            f"{value!r} is not a Kubernetes quantity",
            "write a number with an optional suffix, e.g. 500m, 4, 16Gi, 1e9",
        )
    try:
        amount = parse_quantity(value)
    except ValueError:
        raise spec_error(f"{value!r} is out of range", "use a smaller quantity") from None
    if amount < 0:
        raise spec_error(f"{value!r} is negative", "use a quantity of zero or more")
    return value


DNS1035Name = Annotated[str, AfterValidator(_check_dns1035)]
DNS1123Label = Annotated[str, AfterValidator(_check_dns1123_label)]
ObjectName = Annotated[str, AfterValidator(_check_dns1123_subdomain)]
QualifiedName = Annotated[str, AfterValidator(_check_qualified_name)]
LabelValue = Annotated[str, AfterValidator(_check_label_value)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
AbsolutePath = Annotated[str, AfterValidator(_check_absolute_path)]
Quantity = Annotated[str, BeforeValidator(_number_to_text), AfterValidator(_check_quantity)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
PositiveInt32 = Annotated[int, Field(ge=1, le=INT32_MAX)]


def _refuse_always(value: Any) -> Any:
    if value == "Always":
        raise spec_error(
            "restart policy 'Always' is refused: the replica restarts in place forever, so the "
            "job never fails and a crashing script keeps its GPUs",
            "use OnFailure (restart the container on errors, bounded by backoffLimit), ExitCode "
            "(recreate the pod only for retryable exit codes) or Never",
        )
    return value


RestartPolicyField = Annotated[RestartPolicy, BeforeValidator(_refuse_always)]


class SpecModel(BaseModel):
    """Base of every spec model: frozen, strict about unknown fields, camelCase in YAML."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_enum_values=False,
    )


# --- environment ---------------------------------------------------------------------------


class KeyRef(SpecModel):
    """A key of a Secret or ConfigMap."""

    name: ObjectName = Field(description="Name of the Secret or ConfigMap.")
    key: Annotated[str, AfterValidator(_check_config_key)] = Field(description="Key inside it.")
    optional: bool | None = Field(default=None, description="Whether the key may be missing.")


class FieldRef(SpecModel):
    """A field of the pod, e.g. ``metadata.name`` or ``status.podIP``."""

    field_path: Annotated[str, AfterValidator(_check_pod_field)] = Field(
        description="Path of the pod field."
    )


def _scalar_to_env_value(value: Any) -> Any:
    if isinstance(value, bool):
        return {"value": "true" if value else "false"}
    if isinstance(value, str | int | float):
        return {"value": str(value)}
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
    def _exactly_one(self) -> EnvValue:
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
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays after the taint."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
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


def _check_operator_values(operator: str, values: list[str] | None) -> None:
    count = len(values or [])
    if operator in {"In", "NotIn"} and count == 0:
        raise spec_error(f"operator {operator} needs values", "add values: [...]")
    if operator in {"Exists", "DoesNotExist"} and count:
        raise spec_error(f"operator {operator} takes no values", "remove values")
    if operator in {"Gt", "Lt"} and (count != 1 or not _is_integer((values or [""])[0])):
        raise spec_error(f"operator {operator} needs exactly one integer value", "e.g. ['3']")


def _is_integer(text: str) -> bool:
    return re.fullmatch(r"-?[0-9]+", text) is not None


class LabelSelectorRequirement(SpecModel):
    """One expression of a label selector."""

    key: QualifiedName = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="Operator.")
    values: list[str] | None = Field(default=None, description="Values, for In and NotIn.")

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        _check_operator_values(self.operator, self.values)
        return self


class LabelSelector(SpecModel):
    """A label selector (``matchLabels`` and ``matchExpressions`` are ANDed)."""

    match_labels: dict[QualifiedName, LabelValue] | None = Field(
        default=None, description="Labels that must match exactly."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, description="Expressions that must all hold."
    )


class NodeSelectorRequirement(SpecModel):
    """One expression on node labels or fields."""

    key: NonEmptyStr = Field(description="Label key or field name.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="Operator."
    )
    values: list[str] | None = Field(default=None, description="Values.")

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeSelectorRequirement:
        _check_operator_values(self.operator, self.values)
        return self


class NodeSelectorTerm(SpecModel):
    """Expressions that a node must all satisfy."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, description="On node labels."
    )
    match_fields: list[NodeSelectorRequirement] | None = Field(
        default=None, description="On node fields (metadata.name with In or NotIn)."
    )

    @model_validator(mode="after")
    def _fields_supported(self) -> NodeSelectorTerm:
        for requirement in self.match_fields or []:
            if (
                requirement.key != "metadata.name"
                or requirement.operator not in {"In", "NotIn"}
                or len(requirement.values or []) != 1
            ):
                raise spec_error(
                    "matchFields supports only key metadata.name with In or NotIn and one value",
                    "match node labels with matchExpressions instead",
                )
        return self


class NodeSelector(SpecModel):
    """Terms of which a node must satisfy at least one."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, description="The terms.")


class PreferredSchedulingTerm(SpecModel):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    preference: NodeSelectorTerm = Field(description="The preferred term.")


class NodeAffinity(SpecModel):
    """Node affinity."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Hard requirement."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        Field(default=None, description="Soft preferences.")
    )


class PodAffinityTerm(SpecModel):
    """Pods (by label) that a pod should, or should not, share a topology domain with."""

    label_selector: LabelSelector | None = Field(default=None, description="Which pods.")
    namespaces: list[str] | None = Field(default=None, description="Their namespaces.")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Their namespaces, by label."
    )
    topology_key: QualifiedName = Field(description="Node label defining the domain.")


class WeightedPodAffinityTerm(SpecModel):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(SpecModel):
    """Pod affinity or anti-affinity."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, description="Hard requirements."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = (
        Field(default=None, description="Soft preferences.")
    )


class Affinity(SpecModel):
    """Scheduling affinity, as in a Kubernetes pod."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity.")


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
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: Annotated[str, AfterValidator(_check_sub_path)] | None = Field(
        default=None, description="Mount only this relative sub-path of the volume."
    )
    pvc: ObjectName | None = Field(default=None, description="PersistentVolumeClaim name.")
    empty_dir: EmptyDir | None = Field(default=None, description="A scratch directory.")
    host_path: HostPath | None = Field(default=None, description="A node directory.")
    config_map: ObjectName | None = Field(default=None, description="ConfigMap name.")
    secret: ObjectName | None = Field(default=None, description="Secret name.")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> Volume:
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


class Checkpoint(SpecModel):
    """Where the training code writes checkpoints and resumes from.

    The location reaches the code as ``$KUBEDL_PREFECT_CHECKPOINT_DIR``. A path must be on a
    volume (``pvc`` here, or one of ``volumes``): the container's own filesystem is lost when a
    pod is recreated.
    """

    location: NonEmptyStr = Field(
        description="An absolute path in the container, or a URI such as s3://bucket/run."
    )
    pvc: ObjectName | None = Field(
        default=None, description="PersistentVolumeClaim to mount at mountPath for checkpoints."
    )
    mount_path: AbsolutePath = Field(
        default="/checkpoints", description="Where the checkpoint PVC is mounted."
    )


# --- job-level settings --------------------------------------------------------------------


class Gang(SpecModel):
    """All-or-nothing scheduling of the job's pods.

    Gang scheduling itself is switched on in the operator (``--gang-scheduler-name``); these
    fields tune it per job and ``scheduler`` also sets every pod's ``schedulerName``.
    """

    min_available: PositiveInt32 | None = Field(
        default=None, description="Pods that must fit together (default: all)."
    )
    queue: str | None = Field(default=None, description="Scheduler queue (Volcano queue).")
    priority_class: ObjectName | None = Field(
        default=None, description="PriorityClass of the pod group."
    )
    scheduler: ObjectName | None = Field(
        default=None, description="Pod schedulerName, e.g. volcano."
    )


class Network(SpecModel):
    """Network settings for collective communication."""

    nccl_socket_ifname: NonEmptyStr | None = Field(
        default=None, description="NCCL_SOCKET_IFNAME, e.g. eth0 or ^lo,docker."
    )
    host_network: bool = Field(default=False, description="Run the pods on the host network.")


class Elastic(SpecModel):
    """Elastic PyTorch training (torchrun rendezvous); the Worker count varies in [min, max]."""

    min_replicas: PositiveInt32 = Field(description="Fewest workers to keep training.")
    max_replicas: PositiveInt32 = Field(description="Most workers.")
    max_restarts: Int32 | None = Field(
        default=None, description="Rendezvous restarts torchrun allows."
    )
    rdzv_backend: Literal["c10d", "etcd", "etcd-v2"] = Field(
        default="c10d", description="Rendezvous backend."
    )


# --- container settings shared by the top level and each role ------------------------------


def _check_pod_template(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    unknown = sorted(set(value) - {"metadata", "spec"})
    if unknown:
        raise spec_error(
            f"a pod template has only metadata and spec, not {', '.join(map(repr, unknown))}",
            "put pod fields under spec (e.g. spec: {priorityClassName: high})",
        )
    for part in ("metadata", "spec"):
        if part in value and not isinstance(value[part], dict):
            raise spec_error(f"podTemplate.{part} must be a mapping", f"write {part}: {{...}}")
    return value


PodTemplate = Annotated[dict[str, Any] | None, AfterValidator(_check_pod_template)]


class ContainerSettings(SpecModel):
    """Settings of the training container and its pod, given at the top level or per role."""

    image: NonEmptyStr | None = Field(default=None, description="Container image.")
    image_pull_policy: ImagePullPolicy | None = Field(
        default=None, description="Always, IfNotPresent or Never."
    )
    command: list[str] | None = Field(
        default=None, description="Entrypoint (replaces the image's)."
    )
    args: list[str] | None = Field(default=None, description="Arguments.")
    working_dir: str | None = Field(default=None, description="Working directory.")
    env: Env | None = Field(
        default=None, description="Environment; a role's entries override the top level's."
    )
    resources: Resources | None = Field(
        default=None, description="Resources per replica; a role's replace the top level's."
    )
    node_selector: dict[QualifiedName, LabelValue] | None = Field(
        default=None, description="Node labels the pods require."
    )
    tolerations: list[Toleration] | None = Field(default=None, description="Tolerated taints.")
    affinity: Affinity | None = Field(default=None, description="Scheduling affinity.")
    pod_template: PodTemplate = Field(
        default=None,
        description="Raw pod-template fields deep-merged last (escape hatch; see docs/spec.md).",
    )


def _count_shorthand(value: Any) -> Any:
    # `worker: 2` is short for `worker: {count: 2}`.
    if isinstance(value, int) and not isinstance(value, bool):
        return {"count": value}
    return value


class RoleSpec(ContainerSettings):
    """One replica role (``master``, ``worker``...): how many, and what differs from the top."""

    count: PositiveInt32 = Field(default=1, description="Number of replicas (at least 1).")
    restart_policy: RestartPolicyField | None = Field(
        default=None,
        description="OnFailure, ExitCode or Never (default: ExitCode for master, chief and "
        "launcher, OnFailure otherwise). Always is refused.",
    )


RoleSpecField = Annotated[RoleSpec, BeforeValidator(_count_shorthand)]


@dataclass(frozen=True)
class ResolvedRole:
    """A role with the top-level settings applied: what the renderers turn into a replica spec.

    Attributes:
        role: The role.
        path: Field path of the role in the spec (``replicas.worker``), for error messages.
        count: Number of replicas.
        restart_policy: The effective restart policy.
        image: The effective image (``None`` only in a spec that fails validation).
        env: Top-level env with the role's entries applied.
        resources: The role's resources, else the top level's.
        resources_path: Where ``resources`` came from (``replicas.worker.resources``).
        pod_templates: Raw pod-template fragments, top level first, role last.
    """

    role: Role
    path: str
    count: int
    restart_policy: RestartPolicy
    image: str | None
    image_pull_policy: ImagePullPolicy | None
    command: list[str] | None
    args: list[str] | None
    working_dir: str | None
    env: dict[str, EnvValue]
    resources: Resources | None
    resources_path: str
    node_selector: dict[str, str] | None
    tolerations: list[Toleration] | None
    affinity: Affinity | None
    pod_templates: tuple[dict[str, Any], ...]


class TrainingJobSpec(ContainerSettings):
    """A distributed training job, independent of the operator that will run it.

    Example:
        >>> spec = TrainingJobSpec(
        ...     name="mnist",
        ...     image="ghcr.io/example/mnist:1.0",
        ...     replicas={Role.MASTER: RoleSpec(), Role.WORKER: RoleSpec(count=2)},
        ... )
        >>> [r.restart_policy.value for r in spec.resolved_roles()]
        ['ExitCode', 'OnFailure']
    """

    api_version: Literal["kubedl-prefect.io/v1alpha1"] = Field(
        default=SPEC_API_VERSION, description="Version of this spec format."
    )
    kind: Literal["TrainingJob"] = Field(default=SPEC_KIND, description="Always TrainingJob.")
    name: DNS1035Name = Field(
        description="Job name (DNS-1035); its maximum length depends on the roles' suffixes."
    )
    framework: Framework = Field(
        default=Framework.PYTORCH, description="pytorch, tensorflow, mpi or xgboost."
    )
    replicas: dict[Role, RoleSpecField] = Field(
        description="Roles and their replicas, e.g. {master: 1, worker: {count: 2}}."
    )
    backoff_limit: Int32 | None = Field(
        default=None, description="Retries (container restarts) before the job is failed."
    )
    active_deadline_seconds: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Seconds the job may run before the operator fails it."
    )
    ttl_seconds_after_finished: Int32 | None = Field(
        default=None, description="Seconds after finishing before the operator deletes the job."
    )
    clean_pod_policy: CleanPodPolicy = Field(
        default=CleanPodPolicy.RUNNING,
        description="Pods deleted when the job finishes: Running (default), All or None.",
    )
    gang: Gang | None = Field(default=None, description="Gang-scheduling settings.")
    volumes: list[Volume] | None = Field(default=None, description="Volumes for every role.")
    checkpoint: Checkpoint | None = Field(default=None, description="Checkpoint location.")
    network: Network | None = Field(default=None, description="NCCL and host networking.")
    elastic: Elastic | None = Field(
        default=None, description="Elastic training (PyTorch, Kubeflow only)."
    )
    labels: dict[QualifiedName, LabelValue] | None = Field(
        default=None, description="Labels of the job and its pods."
    )
    annotations: dict[QualifiedName, str] | None = Field(
        default=None, description="Annotations of the job and its pods."
    )
    service_account_name: ObjectName | None = Field(
        default=None, description="ServiceAccount the pods run as."
    )
    image_pull_secrets: list[ObjectName] | None = Field(
        default=None, description="Secrets for pulling the image."
    )
    slots_per_worker: PositiveInt32 | None = Field(
        default=None, description="MPI only: slots per worker in the hostfile."
    )
    success_policy: Literal["", "AllWorkers"] | None = Field(
        default=None, description="TensorFlow only: AllWorkers, or empty for worker 0."
    )
    nproc_per_node: str | None = Field(
        default=None,
        description="PyTorch, Kubeflow only: processes per pod (auto, cpu, gpu or a number).",
    )

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_secrets(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise spec_error("a secret is listed twice", "list each secret once")
        return value

    @field_validator("replicas")
    @classmethod
    def _some_roles(cls, value: dict[Role, RoleSpec]) -> dict[Role, RoleSpec]:
        if not value:
            raise spec_error("a job needs at least one role", "add e.g. worker: {count: 1}")
        return value

    @model_validator(mode="after")
    def _cross_field_checks(self) -> TrainingJobSpec:
        issues = spec_issues(self)
        if issues:
            summary = "; ".join(str(issue) for issue in issues)
            raise PydanticCustomError(
                "spec_issues",
                "{summary}",
                {"summary": summary, "issues": tuple(issues)},
            )
        return self

    def resolved_roles(self) -> list[ResolvedRole]:
        """The roles in the framework's order, with top-level settings applied."""
        order = FRAMEWORKS[self.framework].roles
        roles = sorted(self.replicas, key=lambda r: order.index(r) if r in order else len(order))
        return [self._resolve(role, self.replicas[role]) for role in roles]

    def _resolve(self, role: Role, spec: RoleSpec) -> ResolvedRole:
        path = f"replicas.{role.value}"
        env = dict(self.env or {})
        env.update(spec.env or {})
        templates = tuple(t for t in (self.pod_template, spec.pod_template) if t)

        return ResolvedRole(
            role=role,
            path=path,
            count=spec.count,
            restart_policy=spec.restart_policy or default_restart_policy(role),
            image=_pick(spec.image, self.image),
            image_pull_policy=_pick(spec.image_pull_policy, self.image_pull_policy),
            command=_pick(spec.command, self.command),
            args=_pick(spec.args, self.args),
            working_dir=_pick(spec.working_dir, self.working_dir),
            env=env,
            resources=_pick(spec.resources, self.resources),
            resources_path=f"{path}.resources" if spec.resources is not None else "resources",
            node_selector=_pick(spec.node_selector, self.node_selector),
            tolerations=_pick(spec.tolerations, self.tolerations),
            affinity=_pick(spec.affinity, self.affinity),
            pod_templates=templates,
        )

    def replica_counts(self) -> list[tuple[Role, int]]:
        """``(role, most replicas it can have)``; elastic workers count at their maximum."""
        counts = []
        for role, spec in self.replicas.items():
            count = spec.count
            if self.elastic is not None and role is Role.WORKER:
                count = max(count, self.elastic.max_replicas)
            counts.append((role, count))
        return counts
