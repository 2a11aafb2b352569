"""Function tasks: a Python function that runs on every replica of a distributed training job.

:func:`distributed_task` is to a training job what Prefect's ``@task`` is to a function call::

    from prefect import flow
    from kubedl_prefect.prefect import LocalCluster, distributed_task

    @distributed_task(replicas=2, cluster=LocalCluster(max_processes=2))
    def train(epochs: int) -> dict[str, float]:
        import torch.distributed as dist  # the process group is ready: gloo on the CPU
        ...
        return {"rank": dist.get_rank()}

    @flow
    def nightly() -> dict[str, float]:
        return train(epochs=3)  # rank 0's return value

The decorated object is a Prefect task (``.submit``, ``.map``, ``.with_options``, retries). Its
body builds a :class:`~kubedl_prefect.prefect.blocks.TrainingJob` from the decorator's settings
(a PyTorch job: one master, ``replicas - 1`` workers, each running
``python -m kubedl_prefect.prefect.bootstrap``), sends the call to the replicas without building
an image (:mod:`~kubedl_prefect.prefect.replica`: cloudpickle, at most 1 MiB, a file of the
workspace on a ``LocalCluster``), and runs it with the body of
:func:`~kubedl_prefect.prefect.tasks.run_training_job`: the same adoption, attempts and
classified retries, checkpoints, events, artifacts, labelled replica logs and cancellation.
Then it reads rank 0's return value back, or raises
:class:`~kubedl_prefect.errors.ReplicaFunctionError` naming the replica whose function raised.

The key of the logical job is ``<flow run id>/<task name>/<12 hex of the call's SHA-256>``: a
retry of the task and a re-run of the flow run adopt the job the same call made, and two calls
with other arguments are two jobs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar, overload

from prefect import get_run_logger, task
from prefect.tasks import Task

from kubedl_prefect.errors import JobFailedError, KubeDLPrefectError, ReplicaFunctionError
from kubedl_prefect.prefect.blocks import (
    ClusterBlock,
    KubernetesCluster,
    LocalCluster,
    RetrySettings,
    TrainingJob,
    WaitSettings,
    aload_cluster,
    load_cluster,
)
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.replica import (
    FUNCTION_SHA256_ENV,
    MAX_INLINE_PAYLOAD_BYTES,
    MAX_PAYLOAD_BYTES,
    PROCESS_GROUP_ENV,
    TERMINATION_MESSAGE_ENV,
    TERMINATION_MESSAGE_PATH,
    ReplicaError,
    digest,
    dump_call,
    payload_env,
    read_errors,
    read_result,
    read_termination_message,
    write_payload_file,
)
from kubedl_prefect.prefect.results import TrainingResult
from kubedl_prefect.prefect.sync import run_in_caller_context
from kubedl_prefect.prefect.tasks import _TASK_OPTIONS, arun_training_job, run_training_job
from kubedl_prefect.spec import Role
from kubedl_prefect.spec.naming import max_spec_name_length
from kubedl_prefect.spec.types import FRAMEWORKS, Dialect, Framework

P = ParamSpec("P")
R = TypeVar("R")

BOOTSTRAP_COMMAND = ("python", "-m", "kubedl_prefect.prefect.bootstrap")
"""What every replica runs: reads the env contract, joins the process group, calls the function."""
LOCAL_IMAGE = "local"
"""The image a job gets on a ``LocalCluster`` when none is given (unused there)."""
CHECKPOINT_MOUNT = "/checkpoints"
"""Where a job's checkpoint location is on a cluster (the result and error records go there)."""

ProcessGroup = Literal["auto", "gloo", "nccl", "none"]
_OWN_SPEC_FIELDS = frozenset(
    {"name", "framework", "image", "command", "args", "replicas", "env", "checkpoint"}
    | {"volumes", "resources", "podTemplate", "pod_template"}
)


def spec_name_for(function_name: str, replicas: int) -> str:
    """A valid spec name (DNS-1035, within the names' length budget) from a function's name.

    Example:
        >>> spec_name_for("train_Model_v2", 2)
        'train-model-v2'
        >>> spec_name_for("_private", 2), spec_name_for("_9lives", 2)
        ('private', 'fn-9lives')
    """
    name = re.sub(r"[^a-z0-9-]+", "-", function_name.lower()).strip("-") or "fn"
    if not name[0].isalpha():
        name = f"fn-{name}"
    budget = max_spec_name_length(_roles(replicas))
    return name[:budget].rstrip("-")


def _roles(replicas: int) -> list[tuple[Role, int]]:
    """The job's roles and their counts: one master (rank 0), ``replicas - 1`` workers."""
    roles = [(Role.MASTER, 1)]
    if replicas > 1:
        roles.append((Role.WORKER, replicas - 1))
    return roles


def replica_name(rank: int) -> str:
    """The replica that has ``rank`` in a function task's job (``master-0``, ``worker-<r-1>``).

    Example:
        >>> replica_name(0), replica_name(2)
        ('master-0', 'worker-1')
    """
    return "master-0" if rank == 0 else f"worker-{rank - 1}"


def rank_zero_message(
    pods: Sequence[Mapping[str, Any]], container: str
) -> tuple[str | None, str | None]:
    """Rank 0's pod among a job's pods, and its training container's termination message.

    Returns:
        ``(pod name, message)``; the message is ``None`` while the container has not ended or
        left none, the pod's name ``None`` when no pod is rank 0's (``master-0``).

    Example:
        >>> pod = {"metadata": {"name": "fn-a1-master-0", "labels": {"replica-type": "master",
        ...        "replica-index": "0"}}, "status": {"containerStatuses": [{"name": "pytorch",
        ...        "state": {"terminated": {"exitCode": 0, "message": '{"result": 1}'}}}]}}
        >>> rank_zero_message([pod], "pytorch")
        ('fn-a1-master-0', '{"result": 1}')
        >>> rank_zero_message([], "pytorch")
        (None, None)
    """
    from kubedl_prefect.lifecycle.replicas import replica_state

    for pod in pods:
        state = replica_state(dict(pod))
        if state.replica != replica_name(0):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != container:
                continue
            terminated = (status.get("state") or {}).get("terminated") or {}
            message = terminated.get("message")
            return state.pod, (str(message) if message else None)
        return state.pod, None
    return None, None


def _messages(status: Mapping[str, Any]) -> list[str]:
    """A container's termination messages: its current end, then the one before a restart."""
    found = []
    for state in ("state", "lastState"):
        terminated = (status.get(state) or {}).get("terminated") or {}
        if terminated.get("message"):
            found.append(str(terminated["message"]))
    return found


def replica_errors(pods: Sequence[Mapping[str, Any]], container: str) -> list[ReplicaError]:
    """The error records replicas left in their training containers' termination messages.

    A replica whose function raised leaves its record there (:mod:`.bootstrap`); messages that
    are not a function task's (a kubelet's fallback to the log's tail) are passed over.

    Returns:
        The records, the first written first (the failure's cause), one per rank.

    Example:
        >>> record = '{"error": {"rank": 1, "error_type": "ValueError", "last_line": '
        >>> record += '"ValueError: no", "exit_code": 1, "time": 5.0}}'
        >>> pod = {"metadata": {"name": "fn-a1-worker-0"}, "status": {"containerStatuses": [
        ...        {"name": "pytorch", "state": {"terminated": {"exitCode": 1,
        ...         "message": record}}}]}}
        >>> [(e.rank, e.last_line) for e in replica_errors([pod], "pytorch")]
        [(1, 'ValueError: no')]
    """
    found: dict[int, ReplicaError] = {}
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "")
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != container:
                continue
            for message in _messages(status):
                try:
                    error = read_termination_message(message, where=f"pod {name}").error
                except KubeDLPrefectError:
                    continue
                if error is not None and error.rank not in found:
                    found[error.rank] = error
    return sorted(found.values(), key=lambda error: (error.time, error.rank))


class DistributedFunction:
    """The settings of a :func:`distributed_task` and what it does with one call.

    Attributes:
        fn: The user's function (run on every replica).
        replicas: Replicas in all (rank 0 is the master).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        replicas: int,
        cluster: ClusterBlock | str | None,
        resources: Mapping[str, Any] | None,
        image: str | None,
        dialect: Literal["kubedl", "kubeflow"],
        namespace: str | None,
        env: Mapping[str, str] | None,
        checkpoint_pvc: str | None,
        process_group: ProcessGroup,
        retry: RetrySettings | Mapping[str, Any] | None,
        timeouts: WaitSettings | Mapping[str, Any] | None,
        name: str | None,
        max_payload_bytes: int,
        spec_fields: Mapping[str, Any] | None = None,
    ):
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, not {replicas}")
        self.fn = fn
        self.replicas = replicas
        self.cluster = cluster
        self.resources = dict(resources) if resources else None
        self.image = image
        self.dialect = dialect
        self.namespace = namespace
        self.env = dict(env or {})
        self.checkpoint_pvc = checkpoint_pvc
        self.process_group = process_group
        self.retry = (
            RetrySettings.model_validate(retry or {})
            if not isinstance(retry, RetrySettings)
            else retry
        )
        self.timeouts = (
            timeouts
            if isinstance(timeouts, WaitSettings)
            else WaitSettings.model_validate(timeouts or {})
        )
        self.name = name or fn.__name__
        self.spec_name = spec_name_for(self.name, replicas)
        self.max_payload_bytes = max_payload_bytes
        self.spec_fields = dict(spec_fields or {})
        taken = sorted(set(self.spec_fields) & _OWN_SPEC_FIELDS)
        if taken:
            raise KubeDLPrefectError(
                f"function task {self.spec_name!r}: spec_fields may not set {', '.join(taken)}",
                hint="the decorator sets those from its own arguments (replicas=, image=, env=...)",
            )

    def resolved_cluster(self) -> ClusterBlock:
        """The cluster block: the one given, the saved one of that name, or this machine."""
        if self.cluster is None:
            return LocalCluster()
        if isinstance(self.cluster, str):
            return load_cluster(self.cluster)
        return self.cluster

    async def aresolved_cluster(self) -> ClusterBlock:
        """Async :meth:`resolved_cluster` (loads a saved block without blocking the loop)."""
        if isinstance(self.cluster, str):
            return await aload_cluster(self.cluster)
        return self.resolved_cluster()

    def training_job(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        cluster: ClusterBlock | None = None,
    ) -> TrainingJob:
        """The training job block one call runs (its payload written where it must be).

        Raises:
            FunctionPayloadTooLargeError: The call serializes to more than the limit.
            KubeDLPrefectError: On a Kubernetes cluster, no ``image`` was given.
            SpecError: The settings make an invalid spec for the dialect.
        """
        cluster = cluster or self.resolved_cluster()
        local = isinstance(cluster, LocalCluster)
        if not local and self.image is None:
            raise KubeDLPrefectError(
                f"function task {self.spec_name!r} on a Kubernetes cluster has no image",
                hint="give image=: an image with kubedl-prefect (and what the function imports) "
                "installed, e.g. built FROM python:3.11 with `pip install kubedl-prefect`",
            )
        limit = (
            self.max_payload_bytes
            if local
            else min(self.max_payload_bytes, MAX_INLINE_PAYLOAD_BYTES)
        )
        data = dump_call(self.fn, args, kwargs, limit=limit)
        if local:
            workspace = Path(self.namespace or cluster.namespace)
            file: Path | None = write_payload_file(workspace / "functions", data)
        else:
            file = None
        env = {**self.env, **payload_env(data, file=file), PROCESS_GROUP_ENV: self.process_group}
        if not local:  # rank 0's value comes back in its container's termination message
            env[TERMINATION_MESSAGE_ENV] = TERMINATION_MESSAGE_PATH
        checkpoint: dict[str, Any] = {"location": CHECKPOINT_MOUNT}
        volumes: list[dict[str, Any]] | None = None
        if self.checkpoint_pvc is not None:
            checkpoint["pvc"] = self.checkpoint_pvc
        else:
            volumes = [{"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT, "emptyDir": {}}]
        spec: dict[str, Any] = {
            "name": self.spec_name,
            "framework": "pytorch",
            "image": self.image or LOCAL_IMAGE,
            "command": list(BOOTSTRAP_COMMAND),
            # ExitCode for every role: a function that raised exits 1, a failure no restart
            # in place mends (the job fails, and the pod keeps its termination message);
            # a replica killed from outside (128 + signal) is restarted.
            "replicas": {
                role.value: {"count": count, "restartPolicy": "ExitCode"}
                for role, count in _roles(self.replicas)
            },
            "env": env,
            "checkpoint": checkpoint,
        }
        if volumes is not None:
            spec["volumes"] = volumes
        if not local:
            container = {
                "name": self.container_name,
                "terminationMessagePath": TERMINATION_MESSAGE_PATH,
            }
            spec["podTemplate"] = {"spec": {"containers": [container]}}
        if self.resources:
            spec["resources"] = self.resources
        spec.update(self.spec_fields)
        return TrainingJob(
            spec=spec,
            cluster=cluster,
            dialect=self.dialect,
            namespace=self.namespace,
            retry=self.retry,
            timeouts=self.timeouts,
        )

    @property
    def container_name(self) -> str:
        """The training container's name in the job's pods (``pytorch``)."""
        return FRAMEWORKS[Framework.PYTORCH].container_name(Dialect(self.dialect))

    def key(self, job: TrainingJob) -> str:
        """The logical job's key: the flow run's default for this task, and the call's digest."""
        spec = job.training_spec()
        call = (spec.env or {})[FUNCTION_SHA256_ENV].value or digest(b"")
        return f"{RunContext.capture().default_key(spec.name)}/{call[:12]}"

    def run(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Run one call on every replica; rank 0's return value."""
        job, key, outputs = self._prepare(self.resolved_cluster(), args, kwargs)
        try:
            result = run_training_job.fn(job, key=key)
        except JobFailedError as exc:
            if outputs is None:  # a cluster: the failed replica's termination message says why
                records = run_in_caller_context(functools.partial(self._pod_errors, job, key, exc))
                raise self._replica_error(exc, None, records) from exc
            raise self._replica_error(exc, outputs) from exc
        if outputs is None:
            cluster = job.cluster
            return run_in_caller_context(lambda: self._from_pod(cluster, result))
        return self._from_outputs(outputs)

    async def arun(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Async :meth:`run`."""
        job, key, outputs = self._prepare(await self.aresolved_cluster(), args, kwargs)
        try:
            result = await arun_training_job.fn(job, key=key)
        except JobFailedError as exc:
            if outputs is None:  # a cluster: the failed replica's termination message says why
                records = await self._pod_errors(job, key, exc)
                raise self._replica_error(exc, None, records) from exc
            raise self._replica_error(exc, outputs) from exc
        if outputs is None:
            return await self._from_pod(job.cluster, result)
        return self._from_outputs(outputs)

    def _prepare(
        self, cluster: ClusterBlock, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[TrainingJob, str, Path | None]:
        job = self.training_job(args, kwargs, cluster=cluster)
        key = self.key(job)
        return job, key, self._outputs(job, key)

    def _from_outputs(self, outputs: Path) -> Any:
        """Rank 0's value from the job's checkpoint directory (a ``LocalCluster``)."""
        if read_errors(outputs):  # a PyTorch job succeeds with its master, whatever a worker did
            failed = JobFailedError(
                f"function task {self.spec_name!r}: a replica's function raised", retryable=False
            )
            raise self._replica_error(failed, outputs)
        return read_result(outputs)

    async def _from_pod(self, cluster: ClusterBlock, result: TrainingResult) -> Any:
        """Rank 0's value from its pod's termination message (a Kubernetes cluster)."""
        if not isinstance(cluster, KubernetesCluster):
            get_run_logger().warning(
                "function task %s ran on a %s: rank 0's return value stays in its checkpoint "
                "location (%s); the task returns None",
                self.spec_name,
                type(cluster).__name__,
                result.checkpoint,
            )
            return None
        ref = result.job_ref
        pods = await _job_pods(cluster, ref.namespace, ref.dialect, ref.name)
        errors = replica_errors(pods, self.container_name)
        if errors:  # a PyTorch job succeeds with its master, whatever a worker did
            failed = JobFailedError(
                f"function task {self.spec_name!r}: a replica's function raised",
                retryable=False,
                ref=ref.to_dict(),
            )
            raise self._replica_error(failed, None, errors)
        pod, message = rank_zero_message(pods, self.container_name)
        where = f"pod {ref.namespace}/{pod}"
        if message is None:
            raise KubeDLPrefectError(
                f"function task {self.spec_name!r}: the job succeeded but rank 0's "
                + (f"{where} left no termination message" if pod else "pod is gone"),
                hint="rank 0's value comes back in its container's termination message: keep "
                "the job's pods until the task ends (cleanPodPolicy Running or None), and run "
                "it on nodes whose kubelet writes state.terminated.message",
            )
        read = read_termination_message(message, where=where)
        if read.error is not None:  # rank 0 returned, but its value could not be written
            failed = JobFailedError(
                f"function task {self.spec_name!r}: rank 0's value could not be sent",
                retryable=False,
                ref=ref.to_dict(),
            )
            raise self._replica_error(failed, None, [read.error])
        return read.result

    async def _pod_errors(
        self, job: TrainingJob, key: str, exc: JobFailedError
    ) -> list[ReplicaError]:
        """The error records in the termination messages of the failed attempt's pods.

        The attempt is the one ``exc`` names (:attr:`JobFailedError.ref`). Empty when it names
        none (nothing was submitted) or the cluster cannot be read: the job's own failure is
        raised then.
        """
        from kubedl_prefect.lifecycle.backend import JobRef

        cluster = job.cluster
        if not isinstance(cluster, KubernetesCluster) or exc.ref is None:
            return []
        where = f"the failed attempt of {key!r}"
        try:
            ref = JobRef.from_dict(exc.ref)
            where = f"{ref.namespace}/{ref.name}"
            pods = await _job_pods(cluster, ref.namespace, ref.dialect, ref.name)
        except KubeDLPrefectError as error:
            get_run_logger().warning(
                "function task %s: the pods of %s could not be read for the failed replica's "
                "error: %s",
                self.spec_name,
                where,
                error.message,
            )
            return []
        return replica_errors(pods, self.container_name)

    def _outputs(self, job: TrainingJob, key: str) -> Path | None:
        """Where rank 0's result and the error records are, seen from here (local only)."""
        from kubedl_prefect.prefect.runs import CheckpointPlace

        if not isinstance(job.cluster, LocalCluster):
            return None
        backend = job.cluster.backend(dialect=job.dialect, namespace=job.resolved_namespace())
        if not isinstance(backend, CheckpointPlace):
            return None
        location = backend.checkpoint_location(job.training_spec(), key)
        return None if location is None else Path(location)

    def _replica_error(
        self,
        exc: JobFailedError,
        outputs: Path | None,
        records: Sequence[ReplicaError] = (),
    ) -> JobFailedError:
        errors = list(records) or (read_errors(outputs) if outputs is not None else [])
        if not errors:
            return exc
        first: ReplicaError = errors[0]
        replica = replica_name(first.rank)
        exit_code: int | None = first.exit_code
        diagnosis = exc.diagnosis
        if (
            diagnosis is not None
            and diagnosis.replica == replica
            and diagnosis.exit_code is not None
        ):
            exit_code = diagnosis.exit_code
        return ReplicaFunctionError(
            f"function task {self.spec_name!r}: replica {replica} (rank {first.rank} of "
            f"{self.replicas}) failed with exit code {exit_code}: {first.last_line}",
            replica=replica,
            rank=first.rank,
            exit_code=exit_code,
            last_line=first.last_line,
            error_type=first.error_type,
            hint=f"its traceback is in the task run's log, in the lines of {replica}",
            retryable=exc.retryable,
            diagnosis=diagnosis,
            attempts=exc.attempts,
            ref=exc.ref,
        )


async def _job_pods(
    cluster: KubernetesCluster, namespace: str, dialect: str, name: str
) -> list[dict[str, Any]]:
    """The pods of training job ``name`` (finished ones too, while the operator keeps them)."""
    from kubedl_prefect.kube.credentials import connect
    from kubedl_prefect.kube.resources import PODS
    from kubedl_prefect.lifecycle.kubernetes.dialects import JobObjects

    label, value = JobObjects(Dialect(dialect), name).pod_label
    async with await connect(cluster.credentials()) as client:
        pods: list[dict[str, Any]] = (
            await client.list(PODS, namespace, label_selector=f"{label}={value}")
        ).items
    return pods


@overload
def distributed_task(fn: Callable[P, R], /) -> Task[P, R]: ...


@overload
def distributed_task(
    fn: None = None,
    /,
    *,
    replicas: int = 2,
    cluster: ClusterBlock | str | None = None,
    resources: Mapping[str, Any] | None = None,
    image: str | None = None,
    dialect: Literal["kubedl", "kubeflow"] = "kubedl",
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
    checkpoint_pvc: str | None = None,
    process_group: ProcessGroup = "auto",
    retry: RetrySettings | Mapping[str, Any] | None = None,
    timeouts: WaitSettings | Mapping[str, Any] | None = None,
    name: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    spec_fields: Mapping[str, Any] | None = None,
    **task_options: Any,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def distributed_task(
    fn: Callable[P, R] | None = None,
    /,
    *,
    replicas: int = 2,
    cluster: ClusterBlock | str | None = None,
    resources: Mapping[str, Any] | None = None,
    image: str | None = None,
    dialect: Literal["kubedl", "kubeflow"] = "kubedl",
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
    checkpoint_pvc: str | None = None,
    process_group: ProcessGroup = "auto",
    retry: RetrySettings | Mapping[str, Any] | None = None,
    timeouts: WaitSettings | Mapping[str, Any] | None = None,
    name: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    spec_fields: Mapping[str, Any] | None = None,
    **task_options: Any,
) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
    """Make a function a distributed training step: a Prefect task that runs it on every replica.

    Used as ``@distributed_task`` or ``@distributed_task(replicas=4, ...)``, like ``@task``.
    Inside the function, the rank and world size are the operators' (``RANK``, ``WORLD_SIZE``,
    or :func:`~kubedl_prefect.prefect.replica.current_replica`), and with torch installed the
    default process group is initialised (``gloo`` on the CPU, ``nccl`` with CUDA): wrap the
    model in ``DistributedDataParallel`` and train. ``$KUBEDL_PREFECT_CHECKPOINT_DIR`` is the
    logical job's checkpoint directory, the same for every attempt.

    Args:
        fn: The function (when used as ``@distributed_task`` without arguments).
        replicas: Replicas in all: a PyTorch job with one master (rank 0) and ``replicas - 1``
            workers.
        cluster: A ``LocalCluster`` (default: this machine) or ``KubernetesCluster`` block, or
            the name of a saved one.
        resources: Per replica, as in a spec (``{"cpu": 2, "memory": "4Gi", "gpus": 1}``).
        image: The replicas' image: on Kubernetes one with kubedl-prefect installed (required
            there; unused on a ``LocalCluster``).
        dialect: The operator: ``kubedl`` or ``kubeflow``.
        namespace: The namespace (on a ``LocalCluster``, the workspace) of the jobs.
        env: Variables every replica gets.
        checkpoint_pvc: A PersistentVolumeClaim for the checkpoints on a cluster (default: a
            scratch ``emptyDir``, lost with the pod).
        process_group: ``auto`` (``nccl`` with CUDA, else ``gloo``), ``gloo``, ``nccl``, or
            ``none`` to leave it to the function.
        retry: Attempts of the job (:class:`~kubedl_prefect.prefect.blocks.RetrySettings`).
        timeouts: Waits (:class:`~kubedl_prefect.prefect.blocks.WaitSettings`).
        name: The task's and the spec's name (default: the function's).
        max_payload_bytes: The most the serialized call may weigh (1 MiB; 256 KiB at most on
            Kubernetes, where the call is inline in the job).
        spec_fields: More fields of the job's spec (``nodeSelector``, ``tolerations``,
            ``priorityClassName``, ``queue``...), except those the arguments above set.
        **task_options: Passed to Prefect's ``@task`` (``tags``, ``retries``...).

    On a Kubernetes cluster rank 0's value comes back in its container's termination message
    (:mod:`~kubedl_prefect.prefect.replica`): as JSON, at most 4 KiB.

    Async flows use the twin :func:`adistributed_task`, whose task they ``await``.

    Returns:
        A Prefect task returning rank 0's return value.

    Raises:
        ReplicaFunctionError: (when called) a replica's function raised; names the replica, its
            rank, exit code and the traceback's last line.
        FunctionPayloadTooLargeError: (when called) the call is larger than the limit, or (on
            Kubernetes) rank 0's value is larger than a termination message.
    """

    def decorate(function: Callable[P, R]) -> Task[P, R]:
        settings = settings_of(function)

        @functools.wraps(function)
        def run_on_replicas(*args: Any, **kwargs: Any) -> Any:
            return settings.run(args, kwargs)

        return _as_task(run_on_replicas, settings, task_options)

    settings_of = functools.partial(
        DistributedFunction,
        replicas=replicas,
        cluster=cluster,
        resources=resources,
        image=image,
        dialect=dialect,
        namespace=namespace,
        env=env,
        checkpoint_pvc=checkpoint_pvc,
        process_group=process_group,
        retry=retry,
        timeouts=timeouts,
        name=name,
        max_payload_bytes=max_payload_bytes,
        spec_fields=spec_fields,
    )
    return decorate(fn) if fn is not None else decorate


@overload
def adistributed_task(fn: Callable[P, R], /) -> Task[P, Coroutine[Any, Any, R]]: ...


@overload
def adistributed_task(
    fn: None = None,
    /,
    *,
    replicas: int = 2,
    cluster: ClusterBlock | str | None = None,
    resources: Mapping[str, Any] | None = None,
    image: str | None = None,
    dialect: Literal["kubedl", "kubeflow"] = "kubedl",
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
    checkpoint_pvc: str | None = None,
    process_group: ProcessGroup = "auto",
    retry: RetrySettings | Mapping[str, Any] | None = None,
    timeouts: WaitSettings | Mapping[str, Any] | None = None,
    name: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    spec_fields: Mapping[str, Any] | None = None,
    **task_options: Any,
) -> Callable[[Callable[P, R]], Task[P, Coroutine[Any, Any, R]]]: ...


def adistributed_task(
    fn: Callable[P, R] | None = None,
    /,
    *,
    replicas: int = 2,
    cluster: ClusterBlock | str | None = None,
    resources: Mapping[str, Any] | None = None,
    image: str | None = None,
    dialect: Literal["kubedl", "kubeflow"] = "kubedl",
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
    checkpoint_pvc: str | None = None,
    process_group: ProcessGroup = "auto",
    retry: RetrySettings | Mapping[str, Any] | None = None,
    timeouts: WaitSettings | Mapping[str, Any] | None = None,
    name: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    spec_fields: Mapping[str, Any] | None = None,
    **task_options: Any,
) -> Task[P, Coroutine[Any, Any, R]] | Callable[[Callable[P, R]], Task[P, Coroutine[Any, Any, R]]]:
    """Async :func:`distributed_task`: the same settings, a task that async flows ``await``.

    The function itself is the same kind as for :func:`distributed_task` (it runs on the
    replicas); only the flow's side waits without blocking its event loop, so one async flow
    can run several distributed steps at once::

        import asyncio
        from prefect import flow
        from kubedl_prefect.prefect import LocalCluster, adistributed_task

        @adistributed_task(replicas=2, cluster=LocalCluster(max_processes=4))
        def shard_sum(shard: int) -> float:
            ...

        @flow
        async def sums() -> list[float]:
            return await asyncio.gather(shard_sum(1), shard_sum(2))
    """

    def decorate(function: Callable[P, R]) -> Task[P, Coroutine[Any, Any, R]]:
        settings = settings_of(function)

        @functools.wraps(function)
        async def run_on_replicas(*args: Any, **kwargs: Any) -> Any:
            return await settings.arun(args, kwargs)

        return _as_task(run_on_replicas, settings, task_options)

    settings_of = functools.partial(
        DistributedFunction,
        replicas=replicas,
        cluster=cluster,
        resources=resources,
        image=image,
        dialect=dialect,
        namespace=namespace,
        env=env,
        checkpoint_pvc=checkpoint_pvc,
        process_group=process_group,
        retry=retry,
        timeouts=timeouts,
        name=name,
        max_payload_bytes=max_payload_bytes,
        spec_fields=spec_fields,
    )
    return decorate(fn) if fn is not None else decorate


def _as_task(
    body: Callable[..., Any], settings: DistributedFunction, task_options: Mapping[str, Any]
) -> Task[Any, Any]:
    """The Prefect task of a distributed function: ``body`` with the tasks' options."""
    body.__kubedl_function__ = settings  # type: ignore[attr-defined]
    options = {**_TASK_OPTIONS, "name": settings.name, **task_options}
    made: Task[Any, Any] = task(body, **options)
    return made


def function_of(distributed: Task[..., Any]) -> DistributedFunction:
    """The settings behind a :func:`distributed_task` (``with_options`` copies keep them).

    Raises:
        KubeDLPrefectError: ``distributed`` was not made by :func:`distributed_task`.
    """
    settings = getattr(distributed.fn, "__kubedl_function__", None)
    if not isinstance(settings, DistributedFunction):
        raise KubeDLPrefectError(
            f"{getattr(distributed, 'name', distributed)!r} is not a distributed task",
            hint="decorate the function with @distributed_task",
        )
    return settings


def distributed_job(distributed: Task[..., Any], *args: Any, **kwargs: Any) -> TrainingJob:
    """The training job block that calling ``distributed(*args, **kwargs)`` would run.

    Render it with :func:`~kubedl_prefect.prefect.tasks.render_training_job` to see the
    manifest a cluster would get.

    Example:
        ::

            job = distributed_job(train, epochs=3)
            manifest = render_training_job.fn(job, key="preview")
    """
    return function_of(distributed).training_job(args, kwargs)


__all__ = [
    "DistributedFunction",
    "adistributed_task",
    "distributed_job",
    "distributed_task",
    "function_of",
    "replica_errors",
    "replica_name",
    "spec_name_for",
]
