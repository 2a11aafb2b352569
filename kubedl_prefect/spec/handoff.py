"""The handoff contract between a training job and the model registry: environment variables.

A training job hands its model to the registry in one of two ways (:class:`HandoffMode`):

``run``
    Before submission the registry creates an MLflow run for the logical job (its tracking URI,
    experiment and a run name from the job); every replica gets them through the environment.
    The training code logs its metrics and its model into that run: ``mlflow.start_run()`` reads
    :data:`RUN_ID_ENV` by itself, and rank 0 (:func:`is_rank_zero`) logs the model under the
    name in :data:`MODEL_ARTIFACT_ENV`.
``output``
    The training code writes an MLflow model directory (``mlflow.<flavor>.save_model(path)``)
    to the location in :data:`MODEL_DIR_ENV`; after the job the registry logs that directory as
    a model of the run and registers it.

The variable names are a contract shared by the Kubernetes backend, the embedded local backend,
the example training program and the registry; they live here, in the pure spec layer, so that
each of them (and training code) can import them without MLflow. The MLflow names are MLflow's
own, so that an unmodified ``mlflow`` client in the pod picks them up.

Credentials for the tracking server never travel as literal values: :class:`TrackingCredentials`
names a Kubernetes Secret and its keys, and the pods read them with ``secretKeyRef``.

Example:
    >>> from kubedl_prefect.spec import parse_spec
    >>> spec = parse_spec({"name": "mnist", "image": "busybox", "replicas": {"master": 1}})
    >>> handoff = Handoff(tracking_uri="http://mlflow.ml:5000", experiment_id="7",
    ...                   experiment_name="mnist", run_id="0a1b",
    ...                   credentials=TrackingCredentials("mlflow-auth", username_key="user",
    ...                                                   password_key="password"))
    >>> env = with_handoff(spec, handoff).env
    >>> env[RUN_ID_ENV].value, env[PASSWORD_ENV].secret_key_ref.name
    ('0a1b', 'mlflow-auth')
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final
from urllib.parse import urlsplit

from pydantic import ValidationError

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.kube_types import EnvValue, KeyRef
from kubedl_prefect.spec.model import TrainingJobSpec

TRACKING_URI_ENV: Final = "MLFLOW_TRACKING_URI"
"""The tracking server's URI, as the pods reach it (MLflow's own variable)."""
EXPERIMENT_ID_ENV: Final = "MLFLOW_EXPERIMENT_ID"
"""The experiment of the run (MLflow's own variable)."""
EXPERIMENT_NAME_ENV: Final = "MLFLOW_EXPERIMENT_NAME"
"""The experiment's name (MLflow's own variable)."""
RUN_ID_ENV: Final = "MLFLOW_RUN_ID"
"""The run the training code logs into; ``mlflow.start_run()`` resumes it by itself."""
USERNAME_ENV: Final = "MLFLOW_TRACKING_USERNAME"
"""Basic-auth user for the tracking server, from a Secret (MLflow's own variable)."""
PASSWORD_ENV: Final = "MLFLOW_TRACKING_PASSWORD"
"""Basic-auth password for the tracking server, from a Secret (MLflow's own variable)."""
TOKEN_ENV: Final = "MLFLOW_TRACKING_TOKEN"
"""Bearer token for the tracking server, from a Secret (MLflow's own variable)."""
HANDOFF_MODE_ENV: Final = "KUBEDL_PREFECT_HANDOFF"
"""``run`` (log the model into the run) or ``output`` (write it to :data:`MODEL_DIR_ENV`)."""
MODEL_ARTIFACT_ENV: Final = "KUBEDL_PREFECT_MODEL_ARTIFACT"
"""The name rank 0 logs the model under (``mlflow.<flavor>.log_model(model, name=...)``)."""
MODEL_DIR_ENV: Final = "KUBEDL_PREFECT_MODEL_DIR"
"""In ``output`` mode: where the training code saves the MLflow model directory."""

HANDOFF_ENV_NAMES: Final = frozenset(
    {
        TRACKING_URI_ENV,
        EXPERIMENT_ID_ENV,
        EXPERIMENT_NAME_ENV,
        RUN_ID_ENV,
        USERNAME_ENV,
        PASSWORD_ENV,
        TOKEN_ENV,
        HANDOFF_MODE_ENV,
        MODEL_ARTIFACT_ENV,
        MODEL_DIR_ENV,
    }
)
"""Every variable the handoff sets; a spec that sets one itself is refused."""

DEFAULT_MODEL_ARTIFACT: Final = "model"
"""The default name of the logged model."""


class HandoffMode(StrEnum):
    """How the training code hands its model over."""

    RUN = "run"
    """It logs metrics and the model (rank 0) into the run we created."""
    OUTPUT = "output"
    """It writes an MLflow model directory to :data:`MODEL_DIR_ENV`; we log and register it."""


@dataclass(frozen=True)
class TrackingCredentials:
    """Where the pods read the tracking server's credentials: keys of one Kubernetes Secret.

    Only references reach the pods (``secretKeyRef``); the values are never read here.

    Args:
        secret: The Secret's name, in the job's namespace.
        username_key: Its key holding :data:`USERNAME_ENV`.
        password_key: Its key holding :data:`PASSWORD_ENV`.
        token_key: Its key holding :data:`TOKEN_ENV`.
        extra: Further variables from the same Secret, by variable name: the artifact store's
            credentials, e.g. ``{"AWS_ACCESS_KEY_ID": "access-key"}``.
    """

    secret: str
    username_key: str | None = None
    password_key: str | None = None
    token_key: str | None = None
    extra: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def env(self) -> dict[str, EnvValue]:
        """The variables, each a ``secretKeyRef`` to :attr:`secret`."""
        keys = {USERNAME_ENV: self.username_key, PASSWORD_ENV: self.password_key}
        keys[TOKEN_ENV] = self.token_key
        keys.update(self.extra)
        return {
            name: EnvValue(secret_key_ref=KeyRef(name=self.secret, key=key))
            for name, key in keys.items()
            if key is not None
        }


@dataclass(frozen=True)
class Handoff:
    """What every replica of a job is told about the MLflow run it belongs to.

    Args:
        tracking_uri: The tracking server as the pods reach it (no credentials in it).
        experiment_id: The run's experiment.
        experiment_name: The experiment's name.
        run_id: The run created for the logical job.
        mode: How the model is handed over.
        model_artifact: The name rank 0 logs the model under (``run`` mode).
        model_dir: Where the training code writes the model directory (``output`` mode).
        credentials: The Secret the pods read the tracking credentials from.
    """

    tracking_uri: str
    experiment_id: str
    experiment_name: str
    run_id: str
    mode: HandoffMode = HandoffMode.RUN
    model_artifact: str = DEFAULT_MODEL_ARTIFACT
    model_dir: str | None = None
    credentials: TrackingCredentials | None = None

    def issues(self) -> list[SpecIssue]:
        """What is wrong with this handoff (empty when nothing is)."""
        found: list[SpecIssue] = []
        parts = urlsplit(self.tracking_uri)
        if parts.username is not None or parts.password is not None:
            found.append(
                SpecIssue(
                    "handoff.trackingUri",
                    "the tracking URI carries credentials, which would reach the pods as a "
                    "literal value",
                    "remove user:password@ from the URI and pass TrackingCredentials (a Secret)",
                )
            )
        if not parts.scheme:
            found.append(
                SpecIssue(
                    "handoff.trackingUri",
                    f"{self.tracking_uri!r} is not a URI the pods can reach",
                    "use the tracking server's http(s):// address as seen from the cluster",
                )
            )
        if self.mode is HandoffMode.OUTPUT and not self.model_dir:
            found.append(
                SpecIssue(
                    "handoff.modelDir",
                    "output mode needs the location the training code writes the model to",
                    "set model_dir (a shared volume path, s3:// or gs:// prefix)",
                )
            )
        if self.credentials is not None:
            try:
                self.credentials.env()
            except ValidationError as exc:
                problems = "; ".join(str(error["msg"]) for error in exc.errors())
                found.append(
                    SpecIssue(
                        "handoff.credentials",
                        f"not a Secret reference: {problems}",
                        "give the Secret's name and keys as they are in Kubernetes",
                    )
                )
        return found

    def env(self) -> dict[str, EnvValue]:
        """The environment of every replica: literals for names and ids, refs for secrets."""
        literal = {
            TRACKING_URI_ENV: self.tracking_uri,
            EXPERIMENT_ID_ENV: self.experiment_id,
            EXPERIMENT_NAME_ENV: self.experiment_name,
            RUN_ID_ENV: self.run_id,
            HANDOFF_MODE_ENV: self.mode.value,
            MODEL_ARTIFACT_ENV: self.model_artifact,
        }
        if self.model_dir is not None:
            literal[MODEL_DIR_ENV] = self.model_dir
        env = {name: EnvValue(value=value) for name, value in literal.items()}
        if self.credentials is not None:
            env.update(self.credentials.env())
        return env


def with_handoff(spec: TrainingJobSpec, handoff: Handoff) -> TrainingJobSpec:
    """``spec`` with the handoff's variables added to every replica's environment.

    Raises:
        SpecError: The handoff is invalid, or the spec sets one of its variables itself (at the
            top level or for a role), which would contradict the run the job logs into.
    """
    issues = handoff.issues()
    sources = [("env", spec.env or {})] + [
        (f"replicas.{role.value}.env", role_spec.env or {})
        for role, role_spec in spec.replicas.items()
    ]
    for path, env in sources:
        for name in sorted(HANDOFF_ENV_NAMES & set(env)):
            issues.append(
                SpecIssue(
                    f"{path}.{name}",
                    f"{name} is set by kubedl-prefect from the model handoff",
                    "remove it from env; the registry passes the run's values",
                )
            )
    if issues:
        raise SpecError(issues, source=f"spec {spec.name!r} with its model handoff")
    return spec.model_copy(update={"env": {**(spec.env or {}), **handoff.env()}})


def read_handoff(environ: Mapping[str, str] | None = None) -> Handoff | None:
    """The handoff as training code sees it, from the environment; ``None`` without one.

    Credentials are not part of the result: MLflow reads them from the environment itself.

    Example:
        >>> read_handoff({RUN_ID_ENV: "0a1b", TRACKING_URI_ENV: "http://mlflow:5000",
        ...               EXPERIMENT_ID_ENV: "7", HANDOFF_MODE_ENV: "run"}).run_id
        '0a1b'
        >>> read_handoff({}) is None
        True
    """
    env = os.environ if environ is None else environ
    run_id = env.get(RUN_ID_ENV)
    if not run_id:
        return None
    try:
        mode = HandoffMode(env.get(HANDOFF_MODE_ENV) or HandoffMode.RUN.value)
    except ValueError:
        mode = HandoffMode.RUN
    return Handoff(
        tracking_uri=env.get(TRACKING_URI_ENV, ""),
        experiment_id=env.get(EXPERIMENT_ID_ENV, ""),
        experiment_name=env.get(EXPERIMENT_NAME_ENV, ""),
        run_id=run_id,
        mode=mode,
        model_artifact=env.get(MODEL_ARTIFACT_ENV) or DEFAULT_MODEL_ARTIFACT,
        model_dir=env.get(MODEL_DIR_ENV) or None,
    )


def is_rank_zero(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this replica is the one that logs the model (rank 0 of the job).

    PyTorch (``RANK``), MPI (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``) and TensorFlow
    (``TF_CONFIG``: the chief, or worker 0 when there is no chief) are understood; a process
    with none of them is alone, hence rank 0.

    Example:
        >>> is_rank_zero({"RANK": "0"}), is_rank_zero({"RANK": "2"})
        (True, False)
        >>> is_rank_zero({"TF_CONFIG": '{"cluster": {"worker": ["a", "b"]}, '
        ...                             '"task": {"type": "worker", "index": 1}}'})
        False
    """
    env = os.environ if environ is None else environ
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value) == 0
    tf_config = env.get("TF_CONFIG")
    if tf_config:
        try:
            config = json.loads(tf_config)
            task = config.get("task") or {}
            cluster = config.get("cluster") or {}
        except (ValueError, AttributeError):
            return True
        kind, index = str(task.get("type", "")), int(task.get("index", 0) or 0)
        if kind in ("chief", "master"):
            return index == 0
        has_chief = any(k in cluster for k in ("chief", "master"))
        return kind == "worker" and index == 0 and not has_chief
    return True
