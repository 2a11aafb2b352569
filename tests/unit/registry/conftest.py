"""Registry tests run against a real MLflow tracking server (tests/support/mlflow_server.py)."""

from __future__ import annotations

import os

from tests.support.mlflow_server import mlflow_server

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

__all__ = ["mlflow_server"]
