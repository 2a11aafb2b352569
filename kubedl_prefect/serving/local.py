"""Local serving: a registered model version behind a real model server on 127.0.0.1.

The local twin of a KServe predictor for ``mlflow`` models: the same server KServe's
``kserve-mlserver`` runtime runs, `MLServer <https://mlserver.readthedocs.io>`_ with its MLflow
runtime, speaking the same V2 inference protocol (``POST /v2/models/<name>/infer``), started as a
process of this machine. :func:`serve_locally` starts it on free loopback ports, waits until the
model is ready and returns a :class:`LocalModelServer`; :meth:`LocalModelServer.predict` asks it
for one prediction and :meth:`LocalModelServer.stop` ends its whole process tree.

The server lives in an environment of its own, as on a cluster it lives in an image of its own:
MLServer 1.7 pins ``fastapi<0.116`` and ``protobuf<7``, which the Prefect of this project's lock
exceeds, so it cannot share the library's environment. The environment holds exactly
``mlserver-requirements.txt`` (next to this module: MLServer, its MLflow runtime, and the MLflow
and torch of this project's lock, which the model's flavour needs to load); it is built once by
:func:`install_server_environment` (with ``uv``; seconds when uv's cache holds the wheels) under
``~/.cache/kubedl-prefect/mlserver/<digest of the file>``.

This package does not import MLflow: the server resolves the model URI itself (``models:/name/3``,
``models:/name@champion``, ``runs:/``, a local path), reading the registry at ``tracking_uri``,
exactly as the MLflow runtime does in a KServe pod from a storage URI.

Example:
    Serve version 1 of ``ddp-spirals`` and ask for one prediction::

        from kubedl_prefect.serving.local import install_server_environment, serve_locally

        install_server_environment()  # once per machine (seconds when cached)
        with serve_locally("models:/ddp-spirals/1", tracking_uri="http://127.0.0.1:5000") as server:
            print(server.predict([[0.0, 0.1], [0.5, -0.5]])["outputs"][0]["data"])
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import httpx
import psutil

from kubedl_prefect.errors import LocalServerError, redact_url

__all__ = [
    "MLSERVER_REQUIREMENTS",
    "LocalModelServer",
    "install_server_environment",
    "serve_locally",
    "server_environment",
    "uv_executable",
    "v2_request",
]

MLSERVER_REQUIREMENTS: Final = Path(__file__).with_name("mlserver-requirements.txt")
"""The pinned content of the model server's environment."""

ENVIRONMENT_VARIABLE: Final = "KUBEDL_PREFECT_MLSERVER_ENV"
"""Names the server environment's directory, instead of the default under the user's cache."""

READY_TIMEOUT_S: Final = 180.0
"""Start-up to a loaded model: 20-40 s on a 2-core machine (MLServer, then torch, then the
model's download from the tracking server); generous, as a cold disk cache doubles it."""

_INSTALLED_MARKER: Final = ".kubedl-prefect-installed"
_CALLER_ENVIRONMENT: Final = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
_MODEL_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


def _requirements_digest(requirements: Path) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]


def server_environment(requirements: Path = MLSERVER_REQUIREMENTS) -> Path:
    """Where the model server's environment lives (it may not be installed yet).

    ``$KUBEDL_PREFECT_MLSERVER_ENV`` when set, else
    ``~/.cache/kubedl-prefect/mlserver/<first 12 hex digits of the requirements' SHA-256>``: a
    change of the pins gets a fresh environment, and an unchanged file reuses the old one.

    Example:
        >>> home = server_environment()
        >>> home.parent.name == "mlserver" or ENVIRONMENT_VARIABLE in os.environ
        True
    """
    named = os.environ.get(ENVIRONMENT_VARIABLE)
    if named:
        return Path(named).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kubedl-prefect" / "mlserver" / _requirements_digest(requirements)


def _mlserver(environment: Path) -> Path:
    return environment / "bin" / "mlserver"


def _installed(environment: Path, requirements: Path) -> bool:
    marker = environment / _INSTALLED_MARKER
    return (
        _mlserver(environment).exists()
        and marker.exists()
        and marker.read_text(encoding="utf-8").strip() == _requirements_digest(requirements)
    )


def uv_executable() -> str | None:
    """The ``uv`` executable: on ``PATH``, else the one the ``local-serving`` extra installed.

    The extra's ``uv`` package puts its binary in this environment's scripts folder, which is not
    on ``PATH`` when the interpreter is run by its path (``.venv/bin/python``, a worker).
    """
    found = shutil.which("uv")
    if found is not None:
        return found
    try:
        import uv  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    try:
        return str(uv.find_uv_bin())
    except FileNotFoundError:
        return None


def install_server_environment(
    environment: Path | None = None,
    *,
    requirements: Path = MLSERVER_REQUIREMENTS,
    uv: str | None = None,
    python: str | None = None,
) -> Path:
    """Build the model server's environment if it is not there yet; return its directory.

    Idempotent and safe to call from several processes at once (a file lock); an environment
    whose build was interrupted is built again. It runs ``uv venv`` and ``uv pip install -r
    <requirements>``: on a machine whose uv cache holds torch (the ``torch`` extra of this
    project), about 3 s; cold, the download of MLServer and its dependencies comes on top.

    Args:
        environment: The directory (default: :func:`server_environment`).
        requirements: The pinned requirements file (default: :data:`MLSERVER_REQUIREMENTS`).
        uv: The ``uv`` executable (default: :func:`uv_executable`).
        python: The interpreter to base it on (default: this one's version, ``3.X``).

    Raises:
        LocalServerError: uv is missing or the installation failed (with uv's output).

    Example:
        >>> install_server_environment().joinpath("bin", "mlserver").exists()  # doctest: +SKIP
        True
    """
    target = environment or server_environment(requirements)
    if _installed(target, requirements):
        return target
    uv = uv or uv_executable()
    if uv is None:
        raise LocalServerError(
            "cannot build the local model server's environment: uv is neither on PATH nor "
            "installed in this environment",
            hint="install the extra (`pip install 'kubedl-prefect[local-serving]'`), or build "
            "the environment from "
            f"{requirements} yourself and point ${ENVIRONMENT_VARIABLE} at it",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(target, requirements):
            return target
        shutil.rmtree(target, ignore_errors=True)
        interpreter = python or f"{sys.version_info.major}.{sys.version_info.minor}"
        steps = [
            [uv, "venv", "--quiet", "--python", interpreter, str(target)],
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                str(target / "bin" / "python"),
                "--requirements",
                str(requirements),
            ],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise LocalServerError(
                    f"building the local model server's environment failed: {' '.join(step[1:3])}"
                    f" exited with {done.returncode}",
                    log_tail=done.stderr[-4000:],
                    hint=f"uv said:\n{done.stderr[-2000:]}",
                )
        (target / _INSTALLED_MARKER).write_text(
            _requirements_digest(requirements) + "\n", encoding="utf-8"
        )
    return target


def v2_request(payload: Any, *, name: str = "input-0") -> dict[str, Any]:
    """A V2 inference request from rows of numbers; a request already in V2 shape is kept.

    Args:
        payload: A ``{"inputs": [...]}`` request, or a 2-D sequence of numbers (one row per
            example), sent as one ``FP32`` tensor, or an object with ``tolist()`` (numpy).
        name: The tensor's name, for rows.

    Raises:
        LocalServerError: Rows that are empty, ragged or not numbers.

    Example:
        >>> v2_request([[0.0, 0.1], [0.5, -0.5]])["inputs"][0]["shape"]
        [2, 2]
        >>> v2_request({"inputs": []})
        {'inputs': []}
    """
    if isinstance(payload, Mapping) and "inputs" in payload:
        return dict(payload)
    rows = payload.tolist() if hasattr(payload, "tolist") else payload
    if not isinstance(rows, Sequence) or not rows or isinstance(rows, str | bytes):
        raise LocalServerError(
            "a prediction needs rows of numbers or a V2 request ({'inputs': [...]})"
        )
    matrix = [list(row) if isinstance(row, Sequence) else [row] for row in rows]
    width = len(matrix[0])
    if width == 0 or any(len(row) != width for row in matrix):
        raise LocalServerError("the rows of a prediction must all have the same, non-zero length")
    try:
        data = [float(value) for row in matrix for value in row]
    except (TypeError, ValueError) as exc:
        raise LocalServerError(f"a prediction's rows must be numbers: {exc}") from exc
    return {
        "inputs": [{"name": name, "shape": [len(matrix), width], "datatype": "FP32", "data": data}]
    }


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class LocalModelServer:
    """A running local model server (MLServer, MLflow runtime) serving one model.

    Made by :func:`serve_locally`. A context manager: leaving the block stops it.

    Attributes:
        name: The model's name on the server (the V2 ``/v2/models/<name>``).
        model_uri: What it serves.
        url: ``http://127.0.0.1:<port>``.
        process: The server process (its own process group).
        workdir: Its settings and ``mlserver.log``.
    """

    name: str
    model_uri: str
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path
    _owns_workdir: bool = field(default=False, repr=False)
    _client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60.0), repr=False)

    @property
    def infer_url(self) -> str:
        """The V2 inference endpoint of the model."""
        return f"{self.url}/v2/models/{self.name}/infer"

    @property
    def log_path(self) -> Path:
        """The server's output (stdout and stderr)."""
        return self.workdir / "mlserver.log"

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def running(self) -> bool:
        """Whether the server process is still there."""
        return self.process.poll() is None

    def ready(self) -> bool:
        """Whether the model is loaded and answers (``GET /v2/models/<name>/ready`` is 200)."""
        try:
            answer = self._client.get(f"{self.url}/v2/models/{self.name}/ready", timeout=5.0)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    def metadata(self) -> dict[str, Any]:
        """The model's V2 metadata (its inputs and outputs, from the MLflow signature)."""
        return self._get(f"{self.url}/v2/models/{self.name}")

    def _get(self, url: str) -> dict[str, Any]:
        try:
            answer = self._client.get(url)
        except httpx.HTTPError as exc:
            raise LocalServerError(f"the local model server did not answer: {exc}") from exc
        return self._json(answer)

    def _json(self, answer: httpx.Response) -> dict[str, Any]:
        if answer.status_code != 200:
            raise LocalServerError(
                f"the local model server answered {answer.status_code}: {answer.text[:1000]}",
                log_tail=_tail(self.log_path),
            )
        body = answer.json()
        if not isinstance(body, dict):
            raise LocalServerError(f"the local model server answered a non-object: {body!r:.200}")
        return body

    def predict(self, payload: Any) -> dict[str, Any]:
        """One prediction: the V2 response (``{"outputs": [{"name", "shape", "data"...}]}``).

        Args:
            payload: A V2 request, or rows of numbers (see :func:`v2_request`).

        Raises:
            LocalServerError: The server is gone, or answered with an error (with its message).
        """
        request = v2_request(payload)
        if not self.running():
            raise LocalServerError(
                f"the local model server of {self.model_uri} has exited "
                f"(code {self.process.returncode})",
                log_tail=_tail(self.log_path),
            )
        try:
            answer = self._client.post(self.infer_url, json=request)
        except httpx.HTTPError as exc:
            raise LocalServerError(f"the local model server did not answer: {exc}") from exc
        return self._json(answer)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the server and every process below it; idempotent.

        SIGTERM to its process group (MLServer shuts down cleanly in about 3 s), SIGKILL to
        what is left after ``grace_s``; it returns once none of them is left.
        """
        self._client.close()
        try:
            tree = [psutil.Process(self.process.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
        _, alive = psutil.wait_procs(tree, timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive, timeout=5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalModelServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def serve_locally(
    model_uri: str,
    *,
    tracking_uri: str,
    name: str = "model",
    environment: Path | None = None,
    workdir: Path | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> LocalModelServer:
    """Serve ``model_uri`` with MLServer's MLflow runtime on 127.0.0.1; return once it is ready.

    The server reads the model from the MLflow registry at ``tracking_uri`` (its own MLflow
    client resolves ``models:/`` URIs), listens on free loopback ports (HTTP, gRPC, metrics) and
    runs in its own process group; its output goes to ``<workdir>/mlserver.log``.

    Args:
        model_uri: ``models:/<name>/<version>``, ``models:/<name>@<alias>``, ``runs:/...`` or a
            local model directory.
        tracking_uri: The MLflow tracking server holding the registry.
        name: The model's name on the server (``/v2/models/<name>/infer``): DNS-1123, as
            KServe's InferenceService name.
        environment: The server's environment (default: :func:`server_environment`); build it
            with :func:`install_server_environment`.
        workdir: Where its settings and log go (default: a temporary directory, removed by
            :meth:`LocalModelServer.stop`).
        env: Extra environment variables of the server (MLflow credentials:
            ``MLFLOW_TRACKING_TOKEN``...). The caller's virtual environment is not passed on.
        ready_timeout_s: How long to wait for the model to be loaded and ready.

    Raises:
        LocalServerError: The environment is not installed, the server exited or was not ready
            in time (with the tail of its log); nothing is left running then.

    Example:
        Names are checked before anything starts:

        >>> try:
        ...     serve_locally("models:/fraud/1", tracking_uri="http://127.0.0.1:5000", name="Fraud")
        ... except LocalServerError as error:
        ...     print(error.message)
        the served model's name 'Fraud' is not a DNS-1123 label
    """
    if not _MODEL_NAME.match(name) or len(name) > 63:
        raise LocalServerError(
            f"the served model's name {name!r} is not a DNS-1123 label",
            hint="lower-case letters, digits and '-', at most 63, as an InferenceService name",
        )
    home = environment or server_environment()
    mlserver = _mlserver(home)
    if not mlserver.exists():
        raise LocalServerError(
            f"the local model server is not installed (no {mlserver})",
            hint="call kubedl_prefect.serving.local.install_server_environment() once "
            "(scripts/install does), or point $KUBEDL_PREFECT_MLSERVER_ENV at an environment "
            f"built from {MLSERVER_REQUIREMENTS.name}",
        )
    owns = workdir is None
    folder = Path(workdir or tempfile.mkdtemp(prefix="kubedl-prefect-serve-"))
    folder.mkdir(parents=True, exist_ok=True)
    http_port, grpc_port, metrics_port = _free_ports(3)
    settings = {
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        # The model in the server's own process: one torch import, one copy of the model.
        "parallel_workers": 0,
    }
    model_settings = {
        "name": name,
        "implementation": "mlserver_mlflow.MLflowRuntime",
        "parameters": {"uri": model_uri},
    }
    (folder / "settings.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    (folder / "model-settings.json").write_text(
        json.dumps(model_settings, indent=2), encoding="utf-8"
    )
    child_env = {k: v for k, v in os.environ.items() if k not in _CALLER_ENVIRONMENT}
    child_env.update(
        {
            "MLFLOW_TRACKING_URI": tracking_uri,
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "PATH": f"{home / 'bin'}{os.pathsep}{child_env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
    )
    log_path = folder / "mlserver.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(mlserver), "start", str(folder)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env=child_env,
            start_new_session=True,
        )
    server = LocalModelServer(
        name=name,
        model_uri=model_uri,
        url=f"http://127.0.0.1:{http_port}",
        process=process,
        workdir=folder,
        _owns_workdir=owns,
    )
    deadline = time.monotonic() + ready_timeout_s
    pause = 0.1
    while not server.ready():
        problem = None
        if not server.running():
            problem = f"exited with code {process.returncode} before the model was ready"
        elif time.monotonic() > deadline:
            problem = f"was not ready after {ready_timeout_s:.0f} s"
        if problem is not None:
            tail = _tail(log_path)
            server._owns_workdir = False  # keep the log for the message's reader
            server.stop()
            raise LocalServerError(
                f"the local model server of {model_uri} (tracking {redact_url(tracking_uri)}) "
                f"{problem}; its log ({log_path}) ends with:\n{tail}",
                log_tail=tail,
                hint="a model the server cannot load (format, missing package) or a registry "
                "it cannot reach shows in that log",
            )
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
    return server
