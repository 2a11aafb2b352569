"""What both renderers share: the pod template of each role, metadata, and the run policy.

The two operators agree on the replica specs (``{replicas, restartPolicy, template}`` keyed by
replica type) and on the pod template; they differ in where the run policy sits, in a few field
names, and in extras. The dialect modules put the pieces built here in their places.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.checks import CHECKPOINT_VOLUME
from kubedl_prefect.spec.kube_types import EnvValue, Resources, Volume
from kubedl_prefect.spec.model import ResolvedRole, TrainingJobSpec
from kubedl_prefect.spec.naming import (
    DNS1035_MAX,
    is_dns1035_label,
    max_job_name_length,
)
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

Manifest = dict[str, Any]
"""A rendered Kubernetes object, ready to be dumped to YAML or sent to the API server."""


@dataclass(frozen=True)
class RenderOptions:
    """What the caller (the lifecycle, the CLI) adds to a spec when rendering it.

    Attributes:
        job_name: The cluster name of the job; default: the spec's name. The lifecycle passes
            :func:`~kubedl_prefect.spec.naming.job_name` here.
        namespace: ``metadata.namespace``; left out when ``None``.
        labels: Extra labels for the job and its pods (override the spec's on equal keys).
        annotations: Extra annotations for the job and its pods (override the spec's).
        env: Extra environment variables for every training container, applied last (override
            the spec's, including ``KUBEDL_PREFECT_CHECKPOINT_DIR``).
    """

    job_name: str | None = None
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


def resolve_job_name(spec: TrainingJobSpec, options: RenderOptions) -> str:
    """The cluster job name, checked to leave room for the operators' pod suffixes."""
    if options.job_name is None:
        return spec.name
    name = options.job_name
    limit = min(DNS1035_MAX, max_job_name_length(spec.replica_counts()))
    if not is_dns1035_label(name) or len(name) > limit:
        raise SpecError(
            [
                SpecIssue(
                    "(options).jobName",
                    f"job name {name!r} is not a DNS-1035 label of at most {limit} characters "
                    "(pod names add the role suffix)",
                    "use kubedl_prefect.spec.job_name() or a shorter lower-case name",
                )
            ]
        )
    return name


def job_metadata(
    name: str,
    spec: TrainingJobSpec,
    options: RenderOptions,
    extra_annotations: Mapping[str, str] | None = None,
) -> Manifest:
    """``metadata`` of the job object."""
    metadata: Manifest = {"name": name}
    if options.namespace is not None:
        metadata["namespace"] = options.namespace
    labels = {**(spec.labels or {}), **options.labels}
    annotations = {**(spec.annotations or {}), **(extra_annotations or {}), **options.annotations}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def run_policy(spec: TrainingJobSpec, priority_field: str) -> Manifest:
    """The run-policy fields, with the scheduling policy's priority under ``priority_field``."""
    policy: Manifest = {"cleanPodPolicy": spec.clean_pod_policy.value}
    if spec.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.active_deadline_seconds is not None:
        policy["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.backoff_limit is not None:
        policy["backoffLimit"] = spec.backoff_limit
    gang = spec.gang
    if gang is not None:
        scheduling: Manifest = {}
        if gang.min_available is not None:
            scheduling["minAvailable"] = gang.min_available
        if gang.queue is not None:
            scheduling["queue"] = gang.queue
        if gang.priority_class is not None:
            scheduling[priority_field] = gang.priority_class
        if scheduling:
            policy["schedulingPolicy"] = scheduling
    return policy


def main_container_name(spec: TrainingJobSpec, resolved: ResolvedRole, dialect: Dialect) -> str:
    """The name the training container of ``resolved`` gets in ``dialect``."""
    if resolved.container_name is not None:
        return resolved.container_name
    return FRAMEWORKS[spec.framework].container_name(dialect)


def replica_specs(spec: TrainingJobSpec, dialect: Dialect, options: RenderOptions) -> Manifest:
    """``{ReplicaType: {replicas, restartPolicy, template}}`` in the framework's role order."""
    return {
        resolved.role.replica_type: {
            "replicas": resolved.count,
            "restartPolicy": resolved.restart_policy.value,
            "template": pod_template(
                spec, resolved, main_container_name(spec, resolved, dialect), options
            ),
        }
        for resolved in spec.resolved_roles()
    }


def mpi_main_container(spec: TrainingJobSpec, dialect: Dialect) -> str:
    """``spec.mainContainer`` of an MPIJob: the workers' training container.

    The launcher runs the MPI processes in it (``kubectl exec --container``).
    """
    assert spec.framework is Framework.MPI
    for resolved in spec.resolved_roles():
        if resolved.role is Role.WORKER:
            return main_container_name(spec, resolved, dialect)
    return FRAMEWORKS[spec.framework].container_name(dialect)


def address_main_container(
    fragment: dict[str, Any], aliases: frozenset[str], name: str
) -> dict[str, Any]:
    """``fragment`` with every container item named by one of ``aliases`` renamed to ``name``.

    A pod-template fragment may name the training container by any of its names (``xgboost``
    and ``xgboostjob`` for XGBoost jobs): each operator's dialect gets its own.

    Example:
        >>> address_main_container(
        ...     {"spec": {"containers": [{"name": "xgboost", "tty": True}]}},
        ...     frozenset({"xgboost", "xgboostjob"}),
        ...     "xgboostjob",
        ... )
        {'spec': {'containers': [{'name': 'xgboostjob', 'tty': True}]}}
    """
    pod = fragment.get("spec")
    if not isinstance(pod, dict) or not isinstance(pod.get("containers"), list):
        return fragment
    containers: list[Any] = pod["containers"]
    renamed = [
        {**item, "name": name} if isinstance(item, dict) and item.get("name") in aliases else item
        for item in containers
    ]
    return {**fragment, "spec": {**pod, "containers": renamed}}


def pod_template(
    spec: TrainingJobSpec, resolved: ResolvedRole, container_name: str, options: RenderOptions
) -> Manifest:
    """The pod template of one role, with the raw ``podTemplate`` fragments merged last."""
    pod: Manifest = {"containers": [_container(spec, resolved, container_name, options)]}
    if resolved.service_account_name is not None:
        pod["serviceAccountName"] = resolved.service_account_name
    if resolved.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in resolved.image_pull_secrets]
    if spec.gang is not None and spec.gang.scheduler is not None:
        pod["schedulerName"] = spec.gang.scheduler
    if spec.network is not None and spec.network.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if resolved.node_selector:
        pod["nodeSelector"] = dict(resolved.node_selector)
    if resolved.tolerations:
        pod["tolerations"] = [dump_model(t) for t in resolved.tolerations]
    if resolved.affinity is not None:
        affinity = dump_model(resolved.affinity)
        if affinity:
            pod["affinity"] = affinity
    if resolved.priority_class_name is not None:
        pod["priorityClassName"] = resolved.priority_class_name
    volumes = [volume_source(v) for v in spec.volumes or []]
    if spec.checkpoint is not None and spec.checkpoint.pvc is not None:
        volumes.append(
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": spec.checkpoint.pvc}}
        )
    if volumes:
        pod["volumes"] = volumes

    template: Manifest = {}
    labels = {**(spec.labels or {}), **options.labels}
    annotations = {**(spec.annotations or {}), **options.annotations}
    if labels or annotations:
        template["metadata"] = {}
        if labels:
            template["metadata"]["labels"] = labels
        if annotations:
            template["metadata"]["annotations"] = annotations
    template["spec"] = pod
    aliases = main_container_names(spec.framework, resolved.container_name)
    for fragment in resolved.pod_templates:
        template = deep_merge(template, address_main_container(fragment, aliases, container_name))
    metadata = template.get("metadata")
    if isinstance(metadata, dict):  # `null` in a fragment may have removed every label
        for part in ("labels", "annotations"):
            if metadata.get(part) == {}:
                del metadata[part]
        if not metadata:
            del template["metadata"]
    return template


def _container(
    spec: TrainingJobSpec, resolved: ResolvedRole, name: str, options: RenderOptions
) -> Manifest:
    container: Manifest = {"name": name, "image": resolved.image}
    if resolved.image_pull_policy is not None:
        container["imagePullPolicy"] = resolved.image_pull_policy.value
    if resolved.command is not None:
        container["command"] = list(resolved.command)
    if resolved.args is not None:
        container["args"] = list(resolved.args)
    if resolved.working_dir is not None:
        container["workingDir"] = resolved.working_dir
    env: dict[str, Manifest] = {key: env_var(key, value) for key, value in resolved.env.items()}
    if spec.network is not None and spec.network.nccl_socket_ifname is not None:
        env[NCCL_IFNAME_ENV] = {"name": NCCL_IFNAME_ENV, "value": spec.network.nccl_socket_ifname}
    if spec.checkpoint is not None:
        env[CHECKPOINT_ENV] = {"name": CHECKPOINT_ENV, "value": spec.checkpoint.location}
    for key, value in options.env.items():
        env[key] = {"name": key, "value": value}
    if env:
        container["env"] = list(env.values())
    resources = render_resources(resolved.resources)
    if resources:
        container["resources"] = resources
    if resolved.ports:
        container["ports"] = [dump_model(port) for port in resolved.ports]
    mounts = [volume_mount(v) for v in spec.volumes or []]
    if spec.checkpoint is not None and spec.checkpoint.pvc is not None:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path})
    if mounts:
        container["volumeMounts"] = mounts
    return container


def env_var(name: str, value: EnvValue) -> Manifest:
    """One item of a container's ``env`` list."""
    if value.value is not None:
        return {"name": name, "value": value.value}
    source = value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {"name": name, "valueFrom": source}


def render_resources(resources: Resources | None) -> Manifest:
    """A container's ``resources`` (empty when there are none)."""
    if resources is None:
        return {}
    limits: dict[str, str | int] = {}
    requests: dict[str, str | int] = {}
    for name, amount in (("cpu", resources.cpu), ("memory", resources.memory)):
        if amount is not None:
            limits[name] = amount
            requests[name] = amount
    limits.update(resources.limits)
    requests.update(resources.requests)
    if resources.gpus:
        # GPUs go in limits (what the scheduler reads) and, equal, in requests: the operators size
        # the gang's PodGroup (minResources) from the template's requests, before the API server
        # would default them from limits, so without it Volcano would not count the GPUs.
        limits[GPU_RESOURCE] = resources.gpus
        requests[GPU_RESOURCE] = resources.gpus
    rendered: Manifest = {}
    if limits:
        rendered["limits"] = limits
    if requests:
        rendered["requests"] = requests
    return rendered


def volume_source(volume: Volume) -> Manifest:
    """The pod's ``volumes`` item of ``volume``."""
    rendered: Manifest = {"name": volume.name}
    if volume.pvc is not None:
        claim: Manifest = {"claimName": volume.pvc}
        if volume.read_only:
            claim["readOnly"] = True
        rendered["persistentVolumeClaim"] = claim
    elif volume.empty_dir is not None:
        rendered["emptyDir"] = dump_model(volume.empty_dir)
    elif volume.host_path is not None:
        rendered["hostPath"] = dump_model(volume.host_path)
    elif volume.config_map is not None:
        rendered["configMap"] = {"name": volume.config_map}
    elif volume.secret is not None:
        rendered["secret"] = {"secretName": volume.secret}
    return rendered


def volume_mount(volume: Volume) -> Manifest:
    """The training container's ``volumeMounts`` item of ``volume``."""
    mount: Manifest = {"name": volume.name, "mountPath": volume.mount_path}
    if volume.read_only is not None:
        mount["readOnly"] = volume.read_only
    if volume.sub_path is not None:
        mount["subPath"] = volume.sub_path
    return mount


def dump_model(model: Any) -> Any:
    """A spec model as pod-API data (camelCase, unset fields left out)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def deep_merge(base: Any, override: Any) -> Any:
    """Merge ``override`` into ``base`` (neither is modified) and return the result.

    Mappings merge key by key, recursively; a ``None`` value in ``override`` deletes the key.
    Lists whose items are all mappings with a ``name`` (containers, env, volumes...) merge item
    by item on ``name``, new names appended; any other list, and any other value, is replaced.

    Example:
        >>> deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": None, "d": 3}})
        {'a': {'b': 1, 'd': 3}}
    """
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = deep_merge(merged[key], value)
            else:
                merged[key] = _strip_none(value)
        return merged
    if _named_list(base) and _named_list(override):
        items = {item["name"]: item for item in base}
        for item in override:
            name = item["name"]
            items[name] = deep_merge(items[name], item) if name in items else _strip_none(item)
        return list(items.values())
    return _strip_none(override)


def _named_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)
    )


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value
