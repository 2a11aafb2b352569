"""What a manifest means to its operator: the operators' defaults, and a normal form to compare.

Two manifests that differ only in what the API server and the operator fill in or do not care
about run the same job. :func:`operator_view` turns a training-job manifest into the object the
operator acts on, so that such manifests compare equal:

- the operator's defaults are filled in where a field is unset: replica count, restart policy,
  clean-pod policy, KubeDL's XGBoost TTL, TensorFlow's success policy, Kubeflow's
  ``nprocPerNode`` and elastic bounds, each operator's default port on its container (see
  :data:`OPERATOR_DEFAULTS`, read from the operators' Go code);
- where the run policy sits does not matter (KubeDL inlines it; Kubeflow's legacy MPI
  ``spec.cleanPodPolicy``), nor the case of replica types (the operators camel-case them);
- KubeDL's ``kubedl.io/network-mode: host`` annotation implies the host-network pod fields
  KubeDL sets itself;
- pod defaults of the API server: a request defaults to its limit, ports to TCP, the image pull
  policy to ``Always`` for ``:latest`` (else ``IfNotPresent``), the termination message policy
  to ``File`` (KubeDL: ``FallbackToLogsOnError``);
- quantities compare by value (``1``, ``"1"`` and ``"1000m"`` CPUs are equal), and lists of named
  items (containers, env, volumes, mounts, ports) by name, not order; empty lists and mappings
  are the same as none;
- what the operators overwrite (the pod template's ``restartPolicy``) and what the server adds
  to an object it stores (``status``, ``uid``, ``managedFields``...) is left out.

:func:`differences` lists the paths where two views differ.

Example:
    >>> one = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "a"},
    ...        "spec": {"tfReplicaSpecs": {"worker": {"template": {"spec": {"containers": [
    ...            {"name": "tensorflow", "image": "tf:2", "resources": {"limits": {"cpu": 1}}}
    ...        ]}}}}}}
    >>> two = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "a"},
    ...        "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "tfReplicaSpecs": {"Worker": {
    ...            "replicas": 1, "restartPolicy": "Never", "template": {"spec": {"containers": [
    ...            {"name": "tensorflow", "image": "tf:2", "resources": {
    ...                "limits": {"cpu": "1000m"}, "requests": {"cpu": "1"}}}]}}}}}}
    >>> differences(operator_view(one), operator_view(two))
    []
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final

from kubedl_prefect.spec.quantity import is_quantity, parse_quantity
from kubedl_prefect.spec.types import (
    API_GROUPS,
    FRAMEWORKS,
    TRAINJOB_KIND,
    CleanPodPolicy,
    Dialect,
    Framework,
    RestartPolicy,
    Role,
)

NETWORK_MODE_ANNOTATION: Final = "kubedl.io/network-mode"
"""KubeDL's job annotation that switches its replicas to host networking."""


@dataclass(frozen=True)
class OperatorDefaults:
    """What one operator fills in for one kind, read from its Go code.

    Attributes:
        restart_policies: The restart policy of each role when the manifest gives none;
            ``None`` when the operator sets none (the pods then get Kubernetes' ``Always``).
        clean_pod_policy: The clean-pod policy when the manifest gives none.
        ttl_seconds_after_finished: The TTL when the manifest gives none, if the operator sets
            one.
        port: Name and number of the port the operator adds to its container when no port of
            that name exists, if it adds one.
        port_roles: The roles whose pods get that port (``None``: all).
        port_by_name_only: Whether the port goes only to a container of the operator's name
            (else to the first container when none has the name).
        worker_replicas: The replica count of a ``Worker`` without one.
    """

    restart_policies: Mapping[Role, RestartPolicy | None]
    clean_pod_policy: CleanPodPolicy
    ttl_seconds_after_finished: int | None = None
    port: tuple[str, int] | None = None
    port_roles: frozenset[Role] | None = None
    port_by_name_only: bool = False
    worker_replicas: int = 1


def _all(framework: Framework, policy: RestartPolicy | None) -> Mapping[Role, RestartPolicy | None]:
    return MappingProxyType(dict.fromkeys(FRAMEWORKS[framework].roles, policy))


_NEVER, _ON_FAILURE, _EXIT_CODE = (
    RestartPolicy.NEVER,
    RestartPolicy.ON_FAILURE,
    RestartPolicy.EXIT_CODE,
)

OPERATOR_DEFAULTS: Final = MappingProxyType(
    {
        # KubeDL v0.5.0, apis/training/v1alpha1/*_defaults.go and *_constants.go.
        (Dialect.KUBEDL, Framework.PYTORCH): OperatorDefaults(
            MappingProxyType({Role.MASTER: _EXIT_CODE, Role.WORKER: _ON_FAILURE}),
            CleanPodPolicy.NONE,
            port=("pytorchjob-port", 23456),
            port_roles=frozenset({Role.MASTER}),
            port_by_name_only=True,
        ),
        (Dialect.KUBEDL, Framework.TENSORFLOW): OperatorDefaults(
            _all(Framework.TENSORFLOW, _EXIT_CODE),
            CleanPodPolicy.RUNNING,
            port=("tfjob-port", 2222),
        ),
        (Dialect.KUBEDL, Framework.MPI): OperatorDefaults(
            _all(Framework.MPI, _NEVER), CleanPodPolicy.RUNNING, port=("mpi-port", 2222)
        ),
        (Dialect.KUBEDL, Framework.XGBOOST): OperatorDefaults(
            _all(Framework.XGBOOST, None),
            CleanPodPolicy.NONE,
            ttl_seconds_after_finished=100,
            port=("xgboostjob-port", 9999),
        ),
        # Kubeflow training operator v1.9.4, pkg/apis/kubeflow.org/v1/*_defaults.go, *_types.go.
        (Dialect.KUBEFLOW, Framework.PYTORCH): OperatorDefaults(
            _all(Framework.PYTORCH, _ON_FAILURE),
            CleanPodPolicy.NONE,
            port=("pytorchjob-port", 23456),
        ),
        (Dialect.KUBEFLOW, Framework.TENSORFLOW): OperatorDefaults(
            _all(Framework.TENSORFLOW, _NEVER), CleanPodPolicy.NONE, port=("tfjob-port", 2222)
        ),
        (Dialect.KUBEFLOW, Framework.MPI): OperatorDefaults(
            _all(Framework.MPI, _NEVER), CleanPodPolicy.NONE, worker_replicas=0
        ),
        (Dialect.KUBEFLOW, Framework.XGBOOST): OperatorDefaults(
            _all(Framework.XGBOOST, _NEVER), CleanPodPolicy.NONE, port=("xgboostjob-port", 9999)
        ),
    }
)
"""Each operator's defaults per kind; where ours differ, the spec renders its own explicitly."""


def operator_defaults(dialect: Dialect, framework: Framework) -> OperatorDefaults:
    """The defaults of ``dialect``'s operator for ``framework``'s kind.

    Example:
        >>> operator_defaults(Dialect.KUBEFLOW, Framework.MPI).restart_policies[Role.LAUNCHER]
        <RestartPolicy.NEVER: 'Never'>
    """
    return OPERATOR_DEFAULTS[dialect, framework]


def dialect_of(api_version: str) -> Dialect | None:
    """The dialect whose API group ``api_version`` names (any version), if any."""
    group = api_version.rpartition("/")[0]
    for dialect, (known, _) in API_GROUPS.items():
        if group == known:
            return dialect
    return None


def framework_of(kind: str) -> Framework | None:
    """The framework whose kind is ``kind``, if any."""
    for framework, info in FRAMEWORKS.items():
        if info.kind == kind:
            return framework
    return None


def replica_type_role(replica_type: str, framework: Framework) -> Role | None:
    """The role of a replica type, matched without case as the operators do (``worker``)."""
    for role in FRAMEWORKS[framework].roles:
        if role.replica_type.lower() == replica_type.lower():
            return role
    return None


# --- the view --------------------------------------------------------------------------------

_RUN_POLICY_FIELDS: Final = (
    "cleanPodPolicy",
    "ttlSecondsAfterFinished",
    "activeDeadlineSeconds",
    "backoffLimit",
    "schedulingPolicy",
)
_SERVER_METADATA: Final = frozenset(
    {
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
        "selfLink",
    }
)
KUBEFLOW_MANAGER: Final = "kubeflow.org/training-operator"
"""The default (and Kubeflow's own) value of ``runPolicy.managedBy``."""
LAST_APPLIED_ANNOTATION: Final = "kubectl.kubernetes.io/last-applied-configuration"
"""The annotation ``kubectl apply`` keeps a copy of the object in."""


def operator_view(manifest: Mapping[str, Any], dialect: Dialect | None = None) -> dict[str, Any]:
    """``manifest`` as its operator acts on it (see the module docstring); the input is kept.

    Args:
        manifest: A KubeDL or Kubeflow PyTorchJob, TFJob, MPIJob or XGBoostJob.
        dialect: Its dialect; default: the one its ``apiVersion`` names.

    Returns:
        A plain structure to compare with :func:`differences`. A manifest of another kind is
        returned normalized only generically (quantities, named lists).
    """
    data: dict[str, Any] = copy.deepcopy(dict(manifest))
    dialect = dialect or dialect_of(str(data.get("apiVersion", "")))
    if dialect is Dialect.TRAINER and data.get("kind") == TRAINJOB_KIND:
        return trainjob_view(data)
    framework = framework_of(str(data.get("kind", "")))
    if dialect is None or framework is None or not isinstance(data.get("spec"), dict):
        generic: dict[str, Any] = normal_form(data)
        return generic
    defaults = operator_defaults(dialect, framework)
    info = FRAMEWORKS[framework]
    body: dict[str, Any] = data["spec"]
    metadata = {k: v for k, v in (data.get("metadata") or {}).items() if k not in _SERVER_METADATA}
    annotations = dict(metadata.get("annotations") or {})
    annotations.pop(LAST_APPLIED_ANNOTATION, None)
    metadata["annotations"] = annotations
    host_network = dialect is Dialect.KUBEDL and annotations.get(NETWORK_MODE_ANNOTATION) == "host"

    policy = _run_policy(body, dialect, framework)
    if policy.get("suspend") is False:
        del policy["suspend"]
    if policy.get("managedBy") == KUBEFLOW_MANAGER:
        del policy["managedBy"]
    if policy.get("cleanPodPolicy") is None:
        policy["cleanPodPolicy"] = defaults.clean_pod_policy.value
    if policy.get("ttlSecondsAfterFinished") is None and defaults.ttl_seconds_after_finished:
        policy["ttlSecondsAfterFinished"] = defaults.ttl_seconds_after_finished

    raw_replicas = body.pop(info.replica_specs_field, None) or {}
    replicas: dict[str, Any] = {}
    first_worker_container = None
    for key, replica in raw_replicas.items():
        if replica_type_role(str(key), framework) is Role.WORKER:
            first_worker_container = _first_container_name(replica)
    for key, replica in raw_replicas.items():
        role = replica_type_role(str(key), framework)
        if role is None or not isinstance(replica, dict):
            replicas[str(key)] = normal_form(replica)
            continue
        replicas[role.replica_type] = _replica_view(
            replica, role, dialect, framework, defaults, host_network
        )
    extras = {k: v for k, v in body.items() if k != "runPolicy" and k not in _RUN_POLICY_FIELDS}
    if framework is Framework.TENSORFLOW:
        extras.setdefault("successPolicy", "")
    if framework is Framework.MPI:
        extras.pop("cleanPodPolicy", None)
        if "mainContainer" not in extras:
            # kubectl exec without --container picks the pod's first container.
            extras["mainContainer"] = first_worker_container
    if dialect is Dialect.KUBEFLOW and framework is Framework.PYTORCH:
        elastic = extras.get("elasticPolicy")
        if isinstance(elastic, dict):
            workers = (replicas.get("Worker") or {}).get("replicas")
            low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
            elastic["minReplicas"] = (
                low if low is not None else high if high is not None else workers
            )
            elastic["maxReplicas"] = high if high is not None else elastic["minReplicas"]
        if extras.get("nprocPerNode") is None and not (
            isinstance(elastic, dict) and elastic.get("nProcPerNode") is not None
        ):
            extras["nprocPerNode"] = "auto"
    view: dict[str, Any] = normal_form(
        {
            "apiVersion": data.get("apiVersion"),
            "kind": data.get("kind"),
            "metadata": metadata,
            "runPolicy": policy,
            "extras": extras,
            "replicas": replicas,
        }
    )
    return view


def _run_policy(body: dict[str, Any], dialect: Dialect, framework: Framework) -> dict[str, Any]:
    nested = body.get("runPolicy")
    policy: dict[str, Any] = dict(nested) if isinstance(nested, dict) else {}
    inline: dict[str, Any] = {k: body[k] for k in _RUN_POLICY_FIELDS if k in body}
    if dialect is Dialect.KUBEDL and framework is not Framework.MPI:
        return inline  # KubeDL reads the inlined run policy (PyTorch, TF, XGBoost)
    legacy = inline.get("cleanPodPolicy")
    # KubeDL lets the legacy inline field win; Kubeflow uses it when runPolicy has none.
    wins = dialect is Dialect.KUBEDL or policy.get("cleanPodPolicy") is None
    if framework is Framework.MPI and legacy is not None and wins:
        policy["cleanPodPolicy"] = legacy
    return policy


def _replica_view(
    replica: dict[str, Any],
    role: Role,
    dialect: Dialect,
    framework: Framework,
    defaults: OperatorDefaults,
    host_network: bool,
) -> dict[str, Any]:
    view = dict(replica)
    if view.get("replicas") is None:
        view["replicas"] = defaults.worker_replicas if role is Role.WORKER else 1
    if not view.get("restartPolicy"):
        policy = defaults.restart_policies.get(role)
        view["restartPolicy"] = policy.value if policy is not None else ""
    template = view.get("template")
    if isinstance(template, dict):
        view["template"] = pod_template_view(
            template, dialect=dialect, framework=framework, role=role, host_network=host_network
        )
    return view


def _first_container_name(replica: Any) -> Any:
    try:
        return replica["template"]["spec"]["containers"][0]["name"]
    except (KeyError, IndexError, TypeError):
        return None


def pod_template_view(
    template: Mapping[str, Any],
    *,
    dialect: Dialect,
    framework: Framework,
    role: Role,
    host_network: bool = False,
) -> dict[str, Any]:
    """A replica's pod template as the operator and the API server make its pods."""
    view = {k: copy.deepcopy(v) for k, v in template.items() if k in ("metadata", "spec")}
    if isinstance(view.get("metadata"), dict):  # the operators name the pods
        view["metadata"] = {
            k: v for k, v in view["metadata"].items() if k in ("labels", "annotations")
        }
    pod = view.get("spec")
    if not isinstance(pod, dict):
        return view
    pod.pop("restartPolicy", None)  # the operators set it from the replica's restart policy
    if host_network:
        pod.setdefault("hostNetwork", True)
        pod.setdefault("dnsPolicy", "ClusterFirstWithHostNet")
    containers = pod.get("containers")
    if isinstance(containers, list) and containers and all(isinstance(c, dict) for c in containers):
        _add_default_port(containers, dialect, framework, role)
        for container in containers:
            _container_defaults(container, dialect)
    for container in pod.get("initContainers") or []:
        if isinstance(container, dict):
            _container_defaults(container, dialect)
    normal: dict[str, Any] = normal_form(view)
    return normal


def _add_default_port(
    containers: list[dict[str, Any]], dialect: Dialect, framework: Framework, role: Role
) -> None:
    defaults = operator_defaults(dialect, framework)
    if defaults.port is None or (
        defaults.port_roles is not None and role not in defaults.port_roles
    ):
        return
    name = FRAMEWORKS[framework].container_name(dialect)
    index = next((i for i, c in enumerate(containers) if c.get("name") == name), None)
    if index is None:
        if defaults.port_by_name_only:
            return
        index = 0
    ports = containers[index].setdefault("ports", [])
    if isinstance(ports, list) and not any(
        isinstance(p, dict) and p.get("name") == defaults.port[0] for p in ports
    ):
        ports.append({"name": defaults.port[0], "containerPort": defaults.port[1]})


def resources_view(resources: Any) -> Any:
    """A container's ``resources`` with each request defaulted to its limit, as pods get them."""
    container = {"resources": copy.deepcopy(resources)}
    _container_defaults(container, Dialect.KUBEFLOW)
    return normal_form(container["resources"])


def _container_defaults(container: dict[str, Any], dialect: Dialect) -> None:
    image = container.get("image")
    if "imagePullPolicy" not in container and isinstance(image, str):
        tail = image.rsplit("/", 1)[-1]
        latest = "@" not in tail and (":" not in tail or tail.endswith(":latest"))
        container["imagePullPolicy"] = "Always" if latest else "IfNotPresent"
    if not container.get("terminationMessagePolicy"):
        fallback = dialect is Dialect.KUBEDL
        container["terminationMessagePolicy"] = "FallbackToLogsOnError" if fallback else "File"
    resources = container.get("resources")
    if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
        requests = resources.setdefault("requests", {})
        if isinstance(requests, dict):
            for name, amount in resources["limits"].items():
                requests.setdefault(name, amount)
    for port in container.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    for item in container.get("env") or []:
        if isinstance(item, dict) and "value" not in item and "valueFrom" not in item:
            item["value"] = ""


# --- Kubeflow Trainer v2 ----------------------------------------------------------------------

TRAINER_RUNTIME_GROUP: Final = "trainer.kubeflow.org"
"""``runtimeRef.apiGroup`` when the TrainJob gives none (the CRD's default)."""
TRAINER_RUNTIME_KIND: Final = "ClusterTrainingRuntime"
"""``runtimeRef.kind`` when the TrainJob gives none (the CRD's default)."""
TRAINER_MANAGER: Final = "trainer.kubeflow.org/trainjob-controller"
"""``spec.managedBy`` when the TrainJob gives none (the CRD's default)."""
TRAINER_RUNTIME_IMAGES: Final = MappingProxyType(
    {
        "torch-distributed": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
        "deepspeed-distributed": "ghcr.io/kubeflow/trainer/deepspeed-runtime",
        "mlx-distributed": "ghcr.io/kubeflow/trainer/mlx-runtime",
        "xgboost-distributed": "ghcr.io/kubeflow/trainer/xgboost-runtime",
        "jax-distributed": "nvcr.io/nvidia/jax:25.10-py3",
    }
)
"""The trainer image of each ClusterTrainingRuntime Trainer v2.3.0 installs
(``manifests/base/runtimes``): a TrainJob without ``trainer.image`` runs it."""
TRAINER_DEFAULT_NODES: Final = 1
"""``trainer.numNodes`` when the TrainJob gives none: the ``mlPolicy.numNodes`` of every runtime
Trainer v2.3.0 installs (a runtime of one's own may say otherwise)."""


def trainjob_view(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A Kubeflow Trainer v2 ``TrainJob`` as the API server and Trainer act on it.

    The CRD's defaults are filled in (``runtimeRef.apiGroup`` and ``kind``, ``suspend: false``,
    ``managedBy``), ``numNodes`` and the image of the runtimes Trainer installs
    (:data:`TRAINER_RUNTIME_IMAGES`), pod defaults in the
    trainer (requests from limits, an empty value for an env item without one), and the
    runtime patches are merged in order into one, without their ``manager`` and ``time``: who
    owns a patch does not change the job, what it patches does.

    Example:
        >>> one = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        ...        "metadata": {"name": "a"}, "spec": {"runtimeRef": {"name": "torch-distributed"},
        ...        "trainer": {"resourcesPerNode": {"limits": {"cpu": 2}}}}}
        >>> two = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        ...        "metadata": {"name": "a"}, "spec": {"suspend": False, "runtimeRef": {
        ...        "name": "torch-distributed", "kind": "ClusterTrainingRuntime"}, "trainer": {
        ...        "numNodes": 1, "resourcesPerNode": {"limits": {"cpu": "2"},
        ...        "requests": {"cpu": "2000m"}}}}}
        >>> differences(trainjob_view(one), trainjob_view(two))
        []
    """
    data: dict[str, Any] = copy.deepcopy(dict(manifest))
    metadata = {k: v for k, v in (data.get("metadata") or {}).items() if k not in _SERVER_METADATA}
    annotations = dict(metadata.get("annotations") or {})
    annotations.pop(LAST_APPLIED_ANNOTATION, None)
    metadata["annotations"] = annotations
    body = data.get("spec")
    if not isinstance(body, dict):
        generic: dict[str, Any] = normal_form(data)
        return generic
    body = dict(body)
    ref = body.get("runtimeRef")
    if isinstance(ref, dict):
        ref = dict(ref)
        ref.setdefault("apiGroup", TRAINER_RUNTIME_GROUP)
        ref.setdefault("kind", TRAINER_RUNTIME_KIND)
        body["runtimeRef"] = ref
    if body.get("suspend") is False:
        del body["suspend"]
    if body.get("managedBy") == TRAINER_MANAGER:
        del body["managedBy"]
    trainer = body.get("trainer")
    if isinstance(trainer, dict):
        trainer = dict(trainer)
        trainer.setdefault("numNodes", TRAINER_DEFAULT_NODES)
        if isinstance(ref, dict) and ref.get("kind") == TRAINER_RUNTIME_KIND:
            image = TRAINER_RUNTIME_IMAGES.get(str(ref.get("name")))
            if image is not None:
                trainer.setdefault("image", image)
        container = {k: trainer[k] for k in ("env",) if k in trainer}
        if "resourcesPerNode" in trainer:
            container["resources"] = trainer["resourcesPerNode"]
        _container_defaults(container, Dialect.KUBEFLOW)
        container.pop("terminationMessagePolicy", None)
        if "resources" in container:
            trainer["resourcesPerNode"] = container.pop("resources")
        trainer.update(container)
        body["trainer"] = trainer
    patches = body.pop("runtimePatches", None)
    if isinstance(patches, list):
        merged: Any = {}
        for patch in patches:
            if isinstance(patch, dict):
                content = {k: v for k, v in patch.items() if k not in ("manager", "time")}
                merged = _merge_named(merged, content)
        body["runtimePatch"] = merged
    view: dict[str, Any] = normal_form(
        {
            "apiVersion": data.get("apiVersion"),
            "kind": data.get("kind"),
            "metadata": metadata,
            "spec": body,
        }
    )
    return view


def _merge_named(base: Any, override: Any) -> Any:
    """``override`` merged into ``base``: mappings by key, lists of named items by name."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge_named(merged[key], value) if key in merged else value
        return merged
    named = [
        isinstance(items, list)
        and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items)
        for items in (base, override)
    ]
    if all(named):
        items = {item["name"]: item for item in base}
        for item in override:
            name = item["name"]
            items[name] = _merge_named(items[name], item) if name in items else item
        return list(items.values())
    return override


# --- generic normal form ---------------------------------------------------------------------

_QUANTITY_MAPS: Final = frozenset({"limits", "requests", "minResources", "capacity"})
_QUANTITY_FIELDS: Final = frozenset({"sizeLimit", "value", "averageValue"})


def normal_form(value: Any, parent: str = "") -> Any:
    """``value`` with quantities canonical, named lists keyed by name, empty values dropped.

    Example:
        >>> normal_form({"limits": {"cpu": 1}, "env": [{"name": "A", "value": "1"}], "x": []})
        {'limits': {'cpu': 'quantity 1'}, 'env': {'A': {'name': 'A', 'value': '1'}}}
    """
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            quantity = parent in _QUANTITY_MAPS or key == "sizeLimit"
            if quantity or (parent == "target" and key in _QUANTITY_FIELDS):
                normal = _quantity(item)
            else:
                normal = normal_form(item, str(key))
            if normal in (None, {}, []):
                continue
            out[key] = normal
        return out
    if isinstance(value, list):
        items = [normal_form(item, parent) for item in value]
        if parent == "ports" and all(isinstance(i, dict) and "containerPort" in i for i in items):
            return {f"{i['containerPort']}/{i.get('protocol', 'TCP')}": i for i in items}
        if items and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
            keyed = {i["name"]: i for i in items}
            if len(keyed) == len(items):
                return keyed
        return items
    return value


def _quantity(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return value
    text = value if isinstance(value, str) else str(value)
    if not is_quantity(text):
        return value
    try:
        amount = parse_quantity(text)
    except ValueError:
        return value
    return f"quantity {_canonical(amount)}"


def _canonical(amount: Decimal) -> str:
    normal = amount.normalize()
    return format(normal, "f") if normal == normal.to_integral_value() else str(normal)


def differences(left: Any, right: Any, path: str = "") -> list[str]:
    """The paths where two views (of :func:`operator_view`) differ, with both values.

    Example:
        >>> differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3, "d": 4}})
        ['a.c: 2 != 3', 'a.d: (absent) != 4']
    """
    if isinstance(left, dict) and isinstance(right, dict):
        found: list[str] = []
        for key in [*left, *(k for k in right if k not in left)]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in left:
                found.append(f"{sub}: (absent) != {right[key]!r}")
            elif key not in right:
                found.append(f"{sub}: {left[key]!r} != (absent)")
            else:
                found += differences(left[key], right[key], sub)
        return found
    if left != right:
        return [f"{path or '(root)'}: {left!r} != {right!r}"]
    return []
