"""A real MLflow tracking server for tests: SQLite store, loopback, free port, own process group.

``MlflowServer.start(root)`` runs ``mlflow server`` from this virtual environment with

- ``--backend-store-uri sqlite:///<root>/mlflow.db`` (tracking and registry),
- ``--artifacts-destination file://<root>/artifacts`` (the server proxies artifacts: new
  experiments store under ``mlflow-artifacts:/``, which maps to that folder),
- ``--host 127.0.0.1 --port <free> --workers 1`` and ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``
  (two processes, no job runner),

polls ``/health`` until it answers (start-up takes 9-50 s on a small machine) and, on ``stop()``,
ends the whole process group (the CLI and its uvicorn worker): SIGTERM, then SIGKILL. A server
that does not come up raises with the tail of its log; tests never skip.

The ``mlflow_server`` fixture (``tests/unit/registry/conftest.py``, and imported by the integration
tests that need it) starts one per test session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

START_TIMEOUT_S = 180.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class MlflowServer:
    """A running tracking server."""

    process: subprocess.Popen[bytes]
    port: int
    root: Path
    log: Path
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        """The tracking URI (``http://<host>:<port>``, ``127.0.0.1`` unless started elsewhere)."""
        return f"http://{self.host}:{self.port}"

    @property
    def artifact_destination(self) -> str:
        """What ``mlflow-artifacts:/`` stands for on this server."""
        return (self.root / "artifacts").as_uri()

    @classmethod
    def start(
        cls, root: Path, *, host: str = "127.0.0.1", timeout_s: float = START_TIMEOUT_S
    ) -> MlflowServer:
        """Start a server listening on ``host`` (a local address: loopback, or a test bed's
        pod-network gateway, which MLflow's host check then allows too)."""
        root.mkdir(parents=True, exist_ok=True)
        (root / "artifacts").mkdir(exist_ok=True)
        port = free_port(host)
        log = root / "mlflow-server.log"
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [
            str(mlflow),
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            (root / "artifacts").as_uri(),
            "--host",
            host,
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        if host != "127.0.0.1":
            command += ["--allowed-hosts", f"{host},{host}:*,localhost,localhost:*,127.0.0.1:*"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                cwd=root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = cls(process=process, port=port, root=root, log=log, host=host)
        try:
            server._wait_healthy(timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.process.returncode}:\n{self._log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(
            f"mlflow server did not answer /health within {timeout_s:g}s:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """End the server's process group (SIGTERM, then SIGKILL after 10 s)."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # a worker that outlived the CLI


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A tracking server for the whole test session, stopped (by process group) at its end."""
    server = MlflowServer.start(tmp_path_factory.mktemp("mlflow"))
    try:
        yield server
    finally:
        server.stop()
