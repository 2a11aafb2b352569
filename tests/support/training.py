"""Stand-ins for the training code of a job, run in the test process with the job's environment.

The test bed's pods run no code (kwok), so the tests play rank 0 here: with the environment the
handoff put into the rendered job (:func:`job_environment`), they call MLflow exactly as the
documented training program does, through ``mlflow.start_run()`` and ``MLFLOW_RUN_ID``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import mlflow
import numpy as np
from sklearn.linear_model import LogisticRegression

from kubedl_prefect.spec import TrainingJobSpec
from kubedl_prefect.spec.handoff import (
    MODEL_ARTIFACT_ENV,
    MODEL_DIR_ENV,
    is_rank_zero,
)


def job_environment(spec: TrainingJobSpec) -> dict[str, str]:
    """The literal environment variables every replica of ``spec`` gets (references left out)."""
    return {name: value.value for name, value in (spec.env or {}).items() if value.value}


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` (and MLflow's tracking URI) for the block.

    MLflow's own advice while logging (an ``Any`` type hint in its sklearn wrapper) is silenced
    here: it is about MLflow's code, and the tests turn warnings into errors.
    """
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    if "MLFLOW_TRACKING_URI" in values:
        mlflow.set_tracking_uri(values["MLFLOW_TRACKING_URI"])
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*type hint is inferred as AnyType")
            yield
    finally:
        if "MLFLOW_TRACKING_URI" in values:
            # Back to the environment's: a URI left set outlives this block (a later test of
            # the worker loaded a model from a relay that was gone, "model not found").
            mlflow.set_tracking_uri(None)
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def fitted_model() -> LogisticRegression:
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    return LogisticRegression().fit(x, np.array([0, 0, 1, 1]))


def train_and_log(
    env: Mapping[str, str], *, accuracy: float, serialization_format: str = "pickle"
) -> Any:
    """What rank 0 of the example program does: log metrics and the model into the job's run."""
    with environment({**env, "RANK": "0"}):
        assert is_rank_zero()
        with mlflow.start_run() as run:  # resumes MLFLOW_RUN_ID
            mlflow.log_metric("accuracy", accuracy)
            mlflow.log_metric("loss", 1.0 - accuracy)
            info = mlflow.sklearn.log_model(
                fitted_model(),
                name=os.environ[MODEL_ARTIFACT_ENV],
                serialization_format=serialization_format,
                pip_requirements=["scikit-learn"],
            )
        assert run.info.run_id == env["MLFLOW_RUN_ID"]
        return info


def train_and_save(env: Mapping[str, str], *, accuracy: float) -> None:
    """The ``output`` handoff: log metrics, save the model directory where the job was told."""
    with environment(env):
        with mlflow.start_run():
            mlflow.log_metric("accuracy", accuracy)
        mlflow.sklearn.save_model(
            fitted_model(),
            os.environ[MODEL_DIR_ENV],
            serialization_format="pickle",
            pip_requirements=["scikit-learn"],
        )
