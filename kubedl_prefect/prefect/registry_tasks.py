"""Prefect tasks for the model registry, each with an async twin named with an ``a`` in front.

From a training run to a version worth serving, in the order a train-and-serve flow takes them:

========================================  ==========================================
sync                                      async
========================================  ==========================================
:func:`start_model_run`                   :func:`astart_model_run`
:func:`register_model`                    :func:`aregister_model`
:func:`resolve_model_version`             :func:`aresolve_model_version`
:func:`gate_model_version`                :func:`agate_model_version`
========================================  ==========================================

``start_model_run`` finds or creates the MLflow run of the logical job (spec name + key) and
returns the :class:`~kubedl_prefect.spec.handoff.Handoff` that goes into the job's environment
(:func:`~kubedl_prefect.spec.handoff.with_handoff`); ``register_model`` registers the model the
job handed over, with its lineage, idempotently (a retried task finds the version it made) and
waits until it is ``READY``; ``resolve_model_version`` turns the version into the ``storageUri``
KServe loads and refuses one the serving runtime cannot load; ``gate_model_version`` judges the
candidate against the champion alias and promotes it when it is better.

Every task takes the :class:`~kubedl_prefect.prefect.model_blocks.MlflowRegistry` block (or the
name it was saved under), emits the registry's ``kubedl.model-version.*`` events with the training
job as a related resource, and retries (twice) only what is retryable: a tracking server that
was down, a version still pending after its wait.
"""

from __future__ import annotations

from typing import Any

from prefect import task

from kubedl_prefect.lifecycle.backend import JobOutcome
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.prefect.artifacts import (
    mlflow_run_link,
    model_version_link,
    registration_markdown,
)
from kubedl_prefect.prefect.chain import (
    TASK_OPTIONS,
    model_version_sender,
    write_link,
    write_markdown,
)
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import training_job_related
from kubedl_prefect.prefect.model_blocks import MlflowRegistry, aregistry_block
from kubedl_prefect.prefect.results import TrainingResult
from kubedl_prefect.prefect.sync import run_in_caller_context
from kubedl_prefect.registry.compat import KSERVE_MLSERVER, RuntimeProfile
from kubedl_prefect.registry.gate import GateDecision, GatePolicy
from kubedl_prefect.registry.lineage import TAG_JOB_NAME, TAG_JOB_UID
from kubedl_prefect.registry.mlflow_registry import (
    AsyncModelRegistry,
    RegisteredVersion,
    ResolvedModel,
)
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from kubedl_prefect.spec.handoff import DEFAULT_MODEL_ARTIFACT, Handoff, HandoffMode

RegistryRef = MlflowRegistry | str
"""A registry block, or the name it was saved under."""


def as_spec(spec: TrainingJobSpec | dict[str, Any]) -> TrainingJobSpec:
    """The typed spec of a spec or its fields.

    Example:
        >>> as_spec({"name": "mnist", "image": "busybox", "replicas": {"master": 1}}).name
        'mnist'
    """
    if isinstance(spec, TrainingJobSpec):
        return spec
    return parse_spec(spec, source="the task's spec")


def job_outcome(result: TrainingResult) -> JobOutcome:
    """The lifecycle outcome a training task's result stands for (what registration reads).

    Example:
        >>> from kubedl_prefect.prefect.results import TrainingResult
        >>> ref = {"backend": "kubernetes", "cluster": "https://k:6443", "dialect": "kubedl",
        ...        "namespace": "ml", "name": "mnist-x-a1", "uid": "u1",
        ...        "apiVersion": "training.kubedl.io/v1alpha1", "kind": "PyTorchJob",
        ...        "key": "k", "attempt": 1, "specHash": "ab"}
        >>> job_outcome(TrainingResult(spec_name="mnist", key="k", phase="Succeeded",
        ...                            ref=ref)).succeeded
        True
    """
    phase = Phase.SUCCEEDED if result.succeeded else Phase.FAILED
    return JobOutcome(
        result.job_ref, JobStatus(phase=phase, reason=result.phase), replayed=result.replayed
    )


def version_related(version: RegisteredVersion) -> list[dict[str, str]]:
    """The training job a version came from (its lineage tags), as a related resource."""
    return training_job_related(version.tags.get(TAG_JOB_UID), version.tags.get(TAG_JOB_NAME))


# -- one implementation each, as coroutines -------------------------------------------------


async def _start_model_run(
    registry: RegistryRef,
    spec: TrainingJobSpec | dict[str, Any],
    key: str,
    experiment: str | None,
    mode: str,
    model_artifact: str,
    model_dir: str | None,
) -> Handoff:
    block = await aregistry_block(registry)
    typed = as_spec(spec)
    client = AsyncModelRegistry(block.registry())
    return await client.start_run(
        typed,
        key=key,
        experiment=experiment or block.experiment or typed.name,
        mode=HandoffMode(mode),
        model_artifact=model_artifact,
        model_dir=model_dir,
    )


async def _register_model(
    registry: RegistryRef,
    handoff: Handoff,
    result: TrainingResult,
    spec: TrainingJobSpec | dict[str, Any],
    model_name: str,
) -> RegisteredVersion:
    ctx = RunContext.capture()
    block = await aregistry_block(registry)
    typed = as_spec(spec)
    outcome = job_outcome(result)
    related = ctx.related() + training_job_related(outcome.ref.uid, outcome.ref.name)
    client = AsyncModelRegistry(block.registry(on_event=model_version_sender(ctx, related)))
    flow_run_id = str(ctx.flow_run_id) if ctx.flow_run_id is not None else None
    await client.finish_run(handoff, outcome, typed, flow_run_id=flow_run_id)
    version = await client.register(
        handoff, outcome, typed, model_name=model_name, flow_run_id=flow_run_id
    )
    ctx.logger.info(
        "%s version %s of %s (%s)",
        "registered" if version.created else "found",
        version.version,
        model_name,
        version.source,
    )
    await write_markdown(
        ctx,
        model_name,
        "registration",
        registration_markdown(version),
        f"Registration of `{model_name}` version {version.version}",
    )
    await write_link(
        ctx,
        model_name,
        "mlflow-run",
        mlflow_run_link(block.tracking_uri, version.run_id),
        f"MLflow run {version.run_id}",
        f"The MLflow run that trained `{model_name}` version {version.version}",
    )
    await write_link(
        ctx,
        model_name,
        "model-version",
        model_version_link(block.tracking_uri, model_name, version.version),
        f"{model_name} version {version.version}",
        f"`{model_name}` version {version.version} in the MLflow model registry",
    )
    return version


async def _resolve_model_version(
    registry: RegistryRef, model: RegisteredVersion | str, runtime: RuntimeProfile | None
) -> ResolvedModel:
    ctx = RunContext.capture()
    block = await aregistry_block(registry)
    client = AsyncModelRegistry(block.registry())
    uri = model.model_uri if isinstance(model, RegisteredVersion) else model
    resolved = await client.resolve(uri)
    if runtime is not None:
        for warning in await client.check_compatible(resolved, runtime):
            ctx.logger.warning("%s on %s: %s", uri, runtime.name, warning)
    ctx.logger.info("%s is served from %s", uri, resolved.storage_uri)
    return resolved


async def _gate_model_version(
    registry: RegistryRef, version: RegisteredVersion, policy: GatePolicy
) -> GateDecision:
    ctx = RunContext.capture()
    block = await aregistry_block(registry)
    related = ctx.related() + version_related(version)
    client = AsyncModelRegistry(block.registry(on_event=model_version_sender(ctx, related)))
    decision = await client.evaluate(version.model_name, version.version, policy)
    ctx.logger.info(
        "version %s of %s %s: %s",
        version.version,
        version.model_name,
        "promoted" if decision.promoted else "not promoted",
        decision.reason,
    )
    await write_markdown(
        ctx,
        version.model_name,
        "registration",
        registration_markdown(version, decision),
        f"Registration and gate of `{version.model_name}` version {version.version}",
    )
    return decision


# -- the tasks -------------------------------------------------------------------------------


@task(name="start-model-run", **TASK_OPTIONS)
def start_model_run(
    registry: RegistryRef,
    spec: TrainingJobSpec | dict[str, Any],
    key: str,
    experiment: str | None = None,
    mode: str = "run",
    model_artifact: str = DEFAULT_MODEL_ARTIFACT,
    model_dir: str | None = None,
) -> Handoff:
    """Find or create the MLflow run of the logical job ``(spec name, key)``; return the handoff.

    Every attempt of one key logs into the same run, and a retried task finds the run it made.
    Put the handoff into the job's spec with
    :func:`~kubedl_prefect.spec.handoff.with_handoff` before training.

    Args:
        registry: The registry block (or its name).
        spec: The job's spec (or its fields).
        key: The logical job's key: the one the training task gets.
        experiment: The experiment (default: the block's, else the spec's name).
        mode: ``run`` (the code logs the model) or ``output`` (it writes it to ``model_dir``).
        model_artifact: The name rank 0 logs the model under.
        model_dir: In ``output`` mode, the base location the job writes its model under.

    Raises:
        RegistryError: The tracking server refused or could not be reached.

    Example:
        ::

            handoff = start_model_run("mlflow", spec, key="nightly-2026-12-01")
            job = TrainingJob(spec=spec_to_data(with_handoff(spec, handoff)), cluster=cluster)
            result = run_training_job(job, key="nightly-2026-12-01")
    """
    return run_in_caller_context(
        lambda: _start_model_run(registry, spec, key, experiment, mode, model_artifact, model_dir)
    )


@task(name="start-model-run", **TASK_OPTIONS)
async def astart_model_run(
    registry: RegistryRef,
    spec: TrainingJobSpec | dict[str, Any],
    key: str,
    experiment: str | None = None,
    mode: str = "run",
    model_artifact: str = DEFAULT_MODEL_ARTIFACT,
    model_dir: str | None = None,
) -> Handoff:
    """Async :func:`start_model_run`."""
    return await _start_model_run(registry, spec, key, experiment, mode, model_artifact, model_dir)


@task(name="register-model", **TASK_OPTIONS)
def register_model(
    registry: RegistryRef,
    handoff: Handoff,
    result: TrainingResult,
    spec: TrainingJobSpec | dict[str, Any],
    model_name: str,
) -> RegisteredVersion:
    """Register the model a finished training job handed over as a version of ``model_name``.

    Records the job's lineage on its run and ends the run as the job ended, then registers the
    model (logged into the run, or written to the output location) with the lineage tags (job
    namespace, name, uid, attempt, image, spec hash, flow run) and the run's metrics. A retried
    task finds the version it made (``created`` false), never a second one; the task returns once
    the version is ``READY``. Emits ``kubedl.model-version.registered`` and ``...ready``; writes
    the ``<model>-registration`` artifact.

    Args:
        registry: The registry block (or its name).
        handoff: What :func:`start_model_run` returned for the job.
        result: The training task's result.
        spec: The job's spec (without the handoff: the lineage is the user's spec).
        model_name: The registered model.

    Raises:
        RegistryError: The job did not succeed, or handed over no model.
        ModelVersionNotReadyError: The registration failed, or was still pending in time.

    Example:
        ::

            version = register_model("mlflow", handoff, result, spec, "fraud")
            print(version.model_uri, version.tags["kubedl-prefect.io/job-uid"])
    """
    return run_in_caller_context(
        lambda: _register_model(registry, handoff, result, spec, model_name)
    )


@task(name="register-model", **TASK_OPTIONS)
async def aregister_model(
    registry: RegistryRef,
    handoff: Handoff,
    result: TrainingResult,
    spec: TrainingJobSpec | dict[str, Any],
    model_name: str,
) -> RegisteredVersion:
    """Async :func:`register_model`."""
    return await _register_model(registry, handoff, result, spec, model_name)


@task(name="resolve-model-version", **TASK_OPTIONS)
def resolve_model_version(
    registry: RegistryRef,
    model: RegisteredVersion | str,
    runtime: RuntimeProfile | None = KSERVE_MLSERVER,
) -> ResolvedModel:
    """The files of a version and the ``storageUri`` KServe loads them from, checked for serving.

    Args:
        registry: The registry block (or its name).
        model: The version, or a URI (``models:/name/3``, ``models:/name@champion``).
        runtime: The serving runtime whose image must load the model (``None``: no check).
            Warnings go to the task's log.

    Raises:
        ModelSourceRefusedError: A ``runs:/`` source, or a location KServe cannot read.
        IncompatibleModelError: The runtime cannot load the model as it was logged; every
            problem with its fix.

    Example:
        ::

            resolved = resolve_model_version("mlflow", "models:/fraud@champion")
            print(resolved.storage_uri)
    """
    return run_in_caller_context(lambda: _resolve_model_version(registry, model, runtime))


@task(name="resolve-model-version", **TASK_OPTIONS)
async def aresolve_model_version(
    registry: RegistryRef,
    model: RegisteredVersion | str,
    runtime: RuntimeProfile | None = KSERVE_MLSERVER,
) -> ResolvedModel:
    """Async :func:`resolve_model_version`."""
    return await _resolve_model_version(registry, model, runtime)


@task(name="gate-model-version", **TASK_OPTIONS)
def gate_model_version(
    registry: RegistryRef, version: RegisteredVersion, policy: GatePolicy
) -> GateDecision:
    """Judge a candidate against the champion alias; move the alias to it if it is better.

    The decision and both values are recorded on the candidate before the alias moves, so a
    retried task returns the recorded decision. Emits ``kubedl.model-version.promoted`` or
    ``...rejected``; updates the ``<model>-registration`` artifact with the decision.

    Args:
        registry: The registry block (or its name).
        version: The candidate (what :func:`register_model` returned).
        policy: The metric, its direction, the least improvement, the alias.

    Raises:
        RegistryError: The candidate (or the champion) has no value for the metric.

    Example:
        ::

            policy = GatePolicy("accuracy", min_improvement=0.01)
            decision = gate_model_version("mlflow", version, policy)
            if decision.promoted:
                ...  # deploy it
    """
    return run_in_caller_context(lambda: _gate_model_version(registry, version, policy))


@task(name="gate-model-version", **TASK_OPTIONS)
async def agate_model_version(
    registry: RegistryRef, version: RegisteredVersion, policy: GatePolicy
) -> GateDecision:
    """Async :func:`gate_model_version`."""
    return await _gate_model_version(registry, version, policy)
