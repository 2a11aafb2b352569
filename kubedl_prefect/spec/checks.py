"""Cross-field and per-dialect checks of a training-job spec.

Field-level rules (types, formats, ranges) live on the models; the rules here look at several
fields at once (name length against the roles' suffixes, GPUs in requests against ``gpus``,
checkpoint path against the mounts) or depend on the operator (a PyTorch ``Master`` for KubeDL).
Pod settings that break the Baseline Pod Security level are refused here too, unless the spec
says ``podSecurity: privileged`` (:mod:`kubedl_prefect.spec.pod_security`).
Each returns :class:`~kubedl_prefect.errors.SpecIssue` objects naming the field and the fix.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from kubedl_prefect.errors import SpecIssue
from kubedl_prefect.spec.naming import LONGEST_ATTEMPT_SUFFIX, max_spec_name_length
from kubedl_prefect.spec.pod_security import baseline_issues
from kubedl_prefect.spec.quantity import parse_quantity
from kubedl_prefect.spec.types import (
    CHECKPOINT_ENV,
    FRAMEWORKS,
    GPU_RESOURCE,
    NCCL_IFNAME_ENV,
    Dialect,
    Framework,
    Role,
    main_container_names,
)

if TYPE_CHECKING:
    from kubedl_prefect.spec.kube_types import Resources
    from kubedl_prefect.spec.model import ResolvedRole, TrainingJobSpec
    from kubedl_prefect.spec.renderers.common import RenderOptions

CHECKPOINT_VOLUME = "kubedl-prefect-checkpoint"
"""Name of the volume that mounts ``checkpoint.pvc``."""


def spec_issues(spec: TrainingJobSpec) -> list[SpecIssue]:
    """Every dialect-independent cross-field problem of ``spec`` (empty when it is valid)."""
    issues = [*_role_issues(spec), *_name_issues(spec), *_container_name_issues(spec)]
    for resolved in spec.resolved_roles():
        issues += _container_issues(spec, resolved)
        issues += _pod_template_issues(spec, resolved)
    issues += [*_elastic_issues(spec), *_gang_issues(spec), *_framework_field_issues(spec)]
    issues += [*_env_issues(spec), *_volume_issues(spec), *baseline_issues(spec)]
    issues += _kueue_label_issues(spec)
    return list(dict.fromkeys(issues))  # top-level settings shared by roles report once


def dialect_issues(
    spec: TrainingJobSpec, dialect: Dialect, options: RenderOptions | None = None
) -> list[SpecIssue]:
    """Problems that make ``spec`` unfit for the operator of ``dialect``.

    ``options`` (the caller's job name) matters to the ``trainer`` dialect only, whose pods'
    host names are longer than the job's name by the replicated Job's suffix.
    """
    issues: list[SpecIssue] = []
    if dialect is Dialect.TRAINER:
        from kubedl_prefect.spec.renderers.trainer import trainer_issues

        return trainer_issues(spec, options)
    if spec.runtime is not None:
        issues.append(
            SpecIssue(
                "runtime",
                f"runtime names a Kubeflow Trainer v2 runtime; the {dialect.value} operator has "
                "none",
                "remove runtime, or render with --dialect trainer",
            )
        )
    if dialect is Dialect.KUBEDL:
        if spec.framework is Framework.PYTORCH and Role.MASTER not in spec.replicas:
            issues.append(
                SpecIssue(
                    "replicas.master",
                    "KubeDL PyTorchJobs need a master replica: the workers' MASTER_ADDR points "
                    "at it",
                    "add `master: {count: 1}` under replicas, or render with --dialect kubeflow",
                )
            )
        if spec.elastic is not None:
            issues.append(
                SpecIssue(
                    "elastic",
                    "KubeDL v0.5 has no elastic min/max replicas (its elastic mode is driven by "
                    "an AIMaster)",
                    "remove elastic, or render with --dialect kubeflow",
                )
            )
        if spec.nproc_per_node is not None:
            issues.append(
                SpecIssue(
                    "nprocPerNode",
                    "KubeDL PyTorchJobs have no nprocPerNode",
                    "remove nprocPerNode (start one process per GPU in your command), or render "
                    "with --dialect kubeflow",
                )
            )
        if spec.kueue is not None:
            issues.append(
                SpecIssue(
                    "kueue",
                    "Kueue does not manage KubeDL's kinds (training.kubedl.io): the job would "
                    f"start at once, outside LocalQueue {spec.kueue.queue} and its quota",
                    "render with --dialect kubeflow (Kueue manages kubeflow.org/v1 jobs and "
                    "Trainer's TrainJob), or remove kueue",
                )
            )
    if dialect is Dialect.KUBEFLOW and spec.framework is Framework.MPI and spec.kueue is not None:
        # Kueue's kubeflow.org/mpijob integration (v0.19.2) is mpi-operator's v2beta1 MPIJob:
        # it makes no Workload for the training operator's v1 MPIJob, which stays suspended.
        issues.append(
            SpecIssue(
                "kueue",
                "Kueue does not manage the training operator's kubeflow.org/v1 MPIJob (its "
                "kubeflow.org/mpijob integration is mpi-operator's v2beta1): the job would stay "
                f"suspended in LocalQueue {spec.kueue.queue}, never admitted",
                "render with --dialect trainer (a TrainJob, which Kueue manages), or remove kueue",
            )
        )
    return issues


def _role_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    info = FRAMEWORKS[spec.framework]
    allowed = ", ".join(role.value for role in info.roles)
    for role, role_spec in spec.replicas.items():
        path = f"replicas.{role.value}"
        if role not in info.roles:
            yield SpecIssue(
                path,
                f"{role.value!r} is not a role of {spec.framework.value} jobs",
                f"use one of: {allowed}",
            )
        elif role in info.single_replica_roles and role_spec.count != 1:
            yield SpecIssue(
                f"{path}.count",
                f"the {role.value} role must have exactly 1 replica, not {role_spec.count}",
                "set count: 1 (add replicas to the worker role instead)",
            )
    roles = set(spec.replicas)
    if spec.framework is Framework.MPI:
        for needed in (Role.LAUNCHER, Role.WORKER):
            if needed not in roles:
                yield SpecIssue(
                    f"replicas.{needed.value}",
                    f"MPI jobs need a {needed.value} role",
                    f"add `{needed.value}: {{count: 1}}` under replicas",
                )
    elif spec.framework is Framework.XGBOOST:
        if Role.MASTER not in roles:
            yield SpecIssue(
                "replicas.master",
                "XGBoost jobs need a master role (the rabit tracker runs there)",
                "add `master: {count: 1}` under replicas",
            )
    elif spec.framework is Framework.TENSORFLOW:
        if {Role.CHIEF, Role.MASTER} <= roles:
            yield SpecIssue(
                "replicas",
                "a TensorFlow job may have a chief or a master, not both",
                "keep one of chief and master",
            )
        if not roles & {Role.CHIEF, Role.MASTER, Role.WORKER}:
            yield SpecIssue(
                "replicas",
                "a TensorFlow job needs a chief, master or worker role to train",
                "add `worker: {count: 1}` under replicas",
            )
    elif spec.framework is Framework.PYTORCH and not roles & {Role.MASTER, Role.WORKER}:
        yield SpecIssue("replicas", "a PyTorch job needs a master or worker", "add master: 1")


def _name_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    limit = max_spec_name_length(spec.replica_counts())
    if len(spec.name) > limit:
        yield SpecIssue(
            "name",
            f"the name is {len(spec.name)} characters; at most {limit} are allowed for this spec "
            f"(pod names add the attempt suffix '{LONGEST_ATTEMPT_SUFFIX}' and the longest role "
            "suffix, and must fit 63 characters)",
            f"shorten the name to {limit} characters or fewer",
        )


def _container_issues(spec: TrainingJobSpec, resolved: ResolvedRole) -> Iterator[SpecIssue]:
    if resolved.role not in FRAMEWORKS[spec.framework].roles:
        return
    if resolved.image is None:
        yield SpecIssue(
            f"{resolved.path}.image",
            f"no image for the {resolved.role.value} role",
            "set `image` at the top level (for every role) or under this role",
        )
    if resolved.resources is not None:
        yield from _resource_issues(resolved)
    if spec.network is not None and spec.network.host_network:
        own = spec.replicas[resolved.role].ports is not None
        for index, port in enumerate(resolved.ports or []):
            if port.host_port is not None and port.host_port != port.container_port:
                yield SpecIssue(
                    f"{resolved.path + '.' if own else ''}ports[{index}].hostPort",
                    f"on the host network a port is the host's: hostPort {port.host_port} must "
                    f"equal containerPort {port.container_port}",
                    "remove hostPort, or make it equal to containerPort",
                )


def _container_name_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    if spec.framework is Framework.MPI:
        return
    sources = [("containerName", spec.container_name)] + [
        (f"replicas.{role.value}.containerName", role_spec.container_name)
        for role, role_spec in spec.replicas.items()
    ]
    names = " and ".join(sorted(main_container_names(spec.framework)))
    for path, name in sources:
        if name is not None:
            yield SpecIssue(
                path,
                f"containerName applies to MPI jobs only: the {spec.framework.value} operators "
                f"find the training container by its name ({names})",
                "remove containerName",
            )


def _pod_template_issues(spec: TrainingJobSpec, resolved: ResolvedRole) -> Iterator[SpecIssue]:
    """Containers the pod-template fragments add must be whole; the main one keeps its image."""
    if resolved.role not in FRAMEWORKS[spec.framework].roles:
        return
    aliases = main_container_names(spec.framework, resolved.container_name)
    role_spec = spec.replicas[resolved.role]
    fragments = [
        (path, fragment)
        for path, fragment in (
            ("podTemplate", spec.pod_template),
            (f"{resolved.path}.podTemplate", role_spec.pod_template),
        )
        if fragment
    ]
    spelled = " or ".join(sorted(aliases))
    for field in ("containers", "initContainers"):
        first: dict[str, str] = {}  # container name -> path of the item that adds it
        images: dict[str, object] = {}
        for path, fragment in fragments:
            items = (fragment.get("spec") or {}).get(field) or []
            main_items = [i for i, item in enumerate(items) if item["name"] in aliases]
            if field == "containers" and len(main_items) > 1:
                yield SpecIssue(
                    f"{path}.spec.containers",
                    "two items address the training container ("
                    + ", ".join(repr(items[i]["name"]) for i in main_items)
                    + ")",
                    "merge them into one item",
                )
            for index, item in enumerate(items):
                name = item["name"]
                if field == "containers" and name in aliases:
                    if "image" in item and not (isinstance(item["image"], str) and item["image"]):
                        yield SpecIssue(
                            f"{path}.spec.containers[{index}].image",
                            "the pod template removes or blanks the training container's image",
                            "remove image from this item (set image in the spec instead)",
                        )
                    continue
                first.setdefault(name, f"{path}.spec.{field}[{index}]")
                if "image" in item:
                    images[name] = item["image"]
        for name, where in first.items():
            image = images.get(name)
            if not (isinstance(image, str) and image):
                main = (
                    f"; the training container of a {spec.framework.value} job is named "
                    f"{spelled} in the pod template"
                    if field == "containers"
                    else ""
                )
                yield SpecIssue(
                    f"{where}.image",
                    f"{field[:-1] if field == 'containers' else 'init container'} {name!r} has no "
                    f"image: it is a container of its own, not the training container{main}",
                    f"give {name!r} an image"
                    + (f", or name it {spelled} to change the training container" if main else ""),
                )


def _resource_issues(resolved: ResolvedRole) -> Iterator[SpecIssue]:
    resources = resolved.resources
    assert resources is not None
    path = resolved.resources_path
    if GPU_RESOURCE in resources.limits:
        yield SpecIssue(
            f"{path}.limits",
            f"{GPU_RESOURCE} is set in limits directly",
            f"use `gpus: N` instead (it renders the {GPU_RESOURCE} limit)",
        )
    if GPU_RESOURCE in resources.requests:
        requested = parse_quantity(resources.requests[GPU_RESOURCE])
        if resources.gpus == 0:
            yield SpecIssue(
                f"{path}.requests",
                f"GPUs are requested only in requests ({GPU_RESOURCE}: "
                f"{resources.requests[GPU_RESOURCE]}); the scheduler reads GPUs from limits and "
                "the API server rejects a request without an equal limit",
                f"replace it with `gpus: {resources.requests[GPU_RESOURCE]}` under resources",
            )
        elif requested != resources.gpus:
            yield SpecIssue(
                f"{path}.requests",
                f"requests {GPU_RESOURCE} ({resources.requests[GPU_RESOURCE]}) differs from "
                f"gpus ({resources.gpus}); GPU requests must equal limits",
                f"remove {GPU_RESOURCE} from requests (gpus is enough), or make it equal",
            )
    for name, shorthand in (("cpu", resources.cpu), ("memory", resources.memory)):
        if shorthand is None:
            continue
        for part, values in (("requests", resources.requests), ("limits", resources.limits)):
            if name in values:
                yield SpecIssue(
                    f"{path}.{part}",
                    f"{name} is given both as `{name}` and in {part}",
                    f"keep one: `{name}` sets request and limit, {part} sets only the {part[:-1]}",
                )
    for name in sorted(set(resources.requests) | set(resources.limits)):
        if not _overcommittable(name):
            yield from _non_overcommittable_issues(path, name, resources)
    for name in sorted(set(resources.requests) & set(resources.limits)):
        if parse_quantity(resources.requests[name]) > parse_quantity(resources.limits[name]):
            yield SpecIssue(
                f"{path}.requests",
                f"request of {name} ({resources.requests[name]}) exceeds its limit "
                f"({resources.limits[name]})",
                "lower the request or raise the limit",
            )


_NATIVE: Final = frozenset({"cpu", "memory", "ephemeral-storage", "storage"})


def _overcommittable(name: str) -> bool:
    """Native resources other than hugepages; extended ones (``vendor.com/x``) are not."""
    if name.startswith("hugepages-"):
        return False
    return name in _NATIVE or ("/" not in name and not name.startswith("requests."))


def _non_overcommittable_issues(path: str, name: str, resources: Resources) -> Iterator[SpecIssue]:
    if name == GPU_RESOURCE:
        return  # handled above, with the gpus field
    request, limit = resources.requests.get(name), resources.limits.get(name)
    if limit is None:
        yield SpecIssue(
            f"{path}.requests",
            f"{name} is requested without a limit; it cannot be overcommitted, so Kubernetes "
            "needs the limit",
            f"move {name} to limits (its request defaults to the limit)",
        )
    elif request is not None and parse_quantity(request) != parse_quantity(limit):
        yield SpecIssue(
            f"{path}.requests",
            f"{name} request ({request}) differs from its limit ({limit}); it cannot be "
            "overcommitted",
            f"make them equal, or give {name} in limits only",
        )
    if not name.startswith("hugepages-"):
        for part, values in (("requests", resources.requests), ("limits", resources.limits)):
            if name in values and parse_quantity(values[name]) % 1 != 0:
                yield SpecIssue(
                    f"{path}.{part}",
                    f"{name} is {values[name]}; extended resources come in whole units",
                    "use a whole number",
                )


def _elastic_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    elastic = spec.elastic
    if elastic is None:
        return
    if spec.framework is not Framework.PYTORCH:
        yield SpecIssue(
            "elastic",
            f"elastic training is for PyTorch jobs, not {spec.framework.value}",
            "remove elastic",
        )
        return
    if elastic.min_replicas > elastic.max_replicas:
        yield SpecIssue(
            "elastic.minReplicas",
            f"minReplicas ({elastic.min_replicas}) is greater than maxReplicas "
            f"({elastic.max_replicas})",
            "make minReplicas <= maxReplicas",
        )
    worker = spec.replicas.get(Role.WORKER)
    if worker is None:
        yield SpecIssue(
            "replicas.worker",
            "elastic training scales the worker role, and there is none",
            "add `worker: {count: N}` with minReplicas <= N <= maxReplicas",
        )
    elif not elastic.min_replicas <= worker.count <= elastic.max_replicas:
        yield SpecIssue(
            "replicas.worker.count",
            f"the initial worker count {worker.count} is outside elastic "
            f"[{elastic.min_replicas}, {elastic.max_replicas}]",
            "choose a worker count between elastic.minReplicas and elastic.maxReplicas",
        )


def _gang_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    if spec.gang is None or spec.gang.min_available is None:
        return
    total = sum(count for _, count in spec.replica_counts())
    if spec.gang.min_available > total:
        yield SpecIssue(
            "gang.minAvailable",
            f"minAvailable ({spec.gang.min_available}) exceeds the job's {total} replicas, so the "
            "gang could never be admitted",
            f"set minAvailable to {total} or less (or leave it out: all replicas)",
        )


def _kueue_label_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    # Kueue's labels belong on the job only (spec.kueue puts them there): `labels` reach the
    # pods too, where Kueue's pod integration would take each pod for a job of its own.
    fields = {
        "kueue.x-k8s.io/queue-name": "queue",
        "kueue.x-k8s.io/priority-class": "priorityClass",
    }
    labels = spec.labels or {}
    for key in sorted(set(labels) & set(fields)):
        yield SpecIssue(
            f"labels.{key}",
            f"{key} is Kueue's label: set in labels it reaches the pods too, and the job is not "
            "created suspended",
            f"remove it from labels and set kueue: {{{fields[key]}: {labels[key]}}}",
        )


def _framework_field_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    only = (
        ("slotsPerWorker", spec.slots_per_worker, Framework.MPI),
        ("successPolicy", spec.success_policy, Framework.TENSORFLOW),
        ("nprocPerNode", spec.nproc_per_node, Framework.PYTORCH),
    )
    for field, value, framework in only:
        if value is not None and spec.framework is not framework:
            yield SpecIssue(
                field,
                f"{field} applies to {framework.value} jobs only, this is a "
                f"{spec.framework.value} job",
                f"remove {field}",
            )
    if spec.nproc_per_node is not None and not (
        spec.nproc_per_node in {"auto", "cpu", "gpu"}
        or (spec.nproc_per_node.isdigit() and int(spec.nproc_per_node) > 0)
    ):
        yield SpecIssue(
            "nprocPerNode",
            f"{spec.nproc_per_node!r} is not a process count",
            "use auto, cpu, gpu or a positive number (as a string)",
        )


def _env_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    sources = [("env", spec.env or {})] + [
        (f"replicas.{role.value}.env", role_spec.env or {})
        for role, role_spec in spec.replicas.items()
    ]
    ifname = spec.network.nccl_socket_ifname if spec.network else None
    for path, env in sources:
        if CHECKPOINT_ENV in env:
            yield SpecIssue(
                f"{path}.{CHECKPOINT_ENV}",
                f"{CHECKPOINT_ENV} is set by kubedl-prefect from checkpoint.location",
                "remove it from env and set checkpoint.location",
            )
        if ifname is not None and NCCL_IFNAME_ENV in env:
            yield SpecIssue(
                f"{path}.{NCCL_IFNAME_ENV}",
                f"{NCCL_IFNAME_ENV} is given both in env and as network.ncclSocketIfname",
                "keep network.ncclSocketIfname and remove it from env",
            )


def _volume_issues(spec: TrainingJobSpec) -> Iterator[SpecIssue]:
    names: dict[str, int] = {}
    mounts: dict[str, str] = {}
    for index, volume in enumerate(spec.volumes or []):
        path = f"volumes[{index}]"
        if volume.name in names:
            yield SpecIssue(
                f"{path}.name",
                f"volume name {volume.name!r} is already used by volumes[{names[volume.name]}]",
                "give each volume a unique name",
            )
        names.setdefault(volume.name, index)
        if volume.name == CHECKPOINT_VOLUME and spec.checkpoint and spec.checkpoint.pvc:
            yield SpecIssue(
                f"{path}.name",
                f"volume name {CHECKPOINT_VOLUME!r} is used for checkpoint.pvc",
                "choose another volume name",
            )
        mount = posixpath.normpath(volume.mount_path)
        if mount in mounts:
            yield SpecIssue(
                f"{path}.mountPath",
                f"mount path {volume.mount_path!r} is already used by {mounts[mount]}",
                "mount each volume at its own path",
            )
        mounts.setdefault(mount, path)
    checkpoint = spec.checkpoint
    if checkpoint is None:
        return
    if checkpoint.pvc is not None:
        mount = posixpath.normpath(checkpoint.mount_path)
        if mount in mounts:
            yield SpecIssue(
                "checkpoint.mountPath",
                f"mount path {checkpoint.mount_path!r} is already used by {mounts[mount]}",
                "choose another checkpoint.mountPath",
            )
        mounts.setdefault(mount, "checkpoint")
    location = checkpoint.location
    if "://" in location:
        if checkpoint.pvc is not None:
            yield SpecIssue(
                "checkpoint.pvc",
                f"checkpoint.location {location!r} is a URI, so the PVC would go unused",
                "remove pvc, or make location a path under checkpoint.mountPath",
            )
        return
    if not location.startswith("/"):
        yield SpecIssue(
            "checkpoint.location",
            f"{location!r} is neither an absolute path nor a URI",
            "use an absolute path on a mounted volume (e.g. /checkpoints/run) or a URI such as "
            "s3://bucket/run",
        )
        return
    target = posixpath.normpath(location)
    if not any(target == m or target.startswith(m.rstrip("/") + "/") for m in mounts):
        yield SpecIssue(
            "checkpoint.location",
            f"{location!r} is not on a mounted volume; the container's own filesystem is lost "
            "when a pod is recreated, and the checkpoints with it",
            "set checkpoint.pvc (mounted at checkpoint.mountPath) or put the location under one "
            "of volumes[].mountPath",
        )
