"""The framework-neutral training-job spec: frozen pydantic v2 models.

One :class:`TrainingJobSpec` describes a distributed training job once; the renderers turn it
into a KubeDL or a Kubeflow custom resource. Field names are snake_case in Python and camelCase
in YAML (``node_selector`` / ``nodeSelector``); unknown fields are refused, never pruned.

Settings such as ``image``, ``env`` or ``resources`` given at the top level apply to every role;
a role (``replicas.worker``) may override them. ``docs/spec.md`` is the reference.

Constructing a model directly raises :class:`pydantic.ValidationError` on bad input;
:func:`kubedl_prefect.spec.parse_spec` and :func:`kubedl_prefect.spec.load_spec` raise
:class:`kubedl_prefect.errors.SpecError` with field paths and fixes instead.

The building blocks live in :mod:`kubedl_prefect.spec.fields` (the base model, constrained
scalars) and :mod:`kubedl_prefect.spec.kube_types` (the pod settings passed through: environment,
resources, tolerations, affinity, volumes); they are re-exported here, but for the models of
affinity and autoscaling metrics, which are imported when a spec first holds one
(:mod:`kubedl_prefect.spec.affinity`, :mod:`kubedl_prefect.spec.metrics`).
"""

# No `from __future__ import annotations`: pydantic takes these modules' annotations as they
# are instead of compiling and evaluating each one's text when the classes are made (a start-up
# cost of kubedl-prefect validate); a class named before its definition is written in quotes.

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeVar

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kubedl_prefect.spec.checks import spec_issues
from kubedl_prefect.spec.fields import (
    INT32_MAX,
    AbsolutePath,
    ConfigKey,
    DNS1035Name,
    DNS1123Label,
    EnvName,
    Int32,
    LabelValue,
    NonEmptyStr,
    ObjectName,
    PodFieldPath,
    PortNumber,
    PositiveInt32,
    QualifiedName,
    Quantity,
    SpecModel,
    StrictBool,
    StrictInt,
    SubPath,
    spec_error,
)
from kubedl_prefect.spec.kube_types import (
    AffinityField,
    ContainerPort,
    EmptyDir,
    Env,
    EnvValue,
    EnvValueField,
    FieldRef,
    HostPath,
    KeyRef,
    MetricSpecField,
    PodTemplate,
    PortName,
    Ports,
    Resources,
    Toleration,
    Volume,
)
from kubedl_prefect.spec.reader import data_issue
from kubedl_prefect.spec.types import (
    FRAMEWORKS,
    CleanPodPolicy,
    Framework,
    ImagePullPolicy,
    RestartPolicy,
    Role,
    default_restart_policy,
)

if TYPE_CHECKING:
    from kubedl_prefect.spec.affinity import Affinity

SPEC_API_VERSION: Final = "kubedl-prefect.io/v1alpha1"
"""The ``apiVersion`` of a spec document (our format's version, not a Kubernetes API)."""

SPEC_KIND: Final = "TrainingJob"
"""The ``kind`` of a spec document."""

__all__ = [
    "INT32_MAX",
    "SPEC_API_VERSION",
    "SPEC_KIND",
    "AbsolutePath",
    "Checkpoint",
    "ConfigKey",
    "ContainerPort",
    "ContainerSettings",
    "DNS1035Name",
    "DNS1123Label",
    "Elastic",
    "EmptyDir",
    "Env",
    "EnvName",
    "EnvValue",
    "EnvValueField",
    "FieldRef",
    "Gang",
    "HostPath",
    "Int32",
    "KeyRef",
    "Kueue",
    "LabelValue",
    "Network",
    "NonEmptyStr",
    "ObjectName",
    "PodFieldPath",
    "PodTemplate",
    "PortName",
    "PortNumber",
    "Ports",
    "PositiveInt32",
    "QualifiedName",
    "Quantity",
    "ResolvedRole",
    "Resources",
    "RestartPolicyField",
    "RoleSpec",
    "RoleSpecField",
    "SpecModel",
    "StrictBool",
    "StrictInt",
    "SubPath",
    "Toleration",
    "TrainerRuntime",
    "TrainingJobSpec",
    "Volume",
    "spec_error",
]

_T = TypeVar("_T")


def _pick(own: _T | None, top: _T | None) -> _T | None:
    return own if own is not None else top


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


class Kueue(SpecModel):
    """Admission by Kueue: the LocalQueue the job waits in, and its priority.

    The job is labelled for Kueue and created suspended; Kueue resumes it once the LocalQueue's
    ClusterQueue has quota for the whole job, and may suspend and requeue it later (the same job
    resumes; nothing is submitted twice). Kubeflow kinds only: Kueue does not manage KubeDL's.
    """

    queue: DNS1123Label = Field(
        description="LocalQueue in the job's namespace (label kueue.x-k8s.io/queue-name)."
    )
    priority_class: DNS1123Label | None = Field(
        default=None,
        description="WorkloadPriorityClass (label kueue.x-k8s.io/priority-class); it orders the "
        "queue and decides preemption.",
    )


class Network(SpecModel):
    """Network settings for collective communication."""

    nccl_socket_ifname: NonEmptyStr | None = Field(
        default=None, description="NCCL_SOCKET_IFNAME, e.g. eth0 or ^lo,docker."
    )
    host_network: StrictBool = Field(default=False, description="Run the pods on the host network.")


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
    metrics: list[MetricSpecField] | None = Field(
        default=None,
        description="Metrics the operator's autoscaler scales the workers on (autoscaling/v2).",
    )


class TrainerRuntime(SpecModel):
    """The Kubeflow Trainer v2 runtime a ``trainer`` job starts from (its ``runtimeRef``).

    Without it each framework gets the ClusterTrainingRuntime Trainer v2.3.0 installs for it
    (``torch-distributed``, ``deepspeed-distributed``, ``xgboost-distributed``). Name another
    one to get its pod template, its gang scheduling (``podGroupPolicy``) or its image.
    """

    name: ObjectName = Field(description="The runtime's name.")
    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = Field(
        default="ClusterTrainingRuntime",
        description="ClusterTrainingRuntime (cluster-wide) or TrainingRuntime (the job's "
        "namespace).",
    )


# --- container settings shared by the top level and each role ------------------------------


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
    affinity: AffinityField | None = Field(default=None, description="Scheduling affinity.")
    priority_class_name: ObjectName | None = Field(
        default=None, description="PriorityClass of the pods (gang.priorityClass: the group's)."
    )
    ports: Ports | None = Field(default=None, description="Ports of the training container.")
    service_account_name: ObjectName | None = Field(
        default=None, description="ServiceAccount the pods run as."
    )
    image_pull_secrets: list[ObjectName] | None = Field(
        default=None, description="Secrets for pulling the image."
    )
    container_name: DNS1123Label | None = Field(
        default=None,
        description="MPI only: the training container's name (default: mpi).",
    )
    pod_template: PodTemplate = Field(
        default=None,
        description="Raw pod-template fields deep-merged last (escape hatch; see docs/spec.md).",
    )

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_secrets(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise spec_error("a secret is listed twice", "list each secret once")
        return value


def _count_shorthand(value: Any) -> Any:
    # `worker: 2` is short for `worker: {count: 2}`.
    if isinstance(value, bool):
        raise spec_error(
            f"{str(value).lower()} is a boolean, not a replica count",
            "write a whole number (worker: 2) or the role's settings (worker: {count: 2, ...})",
        )
    if isinstance(value, int):
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
        container_name: The training container's name if the spec sets one (MPI only), else
            ``None``: each operator's own name.
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
    affinity: "Affinity | None"
    priority_class_name: str | None
    ports: list[ContainerPort] | None
    service_account_name: str | None
    image_pull_secrets: list[str] | None
    container_name: str | None
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
    active_deadline_seconds: Annotated[StrictInt, Field(ge=1)] | None = Field(
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
    kueue: Kueue | None = Field(
        default=None,
        description="Admission by Kueue: LocalQueue and WorkloadPriorityClass (Kubeflow only).",
    )
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
    runtime: TrainerRuntime | None = Field(
        default=None,
        description="Trainer only: the runtime the TrainJob starts from (default: Trainer's "
        "own runtime for the framework).",
    )
    pod_security: Literal["baseline", "privileged"] | None = Field(
        default=None,
        description="The Pod Security level the pods need: baseline (the default) refuses "
        "settings that break it (privileged, host namespaces, hostPath...); privileged allows "
        "them (see docs/spec.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _bounded_input(cls, data: Any) -> Any:
        # Before anything walks the input: a dict built in Python has no text to bound, and a
        # few shared references make billions of nodes; the limits are the YAML reader's.
        issue = data_issue(data)
        if issue is not None:
            raise PydanticCustomError(
                "spec_issues", "{summary}", {"summary": str(issue), "issues": (issue,)}
            )
        return data

    @field_validator("pod_security")
    @classmethod
    def _baseline_is_the_default(cls, value: str | None) -> str | None:
        # `podSecurity: baseline` says what leaving it out says: the same spec, the same hash.
        return None if value == "baseline" else value

    @field_validator("replicas")
    @classmethod
    def _some_roles(cls, value: dict[Role, RoleSpec]) -> dict[Role, RoleSpec]:
        if not value:
            raise spec_error("a job needs at least one role", "add e.g. worker: {count: 1}")
        return value

    @model_validator(mode="after")
    def _cross_field_checks(self) -> "TrainingJobSpec":
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

    def _resolve(self, role: Role, spec: RoleSpec) -> "ResolvedRole":
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
            priority_class_name=_pick(spec.priority_class_name, self.priority_class_name),
            ports=_pick(spec.ports, self.ports),
            service_account_name=_pick(spec.service_account_name, self.service_account_name),
            image_pull_secrets=_pick(spec.image_pull_secrets, self.image_pull_secrets),
            container_name=_pick(spec.container_name, self.container_name),
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
