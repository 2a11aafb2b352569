"""Enumerations and per-framework tables shared by the spec model, its checks and the renderers.

The tables are the facts read from the operators' Go code (KubeDL v0.5.0 ``apis/training/v1alpha1``,
Kubeflow training-operator v1.9.4 ``pkg/apis/kubeflow.org/v1``): the replica types each kind
knows, the container each operator looks for, and the kinds' plural names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final


class Framework(StrEnum):
    """The training framework, which picks the custom-resource kind."""

    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"
    MPI = "mpi"
    XGBOOST = "xgboost"


class Dialect(StrEnum):
    """The operator a spec is rendered for."""

    KUBEDL = "kubedl"
    """KubeDL, API group ``training.kubedl.io/v1alpha1``."""
    KUBEFLOW = "kubeflow"
    """Kubeflow training operator v1, API group ``kubeflow.org/v1``."""
    TRAINER = "trainer"
    """Kubeflow Trainer v2, API group ``trainer.kubeflow.org/v1alpha1``: one ``TrainJob`` kind."""


class Role(StrEnum):
    """A replica role. The value is the key used in a spec's ``replicas`` mapping."""

    MASTER = "master"
    WORKER = "worker"
    CHIEF = "chief"
    PS = "ps"
    EVALUATOR = "evaluator"
    LAUNCHER = "launcher"

    @property
    def replica_type(self) -> str:
        """The operators' replica type (the key in ``*ReplicaSpecs``), e.g. ``Master``, ``PS``."""
        return _REPLICA_TYPES[self]


_REPLICA_TYPES: Final = MappingProxyType(
    {
        Role.MASTER: "Master",
        Role.WORKER: "Worker",
        Role.CHIEF: "Chief",
        Role.PS: "PS",
        Role.EVALUATOR: "Evaluator",
        Role.LAUNCHER: "Launcher",
    }
)


class RestartPolicy(StrEnum):
    """What the operator does when a replica's container exits with an error.

    ``Always`` is deliberately absent: a replica that restarts in place forever never lets the
    job fail, so a crashing script holds its GPUs until someone notices.
    """

    ON_FAILURE = "OnFailure"
    """Restart the container in place (counts against ``backoffLimit``)."""
    NEVER = "Never"
    """Do not restart: the replica's failure fails the job."""
    EXIT_CODE = "ExitCode"
    """Recreate the pod only for retryable exit codes (130, 137, 138, 143); fail otherwise."""


class CleanPodPolicy(StrEnum):
    """Which pods the operator deletes when the job finishes."""

    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class ImagePullPolicy(StrEnum):
    """The container image pull policy."""

    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


@dataclass(frozen=True)
class FrameworkInfo:
    """What one framework looks like in each operator.

    Attributes:
        kind: The custom-resource kind (same name in both dialects).
        plural: The resource's plural name (same in both dialects).
        replica_specs_field: The field under ``spec`` holding the replica specs.
        roles: The roles this framework knows, in the order they are rendered.
        single_replica_roles: Roles that must have exactly one replica (``Master``, ``Launcher``).
        containers: The container name each operator looks for, per dialect.
    """

    kind: str
    plural: str
    replica_specs_field: str
    roles: tuple[Role, ...]
    single_replica_roles: frozenset[Role]
    containers: MappingProxyType[Dialect, str]

    def container_name(self, dialect: Dialect) -> str:
        """The name the operator of ``dialect`` expects the training container to have."""
        return self.containers[dialect]


FRAMEWORKS: Final = MappingProxyType(
    {
        Framework.PYTORCH: FrameworkInfo(
            kind="PyTorchJob",
            plural="pytorchjobs",
            replica_specs_field="pytorchReplicaSpecs",
            roles=(Role.MASTER, Role.WORKER),
            single_replica_roles=frozenset({Role.MASTER}),
            containers=MappingProxyType({Dialect.KUBEDL: "pytorch", Dialect.KUBEFLOW: "pytorch"}),
        ),
        Framework.TENSORFLOW: FrameworkInfo(
            kind="TFJob",
            plural="tfjobs",
            replica_specs_field="tfReplicaSpecs",
            roles=(Role.CHIEF, Role.MASTER, Role.PS, Role.WORKER, Role.EVALUATOR),
            single_replica_roles=frozenset({Role.CHIEF, Role.MASTER}),
            containers=MappingProxyType(
                {Dialect.KUBEDL: "tensorflow", Dialect.KUBEFLOW: "tensorflow"}
            ),
        ),
        Framework.MPI: FrameworkInfo(
            kind="MPIJob",
            plural="mpijobs",
            replica_specs_field="mpiReplicaSpecs",
            roles=(Role.LAUNCHER, Role.WORKER),
            single_replica_roles=frozenset({Role.LAUNCHER}),
            containers=MappingProxyType({Dialect.KUBEDL: "mpi", Dialect.KUBEFLOW: "mpi"}),
        ),
        Framework.XGBOOST: FrameworkInfo(
            kind="XGBoostJob",
            plural="xgboostjobs",
            replica_specs_field="xgbReplicaSpecs",
            roles=(Role.MASTER, Role.WORKER),
            single_replica_roles=frozenset({Role.MASTER}),
            # KubeDL's XGBoostJobDefaultContainerName is "xgboostjob", Kubeflow's is "xgboost".
            containers=MappingProxyType(
                {Dialect.KUBEDL: "xgboostjob", Dialect.KUBEFLOW: "xgboost"}
            ),
        ),
    }
)


def main_container_names(framework: Framework, container_name: str | None = None) -> frozenset[str]:
    """The names that address a role's training container ("the main container") in a spec.

    Each operator's own name for the framework, whichever the dialect (an XGBoost job's main
    container is ``xgboostjob`` to KubeDL and ``xgboost`` to Kubeflow), and the spec's
    ``containerName`` when it sets one (MPI jobs).

    Example:
        >>> sorted(main_container_names(Framework.XGBOOST))
        ['xgboost', 'xgboostjob']
    """
    names = set(FRAMEWORKS[framework].containers.values())
    if container_name is not None:
        names.add(container_name)
    return frozenset(names)


API_GROUPS: Final = MappingProxyType(
    {
        Dialect.KUBEDL: ("training.kubedl.io", "v1alpha1"),
        Dialect.KUBEFLOW: ("kubeflow.org", "v1"),
        Dialect.TRAINER: ("trainer.kubeflow.org", "v1alpha1"),
    }
)
"""API group and version of the training kinds, per dialect."""

TRAINJOB_KIND: Final = "TrainJob"
"""Kubeflow Trainer v2's one kind for every framework (the ``trainer`` dialect)."""

TRAINJOB_PLURAL: Final = "trainjobs"
"""Its plural name."""

COORDINATOR_ROLES: Final = frozenset({Role.MASTER, Role.CHIEF, Role.LAUNCHER})
"""Roles that coordinate the others; their default restart policy is ``ExitCode``."""

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource that ``gpus`` renders to."""

CHECKPOINT_ENV: Final = "KUBEDL_PREFECT_CHECKPOINT_DIR"
"""Environment variable that passes the checkpoint location to the training code."""

NCCL_IFNAME_ENV: Final = "NCCL_SOCKET_IFNAME"
"""Environment variable that pins NCCL's network interface."""


def default_restart_policy(role: Role) -> RestartPolicy:
    """Our default restart policy for ``role``: ``ExitCode`` for coordinators, else ``OnFailure``.

    Both dialects get the policy explicitly, because their own defaults differ (KubeDL TFJob
    ``ExitCode``, Kubeflow TFJob ``Never``, ...).
    """
    return RestartPolicy.EXIT_CODE if role in COORDINATOR_ROLES else RestartPolicy.ON_FAILURE


@dataclass(frozen=True)
class JobResource:
    """Where a rendered job lives in the Kubernetes API.

    Attributes:
        group: API group, e.g. ``training.kubedl.io``.
        version: API version, e.g. ``v1alpha1``.
        kind: Resource kind, e.g. ``PyTorchJob``.
        plural: Resource plural, e.g. ``pytorchjobs`` (the path segment of the REST API).
    """

    group: str
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        """``group/version``, the manifest's ``apiVersion``."""
        return f"{self.group}/{self.version}"


def job_resource(dialect: Dialect | str, framework: Framework | str) -> JobResource:
    """The API coordinates of the custom resource for ``framework`` in ``dialect``.

    The ``trainer`` dialect has one kind, ``TrainJob``, whatever the framework.

    Example:
        >>> job_resource("kubeflow", "pytorch").api_version
        'kubeflow.org/v1'
        >>> job_resource("trainer", "mpi").kind
        'TrainJob'
    """
    info = FRAMEWORKS[Framework(framework)]
    chosen = Dialect(dialect)
    group, version = API_GROUPS[chosen]
    if chosen is Dialect.TRAINER:
        return JobResource(group=group, version=version, kind=TRAINJOB_KIND, plural=TRAINJOB_PLURAL)
    return JobResource(group=group, version=version, kind=info.kind, plural=info.plural)
