"""What a function task's replicas and its flow exchange: the call, the env contract, the result.

A :func:`~kubedl_prefect.prefect.functions.distributed_task` sends a Python function and its
arguments to every replica of a training job without building an image: the call is serialized
with cloudpickle (:func:`dump_call`), bounded in size (:data:`MAX_PAYLOAD_BYTES`), and travels in
the job's spec — as a file of the workspace on a ``LocalCluster`` (:data:`FUNCTION_FILE_ENV`), as
an environment variable on a Kubernetes cluster (:data:`FUNCTION_DATA_ENV`, base64, at most
:data:`MAX_INLINE_PAYLOAD_BYTES`). Its SHA-256 travels beside it (:data:`FUNCTION_SHA256_ENV`):
a replica runs only the payload the decorated call produced, never one swapped in the workspace.

On the replica, :mod:`kubedl_prefect.prefect.bootstrap` reads the operators' environment
(:func:`current_replica`), loads the call (:func:`read_payload`, :func:`load_call`), runs it and
leaves what the flow reads back in the job's checkpoint directory: rank 0's return value
(:func:`write_result`) or, for a replica whose function raised, an error record
(:func:`write_error`: rank, exception type, the traceback's last line).

On a Kubernetes cluster the checkpoint directory is usually not the flow's to read, so the same
two things also travel in the container's termination message (:func:`termination_message`,
:func:`read_termination_message`): the file at ``terminationMessagePath``, which the kubelet
copies into the pod's status (``state.terminated.message``) when the container exits, at most
4 KiB. It is the path Kubernetes gives a container's last word (Tekton returns its task results
the same way), it needs no volume, no API access from the pod and no extra object, and it goes
with the pod. The value travels as JSON, not as a pickle: the flow would otherwise run code that
anyone allowed to write a pod's status could put there.

This module imports neither Prefect nor torch: it is what a replica loads first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cloudpickle  # type: ignore[import-untyped]

from kubedl_prefect.errors import FunctionPayloadTooLargeError, KubeDLPrefectError
from kubedl_prefect.spec.types import CHECKPOINT_ENV

__all__ = ["CHECKPOINT_ENV"]  # where the result and the error records go (re-exported)

FUNCTION_FILE_ENV = "KUBEDL_PREFECT_FUNCTION_FILE"
"""The payload as a file (a ``LocalCluster``'s workspace)."""
FUNCTION_DATA_ENV = "KUBEDL_PREFECT_FUNCTION"
"""The payload inline, base64 (a Kubernetes cluster)."""
FUNCTION_SHA256_ENV = "KUBEDL_PREFECT_FUNCTION_SHA256"
"""The payload's SHA-256, hex: a replica refuses any other payload."""
PROCESS_GROUP_ENV = "KUBEDL_PREFECT_PROCESS_GROUP"
"""The torch process group's backend (``gloo``, ``nccl``), ``auto`` or ``none``."""
TERMINATION_MESSAGE_ENV = "KUBEDL_PREFECT_TERMINATION_MESSAGE"
"""Where the container's termination message file is (a Kubernetes cluster): rank 0 writes its
return value there, a replica whose function raised its error record."""
TERMINATION_MESSAGE_PATH = "/kubedl-prefect/termination-log"
"""The ``terminationMessagePath`` a function task's containers get (outside ``/dev``)."""
MAX_TERMINATION_MESSAGE_BYTES = 4096
"""The most a kubelet keeps of a termination message (it cuts the rest): 4 KiB."""

MAX_PAYLOAD_BYTES = 1024 * 1024
"""The largest serialized call (1 MiB): beyond it, ship data as files or an image."""
MAX_INLINE_PAYLOAD_BYTES = 256 * 1024
"""The largest call inline in a Kubernetes job (256 KiB: it is in every role's pod template)."""
RESULT_FILE = "function-result.pkl"
"""Rank 0's return value, pickled, in the checkpoint directory."""
ERROR_PREFIX = "function-error-rank"
"""``function-error-rank<N>.json``: why rank N's function raised."""
EXIT_FUNCTION_RAISED = 1
"""A replica whose function raised exits with this code."""
EXIT_OTHER_RANK_FAILED = 3
"""Rank 0 exits with this code when its function returned but another rank's did not."""


@dataclass(frozen=True)
class Replica:
    """Who this process is in the job, from the operators' environment.

    Attributes:
        rank: Its rank, 0 to ``world_size - 1`` (rank 0 returns the task's result).
        world_size: How many replicas run the function.
        local_rank: Its rank on its node (``0``: one process per pod).
        master_addr: The rendezvous host (rank 0's), if distributed.
        master_port: The rendezvous port, if distributed.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def is_rank_zero(self) -> bool:
        """Whether this is rank 0, whose return value is the task's result."""
        return self.rank == 0


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise KubeDLPrefectError(
            f"${name} is {value!r}, not an integer",
            hint="run the function through its training job, which sets the operators' variables",
        ) from None


def current_replica(environ: Mapping[str, str] | None = None) -> Replica:
    """This replica's place in the job, read from the env contract the operators give.

    The v1 operators (KubeDL, Kubeflow's training operator) set ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT``; Kubeflow Trainer sets ``PET_NODE_RANK``,
    ``PET_NNODES``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` for ``torchrun`` (one process per
    node here). Without either, the process is alone: rank 0 of 1.

    Example:
        >>> current_replica({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        ...                  "MASTER_PORT": "29500"})
        Replica(rank=1, world_size=2, local_rank=0, master_addr='127.0.0.1', master_port=29500)
        >>> current_replica({"PET_NODE_RANK": "1", "PET_NNODES": "3", "PET_MASTER_ADDR": "h",
        ...                  "PET_MASTER_PORT": "29400"}).world_size
        3
        >>> current_replica({})
        Replica(rank=0, world_size=1, local_rank=0, master_addr=None, master_port=None)
    """
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        rank, world = _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1)
    elif "PET_NODE_RANK" in env or "PET_NNODES" in env:
        addr, port = env.get("PET_MASTER_ADDR"), env.get("PET_MASTER_PORT")
        rank, world = _int(env, "PET_NODE_RANK", 0), _int(env, "PET_NNODES", 1)
    else:
        return Replica()
    if not 0 <= rank < world:
        raise KubeDLPrefectError(
            f"rank {rank} is outside a world of {world} replicas",
            hint="run the function through its training job, which sets the operators' variables",
        )
    return Replica(
        rank=rank,
        world_size=world,
        local_rank=_int(env, "LOCAL_RANK", 0),
        master_addr=addr or None,
        master_port=int(port) if port else None,
    )


# -- the call --------------------------------------------------------------------------------

_BY_VALUE_LOCK = threading.Lock()
_INSTALLED = tuple(
    str(Path(p).resolve())
    for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], sys.prefix}
)


def _is_installed(module_name: str) -> bool:
    """Whether ``module_name`` comes from the environment (a replica imports it by name)."""
    if (
        module_name in sys.builtin_module_names
        or module_name.split(".")[0] in sys.stdlib_module_names
    ):
        return True
    module = sys.modules.get(module_name)
    where = getattr(module, "__file__", None)
    if where is None:
        return module is not None  # a namespace or built-in module: importable by name
    return str(Path(where).resolve()).startswith(_INSTALLED)


def dump_call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    limit: int = MAX_PAYLOAD_BYTES,
) -> bytes:
    """The call ``fn(*args, **kwargs)``, serialized with cloudpickle, at most ``limit`` bytes.

    A function whose module is not installed in the environment (a flow file, a project module
    beside it) is serialized by value, with the globals it uses, so the replicas need not find
    its source; one from an installed package is imported by name there.

    Raises:
        FunctionPayloadTooLargeError: The serialized call is larger than ``limit``.
    """
    module = getattr(fn, "__module__", None)
    by_value = (
        module is not None
        and module != "__main__"
        and module in sys.modules
        and not _is_installed(module)
    )
    with _BY_VALUE_LOCK:
        if by_value:
            assert module is not None
            cloudpickle.register_pickle_by_value(sys.modules[module])
        try:
            data: bytes = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
        finally:
            if by_value:
                assert module is not None
                cloudpickle.unregister_pickle_by_value(sys.modules[module])
    if len(data) > limit:
        raise FunctionPayloadTooLargeError(
            f"the call of {getattr(fn, '__qualname__', fn)!r} serializes to {len(data)} bytes, "
            f"more than the {limit} bytes a function task may carry",
            size=len(data),
            limit=limit,
        )
    return data


def digest(data: bytes) -> str:
    """The payload's SHA-256, hex."""
    return hashlib.sha256(data).hexdigest()


def load_call(
    data: bytes, expected: str
) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The function and its arguments from a payload whose SHA-256 is ``expected``.

    The payload is code: it is loaded only when it is the one the decorated call produced.

    Raises:
        KubeDLPrefectError: The payload's digest is not ``expected``, or it is not a call.
    """
    if digest(data) != expected:
        raise KubeDLPrefectError(
            "the function payload is not the one the task produced (its SHA-256 differs): "
            "refusing to run it",
            hint="run the function through its distributed task; do not edit the job's payload",
        )
    call = cloudpickle.loads(data)
    if not (isinstance(call, tuple) and len(call) == 3 and callable(call[0])):
        raise KubeDLPrefectError("the function payload does not hold a call")
    fn, args, kwargs = call
    return fn, tuple(args), dict(kwargs)


def write_payload_file(directory: Path, data: bytes) -> Path:
    """Keep the payload as ``<directory>/<sha256>.pkl`` (owner-only), once; its path."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = directory / f"{digest(data)}.pkl"
    if target.exists() and target.read_bytes() == data:
        return target
    tmp = directory / f".{target.name}.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, target)
    return target


def payload_env(data: bytes, *, file: Path | None) -> dict[str, str]:
    """The variables that carry ``data`` to the replicas: its file, or itself inline."""
    env = {FUNCTION_SHA256_ENV: digest(data)}
    if file is not None:
        env[FUNCTION_FILE_ENV] = str(file)
    else:
        env[FUNCTION_DATA_ENV] = base64.b64encode(data).decode("ascii")
    return env


def read_payload(environ: Mapping[str, str] | None = None) -> tuple[bytes, str]:
    """The payload and its expected SHA-256, from the replica's environment.

    Raises:
        KubeDLPrefectError: No payload in the environment, or no digest beside it.
    """
    env = os.environ if environ is None else environ
    expected = env.get(FUNCTION_SHA256_ENV)
    if not expected:
        raise KubeDLPrefectError(
            f"${FUNCTION_SHA256_ENV} is not set: this process was not started by a function task",
            hint="decorate the function with distributed_task and call it from a flow",
        )
    if env.get(FUNCTION_FILE_ENV):
        return Path(env[FUNCTION_FILE_ENV]).read_bytes(), expected
    if env.get(FUNCTION_DATA_ENV):
        return base64.b64decode(env[FUNCTION_DATA_ENV], validate=True), expected
    raise KubeDLPrefectError(
        f"neither ${FUNCTION_FILE_ENV} nor ${FUNCTION_DATA_ENV} is set: no function to run",
        hint="decorate the function with distributed_task and call it from a flow",
    )


# -- what comes back -------------------------------------------------------------------------


def _write_private(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, target)


def clear_outputs(directory: Path, rank: int) -> None:
    """Remove what an earlier attempt of this rank left (its error record; rank 0: the result)."""
    names = [f"{ERROR_PREFIX}{rank}.json"] + ([RESULT_FILE] if rank == 0 else [])
    for name in names:
        (directory / name).unlink(missing_ok=True)


def write_result(directory: Path, value: Any) -> Path:
    """Rank 0's return value, pickled with cloudpickle, written aside and renamed into place."""
    target = directory / RESULT_FILE
    _write_private(target, cloudpickle.dumps(value))
    return target


def _check_private(path: Path) -> None:
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise KubeDLPrefectError(
            f"refusing to read {path}: it belongs to another user (uid {info.st_uid})",
            hint="the workspace must be yours alone; delete the file and run the task again",
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KubeDLPrefectError(
            f"refusing to read {path}: others may write it (mode {stat.filemode(info.st_mode)})",
            hint="the workspace must be yours alone; delete the file and run the task again",
        )


def read_result(directory: Path) -> Any:
    """Rank 0's return value, as it wrote it.

    Only the flow that ran the job reads it, from the job's own checkpoint directory, and only
    when the file is this user's and nobody else may write it: loading it runs code.

    Raises:
        KubeDLPrefectError: No result there (rank 0 did not finish), or the file is not private.
    """
    target = directory / RESULT_FILE
    if not target.exists():
        raise KubeDLPrefectError(
            f"the job succeeded but rank 0 left no result in {directory}",
            hint="was the checkpoint directory cleaned while the task ran? run it again",
        )
    _check_private(target)
    return cloudpickle.loads(target.read_bytes())


@dataclass(frozen=True)
class ReplicaError:
    """Why one replica's function raised (written by it, read by the flow).

    Attributes:
        rank: The replica's rank.
        error_type: The exception's class (``ValueError``).
        last_line: The traceback's last line (``ValueError: rank 1 refuses``).
        exit_code: The code the replica exits with.
        time: When it was written (seconds since the epoch): the first one is the cause.
    """

    rank: int
    error_type: str
    last_line: str
    exit_code: int = EXIT_FUNCTION_RAISED
    time: float = 0.0

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> ReplicaError:
        """The record of ``exc``, raised on ``rank``."""
        lines = traceback.format_exception_only(type(exc), exc)
        last = lines[-1].strip() if lines else type(exc).__name__
        return cls(rank, type(exc).__name__, last[:1000], EXIT_FUNCTION_RAISED, time.time())


def write_error(directory: Path, error: ReplicaError) -> Path:
    """Leave ``error`` for the flow as ``function-error-rank<N>.json``."""
    target = directory / f"{ERROR_PREFIX}{error.rank}.json"
    _write_private(target, json.dumps(asdict(error)).encode("utf-8"))
    return target


def read_errors(directory: Path) -> list[ReplicaError]:
    """The error records in ``directory``, the first written first (plain JSON: never code)."""
    found: list[ReplicaError] = []
    for path in sorted(directory.glob(f"{ERROR_PREFIX}*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            found.append(
                ReplicaError(
                    rank=int(data["rank"]),
                    error_type=str(data["error_type"]),
                    last_line=str(data["last_line"]),
                    exit_code=int(data.get("exit_code", EXIT_FUNCTION_RAISED)),
                    time=float(data.get("time", 0.0)),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda error: (error.time, error.rank))


# -- the termination message (a Kubernetes cluster) ------------------------------------------


def termination_message(
    *,
    value: Any = None,
    error: ReplicaError | None = None,
    limit: int = MAX_TERMINATION_MESSAGE_BYTES,
) -> str:
    """What a replica leaves in its termination message: rank 0's value, or its error record.

    The value goes as JSON (tuples become lists). One that JSON cannot hold, or that takes more
    than ``limit`` bytes, is replaced by a note saying so, which the flow turns into an error.

    Example:
        >>> termination_message(value={"loss": 0.25, "rank": 0})
        '{"result": {"loss": 0.25, "rank": 0}}'
        >>> termination_message(value="x" * 5000)
        '{"too_large": 5014, "limit": 4096}'
        >>> termination_message(value={1, 2})
        '{"not_json": "set"}'
    """
    if error is not None:
        return json.dumps({"error": asdict(error)})
    try:
        text = json.dumps({"result": value})
    except (TypeError, ValueError):
        return json.dumps({"not_json": type(value).__name__})
    size = len(text.encode("utf-8"))
    if size > limit:
        return json.dumps({"too_large": size, "limit": limit})
    return text


def write_termination_message(path: Path, text: str) -> None:
    """Write ``text`` to the termination message file (the kubelet reads it at exit)."""
    path.write_text(text, encoding="utf-8")


@dataclass(frozen=True)
class TerminationMessage:
    """A replica's termination message, read back by the flow.

    Attributes:
        result: Rank 0's return value (when ``ok``).
        ok: Whether it holds a return value.
        error: The record of a replica whose function raised, if that is what it holds.
    """

    result: Any = None
    ok: bool = False
    error: ReplicaError | None = None


def read_termination_message(text: str, *, where: str) -> TerminationMessage:
    """Parse a termination message written by :func:`termination_message` (JSON, never code).

    Args:
        text: ``state.terminated.message`` of the container.
        where: The pod it comes from, for the errors' messages.

    Raises:
        FunctionPayloadTooLargeError: Rank 0's value was larger than a message may be.
        KubeDLPrefectError: The value was not JSON, or the message is not one of ours.

    Example:
        >>> read_termination_message('{"result": [1, 2]}', where="pod/m-0").result
        [1, 2]
        >>> record = '{"error": {"rank": 1, "error_type": "E", "last_line": "E: no"}}'
        >>> read_termination_message(record, where="pod/w-0").error.rank
        1
    """
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise KubeDLPrefectError(
            f"the termination message of {where} is not a function task's "
            f"({len(text)} characters: {text[:80]!r})",
            hint="something else wrote the container's terminationMessagePath, or the message "
            "was cut at 4 KiB; run the task again",
        )
    if "result" in data:
        return TerminationMessage(result=data["result"], ok=True)
    if "too_large" in data:
        size, limit = int(data["too_large"]), int(data.get("limit", MAX_TERMINATION_MESSAGE_BYTES))
        raise FunctionPayloadTooLargeError(
            f"rank 0's return value takes {size} bytes as JSON ({where}), more than the "
            f"{limit} bytes a pod's termination message may carry",
            size=size,
            limit=limit,
            hint="return a small value (metrics, a path); write large outputs to the checkpoint "
            "directory ($KUBEDL_PREFECT_CHECKPOINT_DIR, on a checkpoint_pvc) or an object store",
        )
    if "not_json" in data:
        raise KubeDLPrefectError(
            f"rank 0's return value is a {data['not_json']}, which cannot come back from a "
            f"Kubernetes pod ({where}): it travels as JSON",
            hint="return numbers, strings, lists and dicts (e.g. float(loss), tensor.tolist())",
        )
    if isinstance(data.get("error"), dict):
        record = data["error"]
        try:
            error = ReplicaError(
                rank=int(record["rank"]),
                error_type=str(record["error_type"]),
                last_line=str(record["last_line"]),
                exit_code=int(record.get("exit_code", EXIT_FUNCTION_RAISED)),
                time=float(record.get("time", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            error = None
        if error is not None:
            return TerminationMessage(error=error)
    raise KubeDLPrefectError(
        f"the termination message of {where} is not a function task's: {text[:80]!r}",
        hint="something else wrote the container's terminationMessagePath; run the task again",
    )
