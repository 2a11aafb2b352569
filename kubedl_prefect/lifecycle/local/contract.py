"""The environment the operators give each replica, reproduced for local processes. Pure.

On Kubernetes the operator injects the rendezvous variables into every replica's container: for
PyTorch (KubeDL v0.5 and Kubeflow v1.9 alike) ``MASTER_ADDR`` (the master's service),
``MASTER_PORT``, ``WORLD_SIZE`` (every replica of every role) and ``RANK`` (the master 0, worker
``i`` is ``i + 1``), plus ``PYTHONUNBUFFERED``; for TensorFlow ``TF_CONFIG`` (the cluster of every
role's addresses and the replica's own task). kubedl-prefect adds the checkpoint location
(``KUBEDL_PREFECT_CHECKPOINT_DIR``). Locally every replica is one process of this machine, so:

- addresses are ``127.0.0.1``, and ports are free ports of this machine picked at submission
  (one for the master, one per replica for TensorFlow) instead of the operators' fixed ones;
- ``LOCAL_RANK`` is ``0``: each replica is one process on its own "node" (a pod), as it is on a
  cluster without ``torchrun``; a replica asking for GPUs sees its own in ``CUDA_VISIBLE_DEVICES``
  (device ``cuda:0`` is its first), and one asking for none sees none, as in a pod;
- rendezvous traffic stays on this machine: gloo and NCCL are pinned to the loopback interface
  (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``; the backend's ``env`` may say otherwise);
- the command runs in the current Python environment: ``python``/``python3`` is this
  interpreter, and its ``bin`` directory comes first on ``PATH``; the image is not used;
- a replica starts from a minimal environment, not the caller's (whose secrets, such as
  ``PREFECT_API_KEY`` or cloud credentials, it has no business with): only the names in
  :data:`INHERITED_ENV` (and ``LC_*``) are passed on; the spec's ``env`` and the backend's come
  on top, and the job's marker (:data:`~.layout.JOB_MARKER_ENV`) last;
- a checkpoint location that is not a ``file://`` URI (a container path on a volume, an object
  store URI) becomes a directory of the workspace, with the same per-key last segment.

A job for Kubeflow Trainer v2 (``dialect="trainer"``) gets the environment Trainer's torch plugin
gives a PyTorch TrainJob's nodes instead (:func:`trainer_torch_env`): ``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, read by
``torchrun``, which then sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` per process; the v1
variables (``MASTER_ADDR``, ``RANK``...) are not set, as on Trainer. Every replica is one node.
An XGBoost TrainJob's nodes get what Trainer's xgboost plugin gives (:func:`trainer_xgboost_env`):
``DMLC_TRACKER_URI`` and ``DMLC_TRACKER_PORT`` (node 0 runs the Rabit tracker),
``DMLC_TASK_ID`` (the node's index) and ``DMLC_NUM_WORKER``, again without the v1 variables.

The functions here decide all of that from the spec and a few facts about the machine; the
supervisor (:mod:`.supervisor`) only launches what they decide.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Final
from urllib.parse import unquote, urlparse

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.lifecycle.backend import checkpoint_location
from kubedl_prefect.lifecycle.local.layout import JOB_MARKER_ENV
from kubedl_prefect.lifecycle.local.state import ReplicaPlan
from kubedl_prefect.spec import CHECKPOINT_ENV, Dialect, Framework, Role, TrainingJobSpec
from kubedl_prefect.spec.quantity import parse_quantity

LOCAL_HOST: Final = "127.0.0.1"
"""The address every replica listens on and reaches the others at."""

CONTRACT_ENV: Final = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "TF_CONFIG",
        "PYTHONUNBUFFERED",
        "CUDA_VISIBLE_DEVICES",
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "DMLC_TRACKER_URI",
        "DMLC_TRACKER_PORT",
        "DMLC_TASK_ID",
        "DMLC_NUM_WORKER",
        CHECKPOINT_ENV,
        JOB_MARKER_ENV,
    }
)
"""Variables the contract sets; an inherited value of any of them is dropped first, so that a
caller running under ``torchrun`` (or with a stale ``TF_CONFIG``) cannot leak its own."""

INHERITED_ENV: Final = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "TEMP",
        "TMP",
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
    }
)
"""What a replica (and the supervisor) takes from the caller's environment, with ``LC_*``: what
a program needs to find its interpreter, libraries, home, temporary folder, locale and CA
certificates, and nothing that usually holds a secret. Anything else goes through the spec's
``env`` or the backend's (``LocalCluster.env``)."""

INHERITED_PREFIXES: Final = ("LC_",)

LOOPBACK_ENV: Final = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""Variables that pin gloo's and NCCL's sockets to an interface: the loopback one, locally."""
PYTHON_NAMES: Final = re.compile(r"^python(3(\.\d+)?)?\Z")
"""Commands that mean "the Python interpreter" and run as the current one."""


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What of the caller's ``environ`` a replica or supervisor starts from (:data:`INHERITED_ENV`).

    Example:
        >>> inherited_env({"HOME": "/h", "LC_ALL": "C", "PREFECT_API_KEY": "pnu_x"})
        {'HOME': '/h', 'LC_ALL': 'C'}
    """
    return {
        name: value
        for name, value in environ.items()
        if name in INHERITED_ENV or name.startswith(INHERITED_PREFIXES)
    }


def launch_env(
    inherited: Mapping[str, str], plan: Mapping[str, str], python: str
) -> dict[str, str]:
    """A replica's whole environment: what it inherits (:func:`inherited_env`), then the plan.

    The directory of ``python`` comes first on ``PATH``, so that ``torchrun`` and other
    commands of the current environment are found.

    Example:
        >>> env = launch_env({"PATH": "/usr/bin", "RANK": "3", "HOME": "/h", "TOKEN": "x"},
        ...                  {"RANK": "0"}, "/venv/bin/python")
        >>> env == {"PATH": "/venv/bin:/usr/bin", "RANK": "0", "HOME": "/h"}
        True
    """
    env = {k: v for k, v in inherited_env(inherited).items() if k not in CONTRACT_ENV}
    env.update(plan)
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(python), env.get("PATH", "")) if p)
    return env


def trainer_procs_per_node(spec: TrainingJobSpec) -> str:
    """``PET_NPROC_PER_NODE`` as Trainer's torch plugin (v2.3.0) sets it for ``spec``.

    ``numProcPerNode`` when the spec gives a number (``nprocPerNode``); else ``auto`` for a node
    with GPUs, and for one without, its CPUs (the request, else the limit, rounded up), at
    least 1.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "m", "image": "i", "replicas": {"worker": 2},
        ...                    "resources": {"cpu": "2500m"}})
        >>> trainer_procs_per_node(spec)
        '3'
    """
    if spec.nproc_per_node is not None and spec.nproc_per_node.isdigit():
        return spec.nproc_per_node
    resources = spec.resolved_roles()[0].resources
    if resources is not None and resources.gpus:
        return "auto"
    cpu = None
    if resources is not None:
        cpu = resources.requests.get("cpu") or resources.cpu or resources.limits.get("cpu")
    if cpu is None:
        return "1"
    return str(max(1, math.ceil(parse_quantity(str(cpu)))))


def trainer_torch_env(
    spec: TrainingJobSpec, node_rank: int, *, port: int, host: str = LOCAL_HOST
) -> dict[str, str]:
    """What Trainer's torch plugin gives node ``node_rank`` of a PyTorch TrainJob, locally.

    On a cluster ``PET_MASTER_ADDR`` is node 0's host name (``<job>-node-0-0.<job>``) and
    ``PET_MASTER_PORT`` 29500; here both are this machine's (``host``, a free ``port``).

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "m", "image": "i", "replicas": {"worker": 2}})
        >>> trainer_torch_env(spec, 1, port=29511)["PET_NODE_RANK"]
        '1'
    """
    return {
        "PET_NNODES": str(len(replica_names(spec))),
        "PET_NPROC_PER_NODE": trainer_procs_per_node(spec),
        "PET_NODE_RANK": str(node_rank),
        "PET_MASTER_ADDR": host,
        "PET_MASTER_PORT": str(port),
    }


def trainer_xgboost_env(
    spec: TrainingJobSpec, node_rank: int, *, port: int, host: str = LOCAL_HOST
) -> dict[str, str]:
    """What Trainer's xgboost plugin (v2.3.0) gives node ``node_rank`` of an XGBoost TrainJob.

    On a cluster ``DMLC_TRACKER_URI`` is node 0's host name and ``DMLC_TRACKER_PORT`` Trainer's
    container port; here both are this machine's (``host``, a free ``port``). Workers are one per
    GPU of a node, one per node without GPUs, as the plugin counts them.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "m", "image": "i", "framework": "xgboost",
        ...                    "replicas": {"master": 1, "worker": 2}})
        >>> env = trainer_xgboost_env(spec, 2, port=29511)
        >>> env["DMLC_TASK_ID"], env["DMLC_NUM_WORKER"]
        ('2', '3')
    """
    resources = spec.resolved_roles()[0].resources
    workers_per_node = max(1, resources.gpus if resources is not None else 0)
    return {
        "DMLC_TRACKER_URI": host,
        "DMLC_TRACKER_PORT": str(port),
        "DMLC_TASK_ID": str(node_rank),
        "DMLC_NUM_WORKER": str(len(replica_names(spec)) * workers_per_node),
    }


def replica_names(spec: TrainingJobSpec) -> list[tuple[Role, int]]:
    """``(role, index)`` of every replica, in the framework's role order."""
    return [(r.role, i) for r in spec.resolved_roles() for i in range(r.count)]


def ports_needed(spec: TrainingJobSpec) -> int:
    """How many free ports the rendezvous needs: one per replica for TensorFlow, else one."""
    return len(replica_names(spec)) if spec.framework is Framework.TENSORFLOW else 1


def success_replicas(spec: TrainingJobSpec) -> frozenset[str]:
    """The replicas whose success is the job's success, as the operators decide it.

    PyTorch and XGBoost: the master (every worker without one). TensorFlow: the chief or master;
    without one, worker 0 (every worker with ``successPolicy: AllWorkers``).
    """
    counts = {role: spec.replicas[role].count for role in spec.replicas}
    tensorflow = spec.framework is Framework.TENSORFLOW
    for role in (Role.CHIEF, Role.MASTER) if tensorflow else (Role.MASTER,):
        if role in counts:
            return frozenset({f"{role.value}-0"})
    workers = counts.get(Role.WORKER, 0)
    if tensorflow and spec.success_policy != "AllWorkers" and workers:
        return frozenset({"worker-0"})
    if workers:
        return frozenset(f"worker-{i}" for i in range(workers))
    return frozenset(f"{role.value}-{i}" for role, i in replica_names(spec))


def local_issues(spec: TrainingJobSpec, provided: Collection[str] = ()) -> list[SpecIssue]:
    """What in ``spec`` the local backend cannot run, with the field and the fix.

    A variable read from a Secret or ConfigMap on a cluster (the tracking credentials of the
    model handoff, say) is accepted when the backend's own environment, ``provided``, gives it.
    """
    issues: list[SpecIssue] = []
    if spec.framework is Framework.MPI:
        issues.append(
            SpecIssue(
                "framework",
                "the local backend does not run MPI jobs (the launcher reaches its workers "
                "through the cluster)",
                "run MPI jobs on a cluster (KubernetesBackend)",
            )
        )
    if spec.elastic is not None:
        issues.append(
            SpecIssue(
                "elastic",
                "the local backend does not run elastic jobs",
                "remove elastic to debug locally with a fixed worker count",
            )
        )
    for resolved in spec.resolved_roles():
        if not resolved.command:
            issues.append(
                SpecIssue(
                    f"{resolved.path}.command",
                    "the local backend needs a command: the image's entrypoint is not available "
                    "locally",
                    "set command (e.g. [python, -m, your.training.module])",
                )
            )
        for name, value in resolved.env.items():
            from_store = value.secret_key_ref is not None or value.config_map_key_ref is not None
            if from_store and name not in provided:
                issues.append(
                    SpecIssue(
                        f"{resolved.path}.env.{name}",
                        "Secrets and ConfigMaps are not available to the local backend",
                        "pass the value with LocalBackend(env={...}) or as a literal",
                    )
                )
            elif value.field_ref is not None and value.field_ref.field_path not in _FIELD_REFS:
                issues.append(
                    SpecIssue(
                        f"{resolved.path}.env.{name}",
                        f"the pod field {value.field_ref.field_path} has no local value",
                        f"use one of {', '.join(sorted(_FIELD_REFS))}, or a literal",
                    )
                )
    return list(dict.fromkeys(issues))


_FIELD_REFS: Final = frozenset(
    {"metadata.name", "metadata.namespace", "status.podIP", "status.hostIP", "spec.nodeName"}
)


def check_local(spec: TrainingJobSpec, provided: Collection[str] = ()) -> None:
    """Raise :class:`SpecError` if the local backend cannot run ``spec`` (:func:`local_issues`)."""
    issues = local_issues(spec, provided)
    if issues:
        raise SpecError(issues, source="the local backend")


def local_checkpoint_dir(spec: TrainingJobSpec, key: str, workspace: str) -> str | None:
    """Where the replicas of every attempt of ``(spec.name, key)`` keep checkpoints locally.

    A ``file://`` location is used as it is (``file:///data/ckpt`` gives
    ``/data/ckpt/<name>-<digest>``); any other (a container path on a volume, ``s3://``) becomes
    ``<workspace>/checkpoints/<name>-<digest>``. The last segment is the one
    :func:`~kubedl_prefect.lifecycle.backend.checkpoint_location` gives on a cluster: the same for
    every attempt of one key, different for two keys.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "mnist", "image": "x", "command": ["python"],
        ...                    "replicas": {"master": 1}, "checkpoint": {"location": "s3://b/c"}})
        >>> local_checkpoint_dir(spec, "nightly", "/ws")
        '/ws/checkpoints/mnist-...'
    """
    location = checkpoint_location(spec, key)
    if location is None or spec.checkpoint is None:
        return None
    if spec.checkpoint.location.startswith("file://"):
        return unquote(urlparse(location).path)
    return posixpath.join(workspace, "checkpoints", location.rsplit("/", 1)[-1])


def resolve_argv(argv: Sequence[str], python: str) -> tuple[str, ...]:
    """The command line with ``python``/``python3``/``python3.X`` replaced by ``python``."""
    if argv and PYTHON_NAMES.match(argv[0]):
        return (python, *argv[1:])
    return tuple(argv)


def cpu_threads(cpu: str | None) -> int | None:
    """Threads a replica with ``cpu`` cores should use (at least 1), ``None`` without a limit."""
    if cpu is None:
        return None
    return max(1, int(parse_quantity(cpu)))


def replica_plans(
    spec: TrainingJobSpec,
    *,
    job_name: str,
    ports: Sequence[int],
    python: str,
    working_dir: str,
    checkpoint_dir: str | None,
    gpu_ids: Sequence[int] = (),
    extra_env: Mapping[str, str] | None = None,
    hostname: str = "localhost",
    inherited: Mapping[str, str] | None = None,
    job_uid: str = "",
    loopback_interface: str = "lo",
    dialect: Dialect | str | None = None,
) -> list[ReplicaPlan]:
    """Every replica's command line and environment, as the operators would give them.

    Args:
        spec: The spec (checked with :func:`check_local` first).
        job_name: The job's name (``<spec>-<key hash>-a<attempt>``).
        ports: Free ports of this machine, :func:`ports_needed` of them.
        python: The interpreter that runs ``python`` commands.
        working_dir: The replicas' working directory.
        checkpoint_dir: The local checkpoint directory (:func:`local_checkpoint_dir`).
        gpu_ids: The machine's GPUs to hand out, in order, to replicas asking for them.
        extra_env: Variables for every replica (the backend's ``env``), applied after the
            spec's and before the contract's; they also stand in for the spec's Secret and
            ConfigMap references of the same name.
        hostname: This machine's name (the value of ``spec.nodeName`` references).
        inherited: The caller's environment (``os.environ``): only :func:`inherited_env` of it
            reaches the replicas.
        job_uid: The job's uid, the marker every replica carries (:data:`~.layout.JOB_MARKER_ENV`).
        loopback_interface: This machine's loopback interface (``lo``, ``lo0`` on macOS), which
            gloo and NCCL are pinned to (:data:`LOOPBACK_ENV`) unless ``extra_env`` sets them.
        dialect: The operator whose contract to give: ``trainer`` gives a PyTorch or XGBoost job
            Kubeflow Trainer's (:func:`trainer_torch_env`, :func:`trainer_xgboost_env`);
            otherwise (``None``) the v1 operators'.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "mnist", "image": "x", "command": ["python", "t.py"],
        ...                    "replicas": {"master": 1, "worker": 1}})
        >>> plans = replica_plans(spec, job_name="mnist-a1", ports=[29500], python="/v/python",
        ...                       working_dir="/w", checkpoint_dir=None)
        >>> [(p.name, p.argv[0], p.env["RANK"], p.env["MASTER_PORT"]) for p in plans]
        [('master-0', '/v/python', '0', '29500'), ('worker-0', '/v/python', '1', '29500')]
    """
    check_local(spec, provided=set(extra_env or {}))
    replicas = replica_names(spec)
    if len(ports) < ports_needed(spec):
        raise ValueError(f"{ports_needed(spec)} ports are needed, {len(ports)} were given")
    tf_cluster: dict[str, list[str]] = {}
    for number, (role, _) in enumerate(replicas):
        if spec.framework is Framework.TENSORFLOW:
            tf_cluster.setdefault(role.value, []).append(f"{LOCAL_HOST}:{ports[number]}")
    has_master = Role.MASTER in spec.replicas
    world_size = len(replicas)
    on_trainer = dialect is not None and Dialect(dialect) is Dialect.TRAINER
    torch_nodes = on_trainer and spec.framework is Framework.PYTORCH
    xgboost_nodes = on_trainer and spec.framework is Framework.XGBOOST
    node_rank = 0
    free_gpus = list(gpu_ids)
    plans: list[ReplicaPlan] = []
    for resolved in spec.resolved_roles():
        for index in range(resolved.count):
            name = f"{resolved.role.value}-{index}"
            pod_name = f"{job_name}-{name}"
            env: dict[str, str] = {}
            for key, value in resolved.env.items():
                if value.value is not None:
                    env[key] = value.value
                elif value.field_ref is not None:
                    env[key] = {
                        "metadata.name": pod_name,
                        "metadata.namespace": "local",
                        "status.podIP": LOCAL_HOST,
                        "status.hostIP": LOCAL_HOST,
                        "spec.nodeName": hostname,
                    }[value.field_ref.field_path]
            # Locally every peer is on this machine: the spec's interface is a cluster's.
            env.update(dict.fromkeys(LOOPBACK_ENV, loopback_interface))
            threads = cpu_threads(resolved.resources.cpu if resolved.resources else None)
            if threads is not None:
                env.setdefault("OMP_NUM_THREADS", str(threads))
            env.update(extra_env or {})
            env[JOB_MARKER_ENV] = job_uid
            env["PYTHONUNBUFFERED"] = "0"
            if not on_trainer:  # under Trainer, torchrun sets it per process; xgboost none
                env["LOCAL_RANK"] = "0"
            gpus = resolved.resources.gpus if resolved.resources else 0
            mine, free_gpus = free_gpus[:gpus], free_gpus[gpus:]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in mine)
            if checkpoint_dir is not None:
                env[CHECKPOINT_ENV] = checkpoint_dir
            if spec.framework is Framework.TENSORFLOW:
                env["TF_CONFIG"] = json.dumps(
                    {
                        "cluster": tf_cluster,
                        "task": {"type": resolved.role.value, "index": index},
                        "environment": "cloud",
                    },
                    sort_keys=True,
                )
            elif torch_nodes:
                env.update(trainer_torch_env(spec, node_rank, port=ports[0]))
            elif xgboost_nodes:
                env.update(trainer_xgboost_env(spec, node_rank, port=ports[0]))
            elif has_master:
                rank = index if resolved.role is Role.MASTER else index + 1
                env["MASTER_ADDR"] = LOCAL_HOST
                env["MASTER_PORT"] = str(ports[0])
                env["WORLD_SIZE"] = str(world_size)
                env["RANK"] = str(rank)
            node_rank += 1
            argv = [*(resolved.command or []), *(resolved.args or [])]
            plans.append(
                ReplicaPlan(
                    name=name,
                    role=resolved.role.value,
                    index=index,
                    argv=resolve_argv(argv, python),
                    env=launch_env(inherited or {}, env, python),
                    cwd=working_dir,
                )
            )
    return plans
