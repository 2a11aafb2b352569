"""The MLflow model registry: runs for jobs, versions with lineage, the gate, resolution.

This is the one module that imports MLflow. Its errors are translated here into
:class:`~kubedl_prefect.errors.RegistryError` and its subclasses (chained), so nothing above sees
an ``MlflowException``.

The steps, in the order a train-and-serve flow takes them:

1. :meth:`ModelRegistry.start_run` finds or creates the MLflow run of a logical job (spec name +
   key) and returns the :class:`~kubedl_prefect.spec.handoff.Handoff` to put into the job's
   environment (:func:`~kubedl_prefect.spec.handoff.with_handoff`);
2. :meth:`ModelRegistry.register` registers the model the job handed over as a version with its
   lineage tags, idempotently (a retried step finds the version it made), and waits until it is
   ``READY``;
3. :meth:`ModelRegistry.evaluate` runs the gate and moves the champion alias if the candidate
   is better; :meth:`ModelRegistry.restore_alias` undoes that when serving fails;
4. :meth:`ModelRegistry.resolve` turns ``models:/name@alias`` or ``models:/name/version`` into a
   ``storageUri`` KServe can load, and :meth:`ModelRegistry.check_compatible` refuses a version
   the serving runtime cannot load.

MLflow's client is synchronous, so :class:`ModelRegistry` is the core and
:class:`AsyncModelRegistry` runs the same methods in worker threads: one implementation, two
faces. The registry has no watch API: waiting for a version to become ``READY`` asks again after
a growing pause, on a monotonic deadline.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from mlflow.artifacts import download_artifacts, list_artifacts
from mlflow.entities import LoggedModelStatus
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from kubedl_prefect.errors import ModelVersionNotReadyError, RegistryError, redact_url
from kubedl_prefect.lifecycle.backend import JobOutcome
from kubedl_prefect.lifecycle.records import record_name
from kubedl_prefect.registry import events
from kubedl_prefect.registry.compat import (
    CompatibilityIssue,
    ModelFacts,
    RuntimeProfile,
    refuse_incompatible,
)
from kubedl_prefect.registry.events import ModelVersionCallback, ModelVersionEvent
from kubedl_prefect.registry.gate import (
    TAG_ROLLED_BACK,
    GateDecision,
    GatePolicy,
    judge,
)
from kubedl_prefect.registry.lineage import (
    TAG_KEY,
    TAG_MODEL_ID,
    TAG_OUTPUT_OF,
    TAG_PREFIX,
    TAG_SPEC_NAME,
    Lineage,
    lineage_tags,
    recorded_metrics,
)
from kubedl_prefect.registry.uris import (
    parse_model_uri,
    refuse_user_info,
    runs_uri_refused,
    storage_uri,
)
from kubedl_prefect.spec import TrainingJobSpec, key_hash
from kubedl_prefect.spec.handoff import (
    DEFAULT_MODEL_ARTIFACT,
    Handoff,
    HandoffMode,
    TrackingCredentials,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

TAG_KEY_HASH = f"{TAG_PREFIX}key-hash"
"""On a run: the hash of the logical job's key (what a search filters on; the key may hold
characters a filter string cannot quote)."""

_RETRYABLE_CODES = frozenset(
    {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "ABORTED"}
)
_NOT_FOUND_CODES = frozenset({"RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"})


def registry_error(exc: MlflowException, action: str) -> RegistryError:
    """Translate an MLflow error into ours: retryable when the server failed or was unreachable."""
    code = str(getattr(exc, "error_code", "") or "")
    retryable = code in _RETRYABLE_CODES
    text = str(getattr(exc, "message", None) or exc).splitlines()[0][:500]
    hint = None
    if code in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
        hint = "give this process MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN"
    elif retryable:
        hint = "check that the tracking server is up and reachable from here"
    return RegistryError(
        f"{action} failed: {code or type(exc).__name__}: {text}", hint=hint, retryable=retryable
    )


def _is_missing(exc: MlflowException) -> bool:
    code = str(getattr(exc, "error_code", "") or "")
    text = str(exc)
    return code in _NOT_FOUND_CODES or (code == "INVALID_PARAMETER_VALUE" and "not found" in text)


@dataclass(frozen=True)
class RegisteredVersion:
    """A registered model version made from a job's model.

    Attributes:
        model_name: The registered model.
        version: The version.
        source: Its source (``models:/m-<id>``).
        run_id: The run it was made from.
        model_id: The logged model it was made from.
        status: Its registry status (``READY``).
        tags: Its tags (lineage and metrics included).
        created: ``False`` when an earlier try of the same step had made it already.
    """

    model_name: str
    version: str
    source: str
    run_id: str | None
    model_id: str | None
    status: str
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    created: bool = True

    @property
    def model_uri(self) -> str:
        """``models:/name/version``."""
        return f"models:/{self.model_name}/{self.version}"


@dataclass(frozen=True)
class ResolvedModel:
    """A registry URI resolved to the files of one model and the ``storageUri`` to serve them.

    Attributes:
        model_uri: What was resolved (``models:/name@champion``).
        model_name: The registered model (``None`` for a logged model).
        version: The version (``None`` for a logged model).
        source: The version's source.
        download_uri: Where the registry says the files are.
        storage_uri: Where KServe reads them from.
        model_id: The logged model, when known.
    """

    model_uri: str
    model_name: str | None
    version: str | None
    source: str
    download_uri: str
    storage_uri: str
    model_id: str | None = None


class ModelRegistry:
    """The MLflow tracking server and model registry, as the training-to-serving chain uses them.

    The tracking server's own credentials come from MLflow's usual environment variables in this
    process (``MLFLOW_TRACKING_USERNAME``/``PASSWORD``, ``MLFLOW_TRACKING_TOKEN``); the pods get
    a Secret reference instead (``credentials``).

    Args:
        tracking_uri: The tracking server as this process reaches it.
        registry_uri: The registry's URI when it is not the tracking server.
        pod_tracking_uri: The tracking server as the pods reach it (default: ``tracking_uri``).
        credentials: The Secret the pods read the tracking credentials from.
        artifact_destination: The server's ``--artifacts-destination``, which
            ``mlflow-artifacts:/`` locations stand for.
        storage_rewrites: Prefixes of resolved locations to replace, e.g. where the server's
            artifact store is mounted for the cluster (see
            :func:`~kubedl_prefect.registry.uris.storage_uri`).
        on_event: Called with each :class:`~kubedl_prefect.registry.events.ModelVersionEvent`.
        ready_timeout_s: How long :meth:`register` waits for a version to be ``READY``.

    Raises:
        RegistryError: A tracking or registry URI carries user info (``user:password@``).

    Example:
        >>> registry = ModelRegistry("http://mlflow.ml:5000",
        ...                          artifact_destination="s3://ml-artifacts")
        >>> registry.tracking_uri
        'http://mlflow.ml:5000'
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        registry_uri: str | None = None,
        pod_tracking_uri: str | None = None,
        credentials: TrackingCredentials | None = None,
        artifact_destination: str | None = None,
        storage_rewrites: Mapping[str, str] | None = None,
        on_event: ModelVersionCallback | None = None,
        ready_timeout_s: float = 300.0,
    ):
        refuse_user_info(tracking_uri, "tracking URI")
        if registry_uri is not None:
            refuse_user_info(registry_uri, "registry URI")
        if pod_tracking_uri is not None:
            refuse_user_info(pod_tracking_uri, "tracking URI of the pods")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.pod_tracking_uri = pod_tracking_uri or tracking_uri
        self.credentials = credentials
        self.artifact_destination = artifact_destination
        self.storage_rewrites = dict(storage_rewrites or {})
        self.on_event = on_event
        self.ready_timeout_s = ready_timeout_s
        self._client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)

    def __repr__(self) -> str:
        return f"ModelRegistry({redact_url(self.tracking_uri)!r})"

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except MlflowException as exc:
            raise registry_error(exc, action) from exc

    def _maybe(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """Like :meth:`_call`, ``None`` when the thing does not exist."""
        try:
            return fn(*args, **kwargs)
        except MlflowException as exc:
            if _is_missing(exc):
                return None
            raise registry_error(exc, action) from exc

    def _emit(self, event: ModelVersionEvent) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:
            logger.exception("a model-version event callback raised; it was skipped")

    # -- 1. the handoff ----------------------------------------------------------------------

    def start_run(
        self,
        spec: TrainingJobSpec,
        *,
        key: str,
        experiment: str,
        mode: HandoffMode | str = HandoffMode.RUN,
        model_artifact: str = DEFAULT_MODEL_ARTIFACT,
        model_dir: str | None = None,
    ) -> Handoff:
        """The run of the logical job ``(spec.name, key)``, created on first use, as a handoff.

        Every attempt of one key logs into the same run (a retry resumes from its checkpoint
        and goes on logging), and a replayed step finds the run it created.

        Args:
            spec: The job's spec.
            key: The logical job's key (a flow run, a schedule slot).
            experiment: The experiment's name (created if missing).
            mode: ``run`` (the code logs the model) or ``output`` (it writes it to a location).
            model_artifact: The name rank 0 logs the model under.
            model_dir: In ``output`` mode, the base location; the job writes to
                ``<model_dir>/<spec name>-<key hash>`` (one per logical job, as checkpoints).

        Raises:
            RegistryError: The tracking server refused or could not be reached.
        """
        mode = HandoffMode(mode)
        experiment_id = self._experiment_id(experiment)
        run_name = record_name(spec.name, key)
        hashed = key_hash(key)
        found = self._call(
            "search runs",
            self._client.search_runs,
            [experiment_id],
            filter_string=f"tags.`{TAG_KEY_HASH}` = '{hashed}'",
            order_by=["attributes.start_time ASC"],
        )
        runs = [
            run
            for run in found
            if run.data.tags.get(TAG_KEY) == key and run.data.tags.get(TAG_SPEC_NAME) == spec.name
        ]
        if runs:
            run_id = str(runs[0].info.run_id)
        else:
            run = self._call(
                f"create run {run_name}",
                self._client.create_run,
                experiment_id,
                run_name=run_name,
                tags={TAG_KEY: key, TAG_KEY_HASH: hashed, TAG_SPEC_NAME: spec.name},
            )
            run_id = str(run.info.run_id)
        location = None
        if mode is HandoffMode.OUTPUT:
            if not model_dir:
                raise RegistryError(
                    "output mode needs model_dir, the base location the job writes its model to",
                    hint="pass model_dir= a shared volume path or an s3:// or gs:// prefix",
                )
            location = f"{model_dir.rstrip('/')}/{run_name}"
        return Handoff(
            tracking_uri=self.pod_tracking_uri,
            experiment_id=experiment_id,
            experiment_name=experiment,
            run_id=run_id,
            mode=mode,
            model_artifact=model_artifact,
            model_dir=location,
            credentials=self.credentials,
        )

    def _experiment_id(self, name: str) -> str:
        experiment = self._call("get experiment", self._client.get_experiment_by_name, name)
        if experiment is not None:
            return str(experiment.experiment_id)
        try:
            return str(self._client.create_experiment(name))
        except MlflowException as exc:
            if getattr(exc, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise registry_error(exc, f"create experiment {name}") from exc
        experiment = self._call("get experiment", self._client.get_experiment_by_name, name)
        if experiment is None:
            raise RegistryError(f"experiment {name!r} exists and cannot be read")
        return str(experiment.experiment_id)

    def finish_run(
        self,
        handoff: Handoff,
        outcome: JobOutcome,
        spec: TrainingJobSpec,
        *,
        flow_run_id: str | None = None,
    ) -> None:
        """Record the job's lineage on its run and end the run as the job ended."""
        tags = lineage_tags(Lineage.of(outcome.ref, spec, flow_run_id=flow_run_id))
        for name, value in tags.items():
            self._call("tag run", self._client.set_tag, handoff.run_id, name, value)
        status = "FINISHED" if outcome.succeeded else "FAILED"
        self._call("end run", self._client.set_terminated, handoff.run_id, status)

    # -- 2. registration ---------------------------------------------------------------------

    def register(
        self,
        handoff: Handoff,
        outcome: JobOutcome,
        spec: TrainingJobSpec,
        *,
        model_name: str,
        flow_run_id: str | None = None,
    ) -> RegisteredVersion:
        """Register the model the job handed over as a version of ``model_name``.

        The version carries the lineage tags (job namespace, name, uid, attempt, image, spec
        hash, flow run) and the run's metrics. A retried call finds the version it made (same
        run, same logged model) and returns it with ``created`` false; it never makes a second.
        Waits until the version is ``READY``.

        Raises:
            RegistryError: The job failed, or handed over no model (nothing logged under the
                agreed name, no model directory at the agreed location).
            ModelVersionNotReadyError: The registration failed or did not finish in time.
        """
        if not outcome.succeeded:
            raise RegistryError(
                f"{outcome.ref.kind} {outcome.ref.namespace}/{outcome.ref.name} did not succeed "
                f"({outcome.status.phase}); there is no model to register",
                hint="register only the outcome of a successful job",
            )
        if handoff.mode is HandoffMode.OUTPUT:
            model_id = self._log_output(handoff)
        else:
            model_id = self._logged_model(handoff)
        return self.register_logged_model(
            model_id,
            model_name=model_name,
            run_id=handoff.run_id,
            lineage=Lineage.of(outcome.ref, spec, flow_run_id=flow_run_id),
        )

    def _models_of(self, handoff: Handoff) -> list[Any]:
        """The logged models of the handoff's run with the agreed name."""
        query = f"source_run_id = '{handoff.run_id}' AND name = '{handoff.model_artifact}'"
        return list(
            self._call(
                "search logged models",
                self._client.search_logged_models,
                [handoff.experiment_id],
                filter_string=query,
            )
        )

    def _logged_model(self, handoff: Handoff) -> str:
        models = self._models_of(handoff)
        ready = [m for m in models if m.status == LoggedModelStatus.READY]
        if not ready:
            state = f" (found {', '.join(str(m.status) for m in models)})" if models else ""
            raise RegistryError(
                f"the job logged no model named {handoff.model_artifact!r} into run "
                f"{handoff.run_id}{state}",
                hint="on rank 0, log it into the run of MLFLOW_RUN_ID: mlflow.start_run(), then "
                "mlflow.<flavor>.log_model(model, "
                "name=os.environ['KUBEDL_PREFECT_MODEL_ARTIFACT'])",
            )
        return str(ready[-1].model_id)

    def _log_output(self, handoff: Handoff) -> str:
        """Log the model directory the job wrote as a logged model of its run (once)."""
        assert handoff.model_dir is not None
        models = self._models_of(handoff)
        for model in models:
            if model.tags.get(TAG_OUTPUT_OF) == handoff.run_id and (
                model.status == LoggedModelStatus.READY
            ):
                return str(model.model_id)
        with tempfile.TemporaryDirectory(prefix="kubedl-prefect-model-") as tmp:
            try:
                local = download_artifacts(
                    artifact_uri=handoff.model_dir, dst_path=tmp, tracking_uri=self.tracking_uri
                )
            except (MlflowException, OSError) as exc:
                raise RegistryError(
                    f"cannot read the model directory {handoff.model_dir}: {exc}",
                    hint="the job must save an MLflow model there "
                    "(mlflow.<flavor>.save_model(model, os.environ['KUBEDL_PREFECT_MODEL_DIR'])), "
                    "and this process must be able to read the location",
                ) from exc
            if not (Path(local) / "MLmodel").is_file():
                raise RegistryError(
                    f"{handoff.model_dir} holds no MLflow model (no MLmodel file)",
                    hint="save it with mlflow.<flavor>.save_model(model, path), not as raw files",
                )
            model = self._call(
                "create logged model",
                self._client.create_logged_model,
                handoff.experiment_id,
                name=handoff.model_artifact,
                source_run_id=handoff.run_id,
                tags={TAG_OUTPUT_OF: handoff.run_id},
            )
            model_id = str(model.model_id)
            self._call("log model files", self._client.log_model_artifacts, model_id, local)
        self._call(
            "finalize logged model",
            self._client.finalize_logged_model,
            model_id,
            LoggedModelStatus.READY,
        )
        return model_id

    def register_logged_model(
        self,
        model_id: str,
        *,
        model_name: str,
        run_id: str | None,
        lineage: Lineage | None = None,
    ) -> RegisteredVersion:
        """Register the logged model ``model_id`` as a version of ``model_name``, idempotently.

        Raises:
            ModelVersionNotReadyError: The registration failed or did not finish in time.
        """
        source = f"models:/{model_id}"
        metrics: dict[str, float] = {}
        if run_id:
            run = self._call("get run", self._client.get_run, run_id)
            metrics = {str(k): float(v) for k, v in run.data.metrics.items()}
        tags = lineage_tags(lineage, metrics) if lineage is not None else {}
        tags[TAG_MODEL_ID] = model_id
        existing = self._existing_version(model_name, run_id, source)
        created = existing is None
        if existing is None:
            self._ensure_registered_model(model_name)
            made = self._call(
                f"create a version of {model_name}",
                self._client.create_model_version,
                model_name,
                source,
                run_id=run_id,
                tags=tags,
                await_creation_for=0,
                model_id=model_id,
            )
            existing = self._keep_first(model_name, run_id, source) or made
        else:
            for name, value in tags.items():
                if existing.tags.get(name) != value:
                    self._call(
                        "tag version",
                        self._client.set_model_version_tag,
                        model_name,
                        str(existing.version),
                        name,
                        value,
                    )
        version = str(existing.version)
        self._emit(
            ModelVersionEvent(
                events.REGISTERED,
                model_name,
                version,
                MappingProxyType({"source": source, "created": str(created).lower()}),
            )
        )
        ready = self.wait_ready(model_name, version)
        return RegisteredVersion(
            model_name=model_name,
            version=version,
            source=source,
            run_id=run_id,
            model_id=model_id,
            status=str(ready.status),
            tags=MappingProxyType(dict(ready.tags)),
            created=created,
        )

    def _existing_version(
        self, model_name: str, run_id: str | None, source: str
    ) -> ModelVersion | None:
        if self._maybe("get model", self._client.get_registered_model, model_name) is None:
            return None
        matching = self._versions_of(model_name, run_id, source)
        return min(matching, key=lambda v: int(v.version)) if matching else None

    def _versions_of(self, model_name: str, run_id: str | None, source: str) -> list[ModelVersion]:
        query = f"name = '{_quoted(model_name)}'"
        if run_id:
            query += f" and run_id = '{run_id}'"
        versions = self._call("search versions", self._client.search_model_versions, query)
        return [v for v in versions if v.source == source]

    def _keep_first(self, model_name: str, run_id: str | None, source: str) -> ModelVersion | None:
        """The first version of ``source``, after deleting any later one of the same source.

        MLflow's client sends a request again when its answer was lost, POSTs included: a
        tracking server that died after committing a ``create_model_version`` and before
        answering gets the create twice, and makes two versions of one model. The later ones
        are such copies (or a concurrent registration of the same logical job): they go.
        """
        matching = sorted(
            self._versions_of(model_name, run_id, source), key=lambda v: int(v.version)
        )
        if not matching:
            return None
        first, extra = matching[0], matching[1:]
        for copy in extra:
            try:
                self._client.delete_model_version(model_name, str(copy.version))
            except MlflowException as exc:
                if not _is_missing(exc):
                    raise registry_error(
                        exc, f"delete version {copy.version} of {model_name}, a copy"
                    ) from exc
            logger.warning(
                "deleted version %s of %s: a second copy of version %s (%s), made when the "
                "tracking server got the create again after its answer was lost",
                copy.version,
                model_name,
                first.version,
                source,
            )
        return first

    def _ensure_registered_model(self, name: str) -> None:
        try:
            self._client.create_registered_model(name)
        except MlflowException as exc:
            if getattr(exc, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise registry_error(exc, f"create registered model {name}") from exc

    def wait_ready(
        self, model_name: str, version: str, *, timeout_s: float | None = None
    ) -> ModelVersion:
        """Wait until the version is ``READY``; return it.

        Raises:
            ModelVersionNotReadyError: It failed registration (not retryable), or was still
                pending after ``timeout_s`` (retryable).
        """
        limit = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        pause = 0.1
        while True:
            current = self._call("get version", self._client.get_model_version, model_name, version)
            status = str(current.status)
            if status == "READY":
                self._emit(ModelVersionEvent(events.READY, model_name, version))
                return current
            if status == "FAILED_REGISTRATION":
                raise ModelVersionNotReadyError(
                    f"version {version} of {model_name} failed registration: "
                    f"{current.status_message or 'no message'}",
                    name=model_name,
                    version=version,
                    status=status,
                    hint="check that the tracking server can read the model's artifacts",
                    retryable=False,
                )
            if time.monotonic() + pause > deadline:
                raise ModelVersionNotReadyError(
                    f"version {version} of {model_name} was still {status} after {limit:g}s",
                    name=model_name,
                    version=version,
                    status=status,
                    hint="the registry copies the model's files; retry, or raise the timeout",
                    retryable=True,
                )
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    # -- 3. the gate -------------------------------------------------------------------------

    def evaluate(self, model_name: str, version: str, policy: GatePolicy) -> GateDecision:
        """Judge a candidate version against the champion; promote it if it passes.

        The decision and both values are recorded on the candidate as tags before the alias
        moves, so a retried call returns the recorded decision (re-pointing the alias if the
        first try stopped in between) instead of comparing the new champion with itself.

        Raises:
            RegistryError: The candidate (or the champion) has no value for the metric.
        """
        candidate = self._call("get version", self._client.get_model_version, model_name, version)
        recorded = GateDecision.from_tags(model_name, version, candidate.tags)
        if recorded is not None and (recorded.alias, recorded.metric) == (
            policy.alias,
            policy.metric,
        ):
            if recorded.promoted and candidate.tags.get(TAG_ROLLED_BACK) != "true":
                self._call(
                    "set alias",
                    self._client.set_registered_model_alias,
                    model_name,
                    policy.alias,
                    version,
                )
            return recorded
        candidate_value = self._metric(candidate, policy.metric, "candidate")
        champion = self._maybe(
            "get champion", self._client.get_model_version_by_alias, model_name, policy.alias
        )
        if champion is not None and str(champion.version) == version:
            return GateDecision(
                model_name,
                policy.alias,
                version,
                None,
                policy.metric,
                candidate_value,
                None,
                False,
                f"version {version} already holds the alias {policy.alias}",
            )
        champion_value = (
            self._metric(champion, policy.metric, "champion") if champion is not None else None
        )
        verdict = judge(policy, candidate=candidate_value, champion=champion_value)
        decision = GateDecision(
            model_name=model_name,
            alias=policy.alias,
            candidate_version=version,
            champion_version=str(champion.version) if champion is not None else None,
            metric=policy.metric,
            candidate_value=candidate_value,
            champion_value=champion_value,
            promoted=verdict.promote,
            reason=verdict.reason,
        )
        for name, value in decision.tags().items():
            self._call(
                "record decision",
                self._client.set_model_version_tag,
                model_name,
                version,
                name,
                value,
            )
        if decision.promoted:
            self._call(
                "set alias",
                self._client.set_registered_model_alias,
                model_name,
                policy.alias,
                version,
            )
        self._emit(
            ModelVersionEvent(
                events.PROMOTED if decision.promoted else events.REJECTED,
                model_name,
                version,
                MappingProxyType(decision.tags()),
            )
        )
        return decision

    def _metric(self, version: Any, metric: str, role: str) -> float:
        value = recorded_metrics(version.tags).get(metric)
        if value is None and version.run_id:
            run = self._maybe("get run", self._client.get_run, version.run_id)
            if run is not None and metric in run.data.metrics:
                value = float(run.data.metrics[metric])
        if value is None:
            raise RegistryError(
                f"the {role} (version {version.version} of {version.name}) has no metric "
                f"{metric!r}",
                hint=f"log {metric!r} in the training run (mlflow.log_metric), or gate on a "
                "metric both versions have",
            )
        return value

    def restore_alias(self, decision: GateDecision) -> bool:
        """Undo a promotion: give the alias back to the previous champion (or remove it).

        Only when the alias still points at the candidate (someone else may have moved it
        since). Returns whether the alias was changed.
        """
        if not decision.promoted:
            return False
        name, alias = decision.model_name, decision.alias
        current = self._maybe("get alias", self._client.get_model_version_by_alias, name, alias)
        if current is None or str(current.version) != decision.candidate_version:
            logger.warning(
                "not restoring alias %s of %s: it no longer points at version %s",
                alias,
                name,
                decision.candidate_version,
            )
            return False
        if decision.champion_version is not None:
            self._call(
                "set alias",
                self._client.set_registered_model_alias,
                name,
                alias,
                decision.champion_version,
            )
        else:
            self._call("delete alias", self._client.delete_registered_model_alias, name, alias)
        self._call(
            "tag version",
            self._client.set_model_version_tag,
            name,
            decision.candidate_version,
            TAG_ROLLED_BACK,
            "true",
        )
        self._emit(
            ModelVersionEvent(
                events.ALIAS_RESTORED,
                name,
                decision.candidate_version,
                MappingProxyType(
                    {"alias": alias, "restoredVersion": decision.champion_version or ""}
                ),
            )
        )
        return True

    # -- 4. resolution and compatibility -----------------------------------------------------

    def resolve(self, model_uri: str) -> ResolvedModel:
        """The files of ``model_uri`` and the ``storageUri`` KServe loads them from.

        Raises:
            ModelSourceRefusedError: A ``runs:/`` URI or source, an ``mlflow-artifacts:/``
                location without a configured artifact destination, an unknown scheme.
            RegistryError: The model, version or alias does not exist.
        """
        parsed = parse_model_uri(model_uri)
        if parsed.model_id is not None:
            logged = self._call("get logged model", self._client.get_logged_model, parsed.model_id)
            location = str(logged.artifact_location)
            return ResolvedModel(
                model_uri=model_uri,
                model_name=None,
                version=None,
                source=model_uri,
                download_uri=location,
                storage_uri=self._storage(location),
                model_id=parsed.model_id,
            )
        assert parsed.name is not None
        if parsed.alias is not None:
            found = self._maybe(
                f"resolve {model_uri}",
                self._client.get_model_version_by_alias,
                parsed.name,
                parsed.alias,
            )
        else:
            found = self._maybe(
                f"resolve {model_uri}",
                self._client.get_model_version,
                parsed.name,
                parsed.version,
            )
        if found is None:
            raise RegistryError(
                f"{model_uri} does not exist in the registry",
                hint="check the model name, version or alias (aliases are set by the gate)",
            )
        version = str(found.version)
        source = str(found.source)
        if source.startswith("runs:/"):
            raise runs_uri_refused(source)
        download = str(
            self._call(
                "get download URI",
                self._client.get_model_version_download_uri,
                parsed.name,
                version,
            )
        )
        model_id = found.tags.get(TAG_MODEL_ID) or (
            source.removeprefix("models:/") if source.startswith("models:/m-") else None
        )
        return ResolvedModel(
            model_uri=model_uri,
            model_name=parsed.name,
            version=version,
            source=source,
            download_uri=download,
            storage_uri=self._storage(download),
            model_id=model_id,
        )

    def _storage(self, location: str) -> str:
        return storage_uri(
            location,
            artifact_destination=self.artifact_destination,
            rewrites=self.storage_rewrites,
        )

    def model_facts(self, resolved: ResolvedModel) -> ModelFacts:
        """Read the model's ``MLmodel`` (and, for PyTorch, its file names)."""
        base = resolved.download_uri.rstrip("/")
        with tempfile.TemporaryDirectory(prefix="kubedl-prefect-mlmodel-") as tmp:
            try:
                path = download_artifacts(
                    artifact_uri=f"{base}/MLmodel",
                    dst_path=tmp,
                    tracking_uri=self.tracking_uri,
                )
                text = Path(path).read_text(encoding="utf-8")
            except (MlflowException, OSError) as exc:
                raise RegistryError(
                    f"cannot read the MLmodel file of {resolved.model_uri} at {base}: {exc}",
                    hint="the version's files must be an MLflow model (logged with a flavor)",
                ) from exc
        facts = ModelFacts.from_mlmodel(text)
        pytorch = facts.flavors.get("pytorch")
        if pytorch is not None and pytorch.serialization_format is None:
            data_dir = str(pytorch.conf.get("model_data") or "data")
            try:
                listed = list_artifacts(
                    artifact_uri=f"{base}/{data_dir}", tracking_uri=self.tracking_uri
                )
            except (MlflowException, OSError) as exc:
                raise RegistryError(
                    f"cannot list the files of {resolved.model_uri}: {exc}"
                ) from exc
            names = [f"{data_dir}/{Path(str(info.path)).name}" for info in listed]
            facts = ModelFacts.from_mlmodel(text, files=names)
        return facts

    def check_compatible(
        self, resolved: ResolvedModel, runtime: RuntimeProfile
    ) -> list[CompatibilityIssue]:
        """Refuse a model ``runtime`` cannot load; return the warnings otherwise.

        Raises:
            IncompatibleModelError: Every error found, each with what to change.
        """
        return refuse_incompatible(resolved.model_uri, self.model_facts(resolved), runtime)


def _quoted(value: str) -> str:
    return value.replace("'", "\\'")


class AsyncModelRegistry:
    """The async face of a :class:`ModelRegistry`: the same methods, run in worker threads.

    Args:
        registry: The registry whose methods run.
    """

    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    async def start_run(
        self,
        spec: TrainingJobSpec,
        *,
        key: str,
        experiment: str,
        mode: HandoffMode | str = HandoffMode.RUN,
        model_artifact: str = DEFAULT_MODEL_ARTIFACT,
        model_dir: str | None = None,
    ) -> Handoff:
        """Async :meth:`ModelRegistry.start_run`."""
        return await asyncio.to_thread(
            self.registry.start_run,
            spec,
            key=key,
            experiment=experiment,
            mode=mode,
            model_artifact=model_artifact,
            model_dir=model_dir,
        )

    async def finish_run(
        self,
        handoff: Handoff,
        outcome: JobOutcome,
        spec: TrainingJobSpec,
        *,
        flow_run_id: str | None = None,
    ) -> None:
        """Async :meth:`ModelRegistry.finish_run`."""
        await asyncio.to_thread(
            self.registry.finish_run, handoff, outcome, spec, flow_run_id=flow_run_id
        )

    async def register(
        self,
        handoff: Handoff,
        outcome: JobOutcome,
        spec: TrainingJobSpec,
        *,
        model_name: str,
        flow_run_id: str | None = None,
    ) -> RegisteredVersion:
        """Async :meth:`ModelRegistry.register`."""
        return await asyncio.to_thread(
            self.registry.register,
            handoff,
            outcome,
            spec,
            model_name=model_name,
            flow_run_id=flow_run_id,
        )

    async def register_logged_model(
        self,
        model_id: str,
        *,
        model_name: str,
        run_id: str | None,
        lineage: Lineage | None = None,
    ) -> RegisteredVersion:
        """Async :meth:`ModelRegistry.register_logged_model`."""
        return await asyncio.to_thread(
            self.registry.register_logged_model,
            model_id,
            model_name=model_name,
            run_id=run_id,
            lineage=lineage,
        )

    async def wait_ready(
        self, model_name: str, version: str, *, timeout_s: float | None = None
    ) -> ModelVersion:
        """Async :meth:`ModelRegistry.wait_ready`."""
        return await asyncio.to_thread(
            self.registry.wait_ready, model_name, version, timeout_s=timeout_s
        )

    async def evaluate(self, model_name: str, version: str, policy: GatePolicy) -> GateDecision:
        """Async :meth:`ModelRegistry.evaluate`."""
        return await asyncio.to_thread(self.registry.evaluate, model_name, version, policy)

    async def restore_alias(self, decision: GateDecision) -> bool:
        """Async :meth:`ModelRegistry.restore_alias`."""
        return await asyncio.to_thread(self.registry.restore_alias, decision)

    async def resolve(self, model_uri: str) -> ResolvedModel:
        """Async :meth:`ModelRegistry.resolve`."""
        return await asyncio.to_thread(self.registry.resolve, model_uri)

    async def model_facts(self, resolved: ResolvedModel) -> ModelFacts:
        """Async :meth:`ModelRegistry.model_facts`."""
        return await asyncio.to_thread(self.registry.model_facts, resolved)

    async def check_compatible(
        self, resolved: ResolvedModel, runtime: RuntimeProfile
    ) -> list[CompatibilityIssue]:
        """Async :meth:`ModelRegistry.check_compatible`."""
        return await asyncio.to_thread(self.registry.check_compatible, resolved, runtime)


__all__ = [
    "AsyncModelRegistry",
    "ModelRegistry",
    "RegisteredVersion",
    "ResolvedModel",
    "registry_error",
]
