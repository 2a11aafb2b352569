"""Rendering to Kubeflow Trainer v2 (``trainer.kubeflow.org/v1alpha1`` ``TrainJob``).

What Trainer v2.3.0 reads (its Go types, ``pkg/apis/trainer/v1alpha1/trainjob_types.go``, and the
plugins under ``pkg/runtime/framework/plugins``):

- one kind for every framework; ``spec.runtimeRef`` names the runtime the job starts from (a
  ``ClusterTrainingRuntime`` unless ``kind`` says ``TrainingRuntime``). The runtime brings the
  JobSet template: one replicated Job ``node`` (torch, XGBoost), or ``launcher`` and ``node``
  (MPI), each with a training container named ``node``;
- ``spec.trainer`` sets that container: ``image``, ``command``, ``args``, ``env``,
  ``resourcesPerNode``, and ``numNodes`` (the pods of ``node``), ``numProcPerNode`` (an int32
  since v2.2: torchrun's processes per node, MPI's slots per node);
- the TrainJob has no labels or annotations of its own for the pods: those, and every pod-level
  setting (service account, node selector, affinity, tolerations, image pull secrets, volumes
  and the training container's mounts, the pod's security context), go through
  ``spec.runtimePatches`` (since v2.2; ``podTemplateOverrides`` is gone), an entry per manager
  (:data:`RUNTIME_PATCH_MANAGER` is ours) that Trainer merges into the runtime's JobSet
  template. The Volcano queue is an annotation of that template (``scheduling.volcano.sh/
  queue-name``): Trainer's Volcano plugin reads it there, not on the TrainJob;
- gang scheduling is the runtime's ``podGroupPolicy``; the PodGroup is named like the TrainJob.

What a spec can say and a TrainJob cannot (TensorFlow, elastic training, restart policies per
role, host networking, a scheduler or PriorityClass of the pods...) is refused before
submission by :func:`trainer_issues`, naming the spec field and the fix; what only changes
meaning (a v1 job's clean-pod policy, its restart policies) is listed by :func:`trainer_notes`.

Example:
    >>> from kubedl_prefect.spec import parse_spec
    >>> spec = parse_spec({"name": "mnist", "image": "busybox", "command": ["torchrun", "t.py"],
    ...                    "replicas": {"master": 1, "worker": 2}})
    >>> body = render_trainer(spec, RenderOptions())["spec"]
    >>> body["runtimeRef"], body["trainer"]["numNodes"]
    ({'name': 'torch-distributed'}, 3)
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.model import ResolvedRole, TrainingJobSpec
from kubedl_prefect.spec.naming import (
    ATTEMPT_SUFFIX_MAX_LENGTH,
    DNS1035_MAX,
    is_dns1035_label,
)
from kubedl_prefect.spec.renderers.common import (
    Manifest,
    RenderOptions,
    pod_template,
)
from kubedl_prefect.spec.types import (
    CleanPodPolicy,
    Dialect,
    Framework,
    Role,
    default_restart_policy,
    job_resource,
)

__all__ = [
    "DEFAULT_RUNTIMES",
    "MPI_LAUNCHER_JOB",
    "NODE_JOB",
    "RESERVED_ENV",
    "RUNTIME_JOBS_ANNOTATION",
    "RUNTIME_PATCH_MANAGER",
    "TRAINER_CONTAINER",
    "VOLCANO_QUEUE_ANNOTATION",
    "RuntimeJob",
    "fit_runtime_patches",
    "render_trainer",
    "runtime_issues",
    "runtime_jobs",
    "runtime_pods",
    "trainer_host_suffixes",
    "trainer_issues",
    "trainer_notes",
]

DEFAULT_RUNTIMES: Final = MappingProxyType(
    {
        Framework.PYTORCH: "torch-distributed",
        Framework.MPI: "deepspeed-distributed",
        Framework.XGBOOST: "xgboost-distributed",
    }
)
"""The ClusterTrainingRuntime each framework starts from unless the spec names another.

Trainer v2.3.0 installs (``manifests/base/runtimes``) ``torch-distributed``,
``xgboost-distributed``, ``jax-distributed`` and two MPI runtimes, ``deepspeed-distributed``
(OpenMPI, the launcher also a node) and ``mlx-distributed``; there is no plain ``mpi-distributed``
at that tag, so MPI jobs take the DeepSpeed one, the general OpenMPI runtime. TensorFlow has none.
"""

RUNTIME_KINDS: Final = ("ClusterTrainingRuntime", "TrainingRuntime")
"""The kinds a ``runtimeRef`` may name; the first is Trainer's default."""

TRAINER_API_GROUP: Final = "trainer.kubeflow.org"
"""``runtimeRef.apiGroup``'s default (and only) value."""

TRAINER_CONTAINER: Final = "node"
"""The training container's name in every runtime of Trainer v2.3.0 (``constants.Node``)."""

NODE_JOB: Final = "node"
"""The replicated Job of the training nodes."""

MPI_LAUNCHER_JOB: Final = "launcher"
"""The replicated Job of an MPI runtime's launcher."""

TRAINER_ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
"""The label of a runtime's replicated Job template saying which step it is (``trainer``,
``dataset-initializer``, ``model-initializer``): Trainer finds the trainer Job by it, not by
its name."""

TRAINER_ANCESTOR: Final = "trainer"
""":data:`TRAINER_ANCESTOR_LABEL`'s value on the Job whose container the ``trainer`` field sets."""

RUNTIME_JOBS_ANNOTATION: Final = "kubedl-prefect.io/runtime-jobs"
"""Set at submission on a TrainJob whose runtime names its Jobs otherwise than Trainer's release:
``{replicated Job: {"pods": n, "trainer": true}}`` as JSON (:func:`runtime_pods`; ``trainer``
where the TrainJob's ``resourcesPerNode`` applies), so that a diagnosis of a job that has not
started knows its roles without reading the runtime again."""

RUNTIME_PATCH_MANAGER: Final = "kubedl-prefect.io/spec"
"""The ``manager`` of the runtime patch kubedl-prefect writes (a domain-prefixed path)."""

VOLCANO_QUEUE_ANNOTATION: Final = "scheduling.volcano.sh/queue-name"
"""Where Trainer's Volcano plugin reads the queue: an annotation of the JobSet template."""

RESERVED_ENV: Final = MappingProxyType(
    {
        Framework.PYTORCH: frozenset(
            {
                "PET_NNODES",
                "PET_NPROC_PER_NODE",
                "PET_NODE_RANK",
                "PET_MASTER_ADDR",
                "PET_MASTER_PORT",
            }
        ),
        Framework.XGBOOST: frozenset(
            {"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"}
        ),
        Framework.MPI: frozenset(),
    }
)
"""Variables the framework's plugin sets and Trainer's webhook refuses in ``trainer.env``."""

POD_PATCH_FIELDS: Final = (
    "serviceAccountName",
    "volumes",
    "initContainers",
    "containers",
    "imagePullSecrets",
    "securityContext",
    "nodeSelector",
    "affinity",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)
"""The pod fields a runtime patch may set (``PodSpecPatch``), in its order."""

CONTAINER_PATCH_FIELDS: Final = ("name", "env", "volumeMounts", "securityContext")
"""The container fields a runtime patch may set (``ContainerPatch``)."""

_TRAINER_FIELDS: Final = ("image", "command", "args", "env", "resources")
"""The training container's fields that go to ``spec.trainer``."""

_SPEC_FIELD_OF_POD_KEY: Final = MappingProxyType(
    {
        "priorityClassName": "priorityClassName",
        "schedulerName": "gang.scheduler",
        "hostNetwork": "network.hostNetwork",
        "dnsPolicy": "network.hostNetwork",
    }
)
_SPEC_FIELD_OF_CONTAINER_KEY: Final = MappingProxyType({"workingDir": "workingDir"})
_NOTED_CONTAINER_FIELDS: Final = ("imagePullPolicy", "ports")
"""Container fields a TrainJob cannot set but whose loss changes no result: noted, not refused
(Trainer's torch plugin opens its own port, 29500; the runtime's pull policy applies)."""


def default_runtime(framework: Framework) -> str | None:
    """The runtime a ``trainer`` job of ``framework`` starts from by default, if Trainer has one.

    Example:
        >>> default_runtime(Framework.PYTORCH), default_runtime(Framework.TENSORFLOW)
        ('torch-distributed', None)
    """
    return DEFAULT_RUNTIMES.get(framework)


def trainer_host_suffixes(spec: TrainingJobSpec) -> tuple[str, ...]:
    """The suffixes the JobSet controller adds to the job's name for its pods' host names.

    ``<job>-node-0-<i>`` for the nodes, ``<job>-launcher-0-0`` for an MPI launcher (a host name
    must be a DNS label of at most 63 characters; the headless Service is named like the job).

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> trainer_host_suffixes(parse_spec(
        ...     {"name": "m", "image": "i", "replicas": {"master": 1, "worker": 10}}))
        ('-node-0-10',)
    """
    nodes = _num_nodes(spec)
    if spec.framework is Framework.MPI:
        return (f"-{MPI_LAUNCHER_JOB}-0-0", f"-{NODE_JOB}-0-{max(nodes - 1, 1) - 1}")
    return (f"-{NODE_JOB}-0-{max(nodes, 1) - 1}",)


def max_trainer_job_name(spec: TrainingJobSpec) -> int:
    """The longest cluster job name whose pods' host names fit 63 characters."""
    return DNS1035_MAX - max(len(s) for s in trainer_host_suffixes(spec))


def _num_nodes(spec: TrainingJobSpec) -> int:
    return sum(role.count for role in spec.replicas.values())


# --- the translation -------------------------------------------------------------------------


@dataclass
class _Parts:
    """A spec taken apart into the TrainJob's places, and what has none."""

    trainer: Manifest = field(default_factory=dict)
    container_patch: Manifest = field(default_factory=dict)
    pod_patch: Manifest = field(default_factory=dict)
    pod_metadata: Manifest = field(default_factory=dict)
    issues: list[SpecIssue] = field(default_factory=list)


def _role_template(
    spec: TrainingJobSpec, resolved: ResolvedRole, options: RenderOptions
) -> Manifest:
    return pod_template(spec, resolved, TRAINER_CONTAINER, options)


def _trainer_role(spec: TrainingJobSpec) -> ResolvedRole:
    """The role whose container becomes ``spec.trainer`` (MPI: the launcher)."""
    roles = spec.resolved_roles()
    if spec.framework is Framework.MPI:
        for resolved in roles:
            if resolved.role is Role.LAUNCHER:
                return resolved
    return roles[0]


def _split(spec: TrainingJobSpec, options: RenderOptions) -> _Parts:
    parts = _Parts()
    main = _trainer_role(spec)
    template = _role_template(spec, main, options)
    pod = dict(template.get("spec") or {})
    containers = list(pod.pop("containers", []))
    container = dict(containers[0]) if containers else {}
    for key in _TRAINER_FIELDS:
        if key in container:
            target = "resourcesPerNode" if key == "resources" else key
            parts.trainer[target] = container.pop(key)
    container.pop("name", None)
    for key in _NOTED_CONTAINER_FIELDS:  # the runtime's apply: trainer_notes says so
        container.pop(key, None)
    for key in list(container):
        if key in CONTAINER_PATCH_FIELDS:
            parts.container_patch[key] = container.pop(key)
    for key in container:
        path = _SPEC_FIELD_OF_CONTAINER_KEY.get(key, "podTemplate")
        parts.issues.append(
            SpecIssue(
                path,
                f"a TrainJob cannot set the training container's {key}: Trainer takes it from "
                "the runtime, and a runtime patch may set only env, volumeMounts and "
                "securityContext of a container",
                f"remove {path}, or name a runtime whose template sets {key} (runtime.name)",
            )
        )
    if len(containers) > 1 or pod.get("initContainers"):
        parts.issues.append(
            SpecIssue(
                "podTemplate",
                "a TrainJob cannot add containers: a runtime patch may only change the "
                "runtime's own containers",
                "remove the extra containers, or name a runtime that has them (runtime.name)",
            )
        )
        pod.pop("initContainers", None)
    # A named runtime's podGroupPolicy sets the scheduler (see _job_field_issues).
    pod.pop("schedulerName", None)
    if "hostNetwork" in pod:
        pod.pop("dnsPolicy", None)  # set with it: one refusal of network.hostNetwork
    for key, value in pod.items():
        if key in POD_PATCH_FIELDS:
            parts.pod_patch[key] = value
            continue
        path = _SPEC_FIELD_OF_POD_KEY.get(key, "podTemplate")
        parts.issues.append(
            SpecIssue(
                path,
                f"a TrainJob cannot set the pods' {key}: a runtime patch may set only "
                + ", ".join(POD_PATCH_FIELDS),
                f"remove {path}, or name a runtime whose pod template sets {key} (runtime.name)",
            )
        )
    metadata = template.get("metadata") or {}
    parts.pod_metadata = {k: v for k, v in metadata.items() if k in ("labels", "annotations")}
    return parts


def trainer_issues(spec: TrainingJobSpec, options: RenderOptions | None = None) -> list[SpecIssue]:
    """What makes ``spec`` unfit for Kubeflow Trainer v2, each with the spec field and the fix.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "m", "image": "i", "framework": "tensorflow",
        ...                    "replicas": {"worker": 1}})
        >>> [issue.path for issue in trainer_issues(spec)]
        ['framework']
    """
    options = options or RenderOptions()
    if spec.framework not in DEFAULT_RUNTIMES:
        return [
            SpecIssue(
                "framework",
                f"Kubeflow Trainer v2 has no runtime for {spec.framework.value} jobs "
                "(TensorFlow's was dropped, kubeflow/trainer#2699)",
                "render with --dialect kubeflow or kubedl, or port the job to PyTorch",
            )
        ]
    issues = [*_shape_issues(spec), *_job_field_issues(spec), *_env_issues(spec)]
    issues += _name_issues(spec, options)
    issues += _split(spec, options).issues
    return list(dict.fromkeys(issues))


def _shape_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    roles = spec.resolved_roles()
    main = _trainer_role(spec)
    ignored = {"role", "path", "count", "restart_policy", "resources_path"}
    if spec.framework is Framework.MPI:
        ignored |= {"image", "command", "args"}  # the nodes run the runtime's (sshd)
    for resolved in roles:
        if resolved is main:
            continue
        differing = [
            name
            for name in resolved.__dataclass_fields__
            if name not in ignored and getattr(resolved, name) != getattr(main, name)
        ]
        if differing:
            shown = ", ".join(_camel(name) for name in differing)
            yield SpecIssue(
                resolved.path,
                f"the {resolved.role.value} role differs from the {main.role.value} role in "
                f"{shown}: a TrainJob runs every node from one trainer template",
                f"give both roles the same {shown} (set them at the top level), or render "
                "with --dialect kubeflow",
            )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _job_field_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    if spec.elastic is not None:
        yield SpecIssue(
            "elastic",
            "Trainer v2.2+ has no elastic policy (elasticPolicy was dropped from the torch policy)",
            "remove elastic to train with a fixed node count, or render with --dialect kubeflow",
        )
    if spec.backoff_limit is not None:
        yield SpecIssue(
            "backoffLimit",
            "a TrainJob has no backoffLimit: retries are the runtime's (its JobSet failure "
            "policy and its Jobs' backoffLimit)",
            "remove backoffLimit (kubedl-prefect's own retries still apply), or name a runtime "
            "with the retries you want (runtime.name)",
        )
    nproc = spec.nproc_per_node
    if nproc is not None and nproc != "auto" and not nproc.isdigit():
        yield SpecIssue(
            "nprocPerNode",
            f"Trainer's numProcPerNode is a number since v2.2, not {nproc!r}",
            "give a number of processes per node, or auto (leave it out)",
        )
    gang = spec.gang
    if gang is not None:
        total = _num_nodes(spec)
        if gang.min_available is not None and gang.min_available != total:
            yield SpecIssue(
                "gang.minAvailable",
                f"Trainer's PodGroup always needs every pod ({total}); it has no minAvailable",
                "remove gang.minAvailable",
            )
        if gang.priority_class is not None:
            yield SpecIssue(
                "gang.priorityClass",
                "Trainer gives the PodGroup the PriorityClass of the runtime's pod template; a "
                "TrainJob cannot set one",
                "remove gang.priorityClass, or name a runtime whose pod template sets "
                "priorityClassName (runtime.name)",
            )
        if gang.scheduler is not None and spec.runtime is None:
            yield SpecIssue(
                "gang.scheduler",
                "a TrainJob cannot set the pods' scheduler: gang scheduling is the runtime's "
                "podGroupPolicy, and Trainer's default runtimes have none",
                "name a runtime with podGroupPolicy (runtime: {name: ...}), and remove "
                "gang.scheduler or keep it to say what that runtime does",
            )


def _env_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    reserved = RESERVED_ENV.get(spec.framework, frozenset())
    sources = [("env", spec.env or {})] + [
        (f"replicas.{role.value}.env", role_spec.env or {})
        for role, role_spec in spec.replicas.items()
    ]
    for path, env in sources:
        for name in env:
            if name in reserved:
                yield SpecIssue(
                    f"{path}.{name}",
                    f"{name} is reserved: Trainer's {spec.framework.value} plugin sets it, and "
                    "its webhook refuses a TrainJob that does",
                    f"remove {name} from env (Trainer gives every node its value)",
                )


def _name_issues(spec: TrainingJobSpec, options: RenderOptions) -> Iterator[SpecIssue]:
    suffix = max(trainer_host_suffixes(spec), key=len)
    if options.job_name is not None:
        limit = max_trainer_job_name(spec)
        if len(options.job_name) > limit:
            yield SpecIssue(
                "(options).jobName",
                f"job name {options.job_name!r} is {len(options.job_name)} characters; the "
                f"pods' host names add {suffix!r} and must fit {DNS1035_MAX}",
                f"use a job name of at most {limit} characters",
            )
        return
    limit = max_trainer_job_name(spec) - ATTEMPT_SUFFIX_MAX_LENGTH
    if len(spec.name) > limit:
        yield SpecIssue(
            "name",
            f"the name is {len(spec.name)} characters; a TrainJob's pod host names add the "
            f"attempt suffix (up to {ATTEMPT_SUFFIX_MAX_LENGTH}) and {suffix!r}, and must fit "
            f"{DNS1035_MAX} characters",
            f"shorten the name to {limit} characters or fewer",
        )


def trainer_notes(spec: TrainingJobSpec) -> list[tuple[str, str]]:
    """``(spec field, text)`` for what a TrainJob of ``spec`` does differently than v1 jobs.

    Nothing here is refused: these settings have no place in a TrainJob, and the runtime
    decides instead. ``kubedl-prefect import`` writes them as comments and ``render --dialect
    trainer`` prints them.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "m", "image": "i", "cleanPodPolicy": "None",
        ...                    "replicas": {"master": 1, "worker": 1}})
        >>> [path for path, _ in trainer_notes(spec)]
        ['cleanPodPolicy', 'replicas']
    """
    notes: list[tuple[str, str]] = []
    if spec.framework not in DEFAULT_RUNTIMES:
        return notes
    if spec.clean_pod_policy is not CleanPodPolicy.RUNNING:
        notes.append(
            (
                "cleanPodPolicy",
                f"cleanPodPolicy {spec.clean_pod_policy.value} has no TrainJob field: the "
                "JobSet keeps a finished job's pods until the TrainJob is deleted.",
            )
        )
    for resolved in spec.resolved_roles()[:1]:
        if resolved.image_pull_policy is not None:
            notes.append(
                (
                    "imagePullPolicy",
                    f"imagePullPolicy {resolved.image_pull_policy.value} has no TrainJob field: "
                    "the runtime's pull policy applies.",
                )
            )
        if resolved.ports:
            notes.append(
                (
                    "ports",
                    "ports have no TrainJob field: the runtime's container ports apply (the "
                    "torch plugin opens 29500 for the rendezvous).",
                )
            )
    if spec.ttl_seconds_after_finished is not None:
        notes.append(
            (
                "ttlSecondsAfterFinished",
                "ttlSecondsAfterFinished has no TrainJob field: a finished TrainJob stays until "
                "it is deleted (or the runtime's JobSet TTL removes its JobSet).",
            )
        )
    for resolved in spec.resolved_roles():
        own = spec.replicas[resolved.role].restart_policy
        if own is not None and own is not default_restart_policy(resolved.role):
            notes.append(
                (
                    f"{resolved.path}.restartPolicy",
                    f"restartPolicy {own.value} has no TrainJob field: the runtime's Job "
                    "template and JobSet failure policy decide what a failed pod does.",
                )
            )
    runtime = spec.runtime.name if spec.runtime else DEFAULT_RUNTIMES[spec.framework]
    if spec.framework is Framework.MPI:
        notes.append(
            (
                "replicas",
                f"the launcher and {spec.replicas[Role.WORKER].count} worker(s) become "
                f"numNodes {_num_nodes(spec)} of {runtime}: its launcher is also a node "
                "(runLauncherAsNode) and runs ranks too; the nodes run the runtime's image and "
                "command (sshd), the launcher the spec's.",
            )
        )
    elif len(spec.replicas) > 1:
        notes.append(
            (
                "replicas",
                f"every role becomes one of numNodes {_num_nodes(spec)} identical nodes of "
                f"{runtime}: node 0 takes the master's place (PET_MASTER_ADDR), and the "
                "program starts under torchrun's PET_* variables, not MASTER_ADDR/RANK."
                if spec.framework is Framework.PYTORCH
                else f"every role becomes one of numNodes {_num_nodes(spec)} identical nodes "
                f"of {runtime}: node 0 runs the tracker (DMLC_TRACKER_URI).",
            )
        )
    return notes


# --- the manifest ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeJob:
    """One replicated Job of a training runtime, as Trainer v2.3.0 reads it.

    Args:
        name: The replicated Job's name: the pods' ``jobset.sigs.k8s.io/replicatedjob-name``
            and the middle of their Job's name (``<trainjob>-<name>-0``).
        ancestor: Its :data:`TRAINER_ANCESTOR_LABEL` (``trainer``, an initializer), or ``""``.
        containers: Its pod's container names.
        pods: Pods per Job the runtime asks for (``parallelism``, default 1); the TrainJob's
            ``numNodes`` replaces it on the trainer Job.
        pod_template: The runtime's pod template of the Job.
    """

    name: str
    ancestor: str
    containers: tuple[str, ...]
    pods: int
    pod_template: Mapping[str, Any]

    @property
    def is_trainer(self) -> bool:
        """Whether the TrainJob's ``trainer`` (image, command, resources) sets this Job."""
        return self.ancestor == TRAINER_ANCESTOR

    @property
    def is_initializer(self) -> bool:
        """Whether it is a dataset or model initializer (no training pod settings apply)."""
        return self.ancestor.endswith("-initializer")


def runtime_jobs(runtime: Mapping[str, Any]) -> tuple[RuntimeJob, ...]:
    """The replicated Jobs of a ``ClusterTrainingRuntime`` or ``TrainingRuntime``, in order.

    Their names are the runtime's own: Trainer's release names them ``node`` and ``launcher``,
    another runtime may say ``worker`` or anything else.

    Example:
        >>> runtime = {"spec": {"template": {"spec": {"replicatedJobs": [
        ...     {"name": "worker", "template": {
        ...         "metadata": {"labels": {TRAINER_ANCESTOR_LABEL: "trainer"}},
        ...         "spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}}}]}}}}
        >>> [(job.name, job.is_trainer, job.containers) for job in runtime_jobs(runtime)]
        [('worker', True, ('node',))]
    """
    template = ((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}
    found: list[RuntimeJob] = []
    for job in template.get("replicatedJobs") or []:
        if not isinstance(job, Mapping) or not isinstance(job.get("name"), str):
            continue
        job_template = job.get("template") or {}
        labels = (job_template.get("metadata") or {}).get("labels") or {}
        job_spec = job_template.get("spec") or {}
        pod = job_spec.get("template") or {}
        containers = (pod.get("spec") or {}).get("containers") or []
        parallelism = job_spec.get("parallelism")
        found.append(
            RuntimeJob(
                name=job["name"],
                ancestor=str(labels.get(TRAINER_ANCESTOR_LABEL) or ""),
                containers=tuple(str(c.get("name")) for c in containers if isinstance(c, Mapping)),
                pods=parallelism if isinstance(parallelism, int) and parallelism > 0 else 1,
                pod_template=pod,
            )
        )
    return tuple(found)


def runtime_pods(runtime: Mapping[str, Any], num_nodes: int) -> dict[str, int]:
    """Pods of each replicated Job (initializers too) of a TrainJob of ``num_nodes`` nodes.

    As Trainer v2.3.0 counts them: the trainer Job runs ``num_nodes`` pods, except under an MPI
    policy with ``runLauncherAsNode``, where that Job is the launcher (one pod) and the Job
    named ``node`` runs the other ``num_nodes - 1``; any other Job its ``parallelism``.

    Example:
        >>> runtime = {"spec": {"template": {"spec": {"replicatedJobs": [
        ...     {"name": "driver", "template": {}},
        ...     {"name": "worker", "template": {"metadata": {"labels": {
        ...         TRAINER_ANCESTOR_LABEL: "trainer"}}}}]}}}}
        >>> runtime_pods(runtime, 3)
        {'driver': 1, 'worker': 3}
    """
    mpi = ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("mpi") or {}
    launcher_is_node = bool(mpi.get("runLauncherAsNode"))
    pods: dict[str, int] = {}
    for job in runtime_jobs(runtime):
        if job.is_trainer:
            pods[job.name] = 1 if launcher_is_node else num_nodes
        elif launcher_is_node and job.name == NODE_JOB:
            pods[job.name] = max(num_nodes - 1, 1)
        else:
            pods[job.name] = job.pods
    return pods


def fit_runtime_patches(manifest: Manifest, runtime: Mapping[str, Any]) -> Manifest:
    """``manifest`` (a rendered TrainJob) with our runtime patch naming ``runtime``'s own Jobs.

    Rendered offline, the patch names Trainer's release names (:data:`NODE_JOB`, MPI's
    :data:`MPI_LAUNCHER_JOB`). Trainer merges a patch into the runtime by replicated Job
    *name*, so against a runtime that names its Jobs otherwise the patch would add a Job of
    its own instead of reaching the runtime's. Here the same pod settings go to every Job of
    the runtime but its initializers, and the training container's (mounts, security
    context) only to Jobs that have a container :data:`TRAINER_CONTAINER`. A manifest without
    our patch, or a runtime without Jobs, comes back unchanged (a copy). When the runtime's
    Jobs are not Trainer's release names (``node``, and ``launcher`` under MPI), their pods
    (:func:`runtime_pods`) are recorded in the :data:`RUNTIME_JOBS_ANNOTATION`.

    Example:
        >>> runtime = {"spec": {"template": {"spec": {"replicatedJobs": [
        ...     {"name": "worker", "template": {"spec": {"template": {"spec": {
        ...         "containers": [{"name": "node"}]}}}}}]}}}}
        >>> patch = {"manager": RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {
        ...     "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
        ...         "template": {"metadata": {"labels": {"team": "a"}}}}}}]}}}}
        >>> fitted = fit_runtime_patches({"spec": {"runtimePatches": [patch]}}, runtime)
        >>> jobs = fitted["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]
        >>> [job["name"] for job in jobs["spec"]["replicatedJobs"]]
        ['worker']
    """
    fitted = copy.deepcopy(dict(manifest))
    targets = [job for job in runtime_jobs(runtime) if not job.is_initializer]
    if not targets:
        return fitted
    if {job.name for job in targets} - {NODE_JOB, MPI_LAUNCHER_JOB}:
        nodes = ((fitted.get("spec") or {}).get("trainer") or {}).get("numNodes")
        pods = runtime_pods(runtime, nodes if isinstance(nodes, int) and nodes > 0 else 1)
        mpi = ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("mpi") or {}
        resourced = {job.name for job in targets if job.is_trainer}
        if mpi.get("runLauncherAsNode"):
            resourced.add(NODE_JOB)
        layout = {
            name: {"pods": count, **({"trainer": True} if name in resourced else {})}
            for name, count in pods.items()
            if any(job.name == name for job in targets)
        }
        metadata = fitted.setdefault("metadata", {})
        annotations = metadata.setdefault("annotations", {})
        annotations[RUNTIME_JOBS_ANNOTATION] = json.dumps(layout, separators=(",", ":"))
    for patch in (fitted.get("spec") or {}).get("runtimePatches") or []:
        if not isinstance(patch, dict) or patch.get("manager") != RUNTIME_PATCH_MANAGER:
            continue
        template = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        ours = template.get("replicatedJobs") if isinstance(template, dict) else None
        if not ours or not isinstance(template, dict):
            continue
        pod_patch = ((ours[0].get("template") or {}).get("spec") or {}).get("template") or {}
        jobs = []
        for job in targets:
            pod = copy.deepcopy(pod_patch)
            if TRAINER_CONTAINER not in job.containers:
                (pod.get("spec") or {}).pop("containers", None)
                if "spec" in pod and not pod["spec"]:
                    del pod["spec"]
            jobs.append({"name": job.name, "template": {"spec": {"template": pod}}})
        template["replicatedJobs"] = jobs
    return fitted


def runtime_issues(spec: TrainingJobSpec, runtime: Mapping[str, Any]) -> list[SpecIssue]:
    """What ``spec`` says of gang scheduling that the runtime it names does not do.

    Offline the runtime is unknown; at submission it is read, and a spec whose ``gang`` says
    otherwise than the runtime's ``podGroupPolicy`` is refused rather than run ungated: a
    ``gang.queue`` is a Volcano queue (Trainer reads it only under ``volcano``; a
    ``coscheduling`` PodGroup has no queue), ``gang.scheduler: volcano`` needs the ``volcano``
    policy, another scheduler the ``coscheduling`` one, and a ``gang`` at all needs a policy.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "x", "image": "i", "replicas": {"worker": 2},
        ...                    "runtime": {"name": "cosched"}, "gang": {"queue": "research"}})
        >>> cosched = {"metadata": {"name": "cosched"},
        ...            "spec": {"podGroupPolicy": {"coscheduling": {}}}}
        >>> [issue.path for issue in runtime_issues(spec, cosched)]
        ['gang.queue']
    """
    gang = spec.gang
    if gang is None or (gang.queue is None and gang.scheduler is None):
        return []
    name = str((runtime.get("metadata") or {}).get("name") or "")
    policy = (runtime.get("spec") or {}).get("podGroupPolicy") or {}
    kinds = sorted(k for k in ("volcano", "coscheduling") if k in policy)
    has = kinds[0] if kinds else None
    issues: list[SpecIssue] = []
    fix = "name a runtime whose podGroupPolicy does what gang says (runtime.name), or change gang"
    if has is None:
        issues.append(
            SpecIssue(
                "gang",
                f"runtime {name} has no podGroupPolicy: its pods would not be gang-scheduled",
                fix,
            )
        )
        return issues
    if gang.queue is not None and has != "volcano":
        issues.append(
            SpecIssue(
                "gang.queue",
                f"runtime {name} gang-schedules with {has}, which has no queue (Trainer reads "
                "the queue only under a volcano podGroupPolicy)",
                f"remove gang.queue, or {fix}",
            )
        )
    if gang.scheduler is not None:
        wanted = "volcano" if gang.scheduler == "volcano" else "coscheduling"
        if wanted != has:
            issues.append(
                SpecIssue(
                    "gang.scheduler",
                    f"gang.scheduler is {gang.scheduler}, but runtime {name} gang-schedules with "
                    f"{has}",
                    fix,
                )
            )
    return issues


def render_trainer(spec: TrainingJobSpec, options: RenderOptions) -> Manifest:
    """The TrainJob for ``spec`` (checked by the caller with :func:`trainer_issues`).

    Raises:
        SpecError: If ``options.job_name`` is not a DNS-1035 label.
    """
    resource = job_resource(Dialect.TRAINER, spec.framework)
    name = _job_name(spec, options)
    parts = _split(spec, options)
    trainer = parts.trainer
    trainer["numNodes"] = _num_nodes(spec)
    procs = _procs_per_node(spec)
    if procs is not None:
        trainer["numProcPerNode"] = procs
    body: Manifest = {"runtimeRef": _runtime_ref(spec), "trainer": _ordered_trainer(trainer)}
    if spec.active_deadline_seconds is not None:
        body["activeDeadlineSeconds"] = spec.active_deadline_seconds
    patch = _runtime_patch(spec, parts)
    if patch is not None:
        body["runtimePatches"] = [patch]
    metadata: Manifest = {"name": name}
    if options.namespace is not None:
        metadata["namespace"] = options.namespace
    labels = {**(spec.labels or {}), **options.labels}
    annotations = {**(spec.annotations or {}), **options.annotations}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": metadata,
        "spec": body,
    }


def _job_name(spec: TrainingJobSpec, options: RenderOptions) -> str:
    if options.job_name is None:
        return spec.name
    name = options.job_name
    limit = max_trainer_job_name(spec)
    if not is_dns1035_label(name) or len(name) > limit:
        raise SpecError(
            [
                SpecIssue(
                    "(options).jobName",
                    f"job name {name!r} is not a DNS-1035 label of at most {limit} characters "
                    "(the pods' host names add the replicated Job's suffix)",
                    "use kubedl_prefect.spec.job_name() or a shorter lower-case name",
                )
            ]
        )
    return name


def _runtime_ref(spec: TrainingJobSpec) -> Manifest:
    if spec.runtime is None:
        return {"name": DEFAULT_RUNTIMES[spec.framework]}
    ref: Manifest = {"name": spec.runtime.name}
    if spec.runtime.kind != RUNTIME_KINDS[0]:
        ref["kind"] = spec.runtime.kind
    return ref


def _procs_per_node(spec: TrainingJobSpec) -> int | None:
    if spec.framework is Framework.MPI:
        return spec.slots_per_worker
    nproc = spec.nproc_per_node
    if nproc is not None and nproc.isdigit():
        return int(nproc)
    return None


def _ordered_trainer(trainer: Mapping[str, Any]) -> Manifest:
    order = ("image", "command", "args", "env", "numNodes", "numProcPerNode", "resourcesPerNode")
    return {key: trainer[key] for key in order if key in trainer}


def _runtime_patch(spec: TrainingJobSpec, parts: _Parts) -> Manifest | None:
    pod: Manifest = {}
    for key in POD_PATCH_FIELDS:
        if key == "containers":
            if parts.container_patch:
                pod["containers"] = [{"name": TRAINER_CONTAINER, **parts.container_patch}]
        elif key in parts.pod_patch:
            pod[key] = parts.pod_patch[key]
    pod_template_patch: Manifest = {}
    if parts.pod_metadata:
        pod_template_patch["metadata"] = parts.pod_metadata
    if pod:
        pod_template_patch["spec"] = pod
    template: Manifest = {}
    if spec.gang is not None and spec.gang.queue is not None:
        template["metadata"] = {"annotations": {VOLCANO_QUEUE_ANNOTATION: spec.gang.queue}}
    if pod_template_patch:
        jobs = [NODE_JOB] if spec.framework is not Framework.MPI else [MPI_LAUNCHER_JOB, NODE_JOB]
        template["spec"] = {
            "replicatedJobs": [
                {"name": job, "template": {"spec": {"template": copy.deepcopy(pod_template_patch)}}}
                for job in jobs
            ]
        }
    if not template:
        return None
    return {"manager": RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": template}}
