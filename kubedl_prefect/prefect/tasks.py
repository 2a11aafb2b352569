"""Prefect tasks for training jobs, each with an async twin named with an ``a`` in front.

Sync flows call ``run_training_job(...)``, async flows ``await arun_training_job(...)``: the same
task, the same arguments and result, one implementation (:mod:`.runs`, :mod:`.sync`). No
``asyncio.run`` in user code, no Prefect private helpers.

========================================  ==========================================
sync                                      async
========================================  ==========================================
:func:`validate_training_job`             :func:`avalidate_training_job`
:func:`render_training_job`               :func:`arender_training_job`
:func:`submit_training_job`               :func:`asubmit_training_job`
:func:`watch_admission`                :func:`awatch_admission`
:func:`watch_completion`               :func:`awatch_completion`
:func:`run_training_job`                  :func:`arun_training_job`
:func:`cancel_training_job`               :func:`acancel_training_job`
========================================  ==========================================

Every task takes the :class:`~kubedl_prefect.prefect.blocks.TrainingJob` block (or the name it
was saved under). The key defaults to the block's, else the flow run's id and the task run's
name, which the task's retries and a re-run of the same flow run keep: the same key adopts the
job it made, never a second one. A Prefect retry of a task therefore continues the logical job
where its record says — N allowed attempts make at most N jobs, all with the same checkpoint
location. Tasks retry (twice, by default) only what is retryable: a lost connection to the API
server, a broken watch; a failed job has used its attempts already and is not retried.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.tasks import Task, TaskRunNameCallbackWithParameters

from kubedl_prefect.deprecation import renamed
from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.prefect.blocks import TrainingJob, as_training_job
from kubedl_prefect.prefect.cleanup import remember_for_rollback, rollback_training_job
from kubedl_prefect.prefect.reporting import task_run_label
from kubedl_prefect.prefect.results import TrainingResult
from kubedl_prefect.prefect.runs import SyncTrainingJobRun, TrainingJobRun
from kubedl_prefect.prefect.sync import run_in_caller_context
from kubedl_prefect.spec import render, spec_to_data, validate

SavedRun = dict[str, Any]
"""A run as plain data: ``TrainingJobRun.to_dict()`` (spec name, key and the job's reference)."""


def retry_if_retryable(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """``retry_condition_fn`` of the tasks: retry only errors whose ``retryable`` flag is set.

    Example:
        >>> from prefect.states import Failed
        >>> from kubedl_prefect.errors import KubeConnectionError, SpecError
        >>> retry_if_retryable(None, None, Failed(data=KubeConnectionError("down")))
        True
        >>> retry_if_retryable(None, None, Failed(data=SpecError([])))
        False
    """
    error = getattr(state, "data", None)
    return isinstance(error, KubeDLPrefectError) and error.retryable


_TASK_OPTIONS: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "retries": 2,
    "retry_delay_seconds": [5, 30],
    "retry_condition_fn": retry_if_retryable,
}


def spec_label(job: object) -> str:
    """What a task run is named after: the spec's name, else the saved block's name.

    A block given by name is not loaded to name the run (that would cost a request before the
    task starts): the run is renamed after the spec once the job is submitted.

    Example:
        >>> spec_label("pytorch-mnist")
        'pytorch-mnist'
    """
    if isinstance(job, str):
        return job
    try:
        return as_training_job(job).training_spec().name  # type: ignore[arg-type]
    except Exception:  # a bad spec fails the task itself, with its message, not its name
        return "training job"


class _Named(TaskRunNameCallbackWithParameters):
    """A ``task_run_name``: ``<verb> <spec name>`` from the task's ``job`` argument."""

    def __init__(self, verb: str):
        self.verb = verb

    def __call__(self, parameters: dict[str, Any]) -> str:
        return task_run_label(self.verb, spec_label(parameters.get("job")))


_named = _Named


async def _job(job: TrainingJob | str) -> TrainingJob:
    if isinstance(job, str):
        return await TrainingJob.aload(job)
    return as_training_job(job)


# -- validate and render ------------------------------------------------------------------


@task(name="validate-training-job", task_run_name=_named("validate"), cache_policy=NO_CACHE)
def validate_training_job(job: TrainingJob | str) -> dict[str, Any]:
    """Check the job's spec for its operator; return the spec's fields.

    Raises:
        SpecError: Every problem, with its field path and fix.
    """
    block = as_training_job(job)
    spec = block.training_spec()
    validate(spec, block.dialect)
    return spec_to_data(spec)


@task(name="validate-training-job", task_run_name=_named("validate"), cache_policy=NO_CACHE)
async def avalidate_training_job(job: TrainingJob | str) -> dict[str, Any]:
    """Async :func:`validate_training_job`."""
    block = await _job(job)
    spec = block.training_spec()
    validate(spec, block.dialect)
    return spec_to_data(spec)


def _manifest(block: TrainingJob, key: str | None) -> dict[str, Any]:
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend

    spec = block.training_spec()
    backend = block.cluster.backend(dialect=block.dialect, namespace=block.resolved_namespace())
    if isinstance(backend, KubernetesBackend):
        return backend.manifest(spec, key=key or block.key or "render", attempt=1)
    return dict(render(spec, block.dialect))


@task(name="render-training-job", task_run_name=_named("render"), cache_policy=NO_CACHE)
def render_training_job(job: TrainingJob | str, key: str | None = None) -> dict[str, Any]:
    """The custom resource the job's first attempt would be (nothing is sent).

    Args:
        job: The block (or its name).
        key: The key to render the name for (default: the block's, else ``render``).
    """
    return _manifest(as_training_job(job), key)


@task(name="render-training-job", task_run_name=_named("render"), cache_policy=NO_CACHE)
async def arender_training_job(job: TrainingJob | str, key: str | None = None) -> dict[str, Any]:
    """Async :func:`render_training_job`."""
    return _manifest(await _job(job), key)


# -- submit and wait -------------------------------------------------------------------------


@task(name="submit-training-job", task_run_name=_named("submit"), **_TASK_OPTIONS)
def submit_training_job(job: TrainingJob | str, key: str | None = None) -> SavedRun:
    """Submit (or adopt) the job; return the run as plain data for the wait tasks.

    Example:
        ::

            @flow
            def train() -> None:
                run = submit_training_job("mnist")
                watch_admission("mnist", run)
                result = watch_completion("mnist", run)
    """
    run = SyncTrainingJobRun.start(as_training_job(job), key=key)
    try:
        return run.to_dict()
    finally:
        run.close()


@task(name="submit-training-job", task_run_name=_named("submit"), **_TASK_OPTIONS)
async def asubmit_training_job(job: TrainingJob | str, key: str | None = None) -> SavedRun:
    """Async :func:`submit_training_job`."""
    run = await TrainingJobRun.start(await _job(job), key=key)
    try:
        return run.to_dict()
    finally:
        await run.close()


def _admission(state: AdmissionState) -> dict[str, Any]:
    return {
        "admitted": state.admitted,
        "scheduled": state.scheduled,
        "expected": state.expected,
        "reason": state.reason,
    }


@task(name="wait-for-admission", task_run_name=_named("admit"), **_TASK_OPTIONS)
def watch_admission(
    job: TrainingJob | str, run: SavedRun, timeout_s: float | None = None
) -> dict[str, Any]:
    """Wait until every replica is scheduled together; return the admission state.

    Raises:
        AdmissionTimeoutError: Not admitted in time (the job is deleted), with the reason.
    """
    handle = SyncTrainingJobRun.attach(as_training_job(job), run)
    try:
        return _admission(handle.wait_for_admission(timeout_s))
    finally:
        handle.close()


@task(name="wait-for-admission", task_run_name=_named("admit"), **_TASK_OPTIONS)
async def awatch_admission(
    job: TrainingJob | str, run: SavedRun, timeout_s: float | None = None
) -> dict[str, Any]:
    """Async :func:`watch_admission`."""
    handle = await TrainingJobRun.attach(await _job(job), run)
    try:
        return _admission(await handle.wait_for_admission(timeout_s))
    finally:
        await handle.close()


async def _to_the_end(handle: TrainingJobRun) -> TrainingResult:
    """Follow ``handle`` to its end and return the result; release it either way.

    The sync tasks run this whole, in one :func:`run_in_caller_context`: one helper thread and
    loop per task, not one per step, so nothing is left to start after the job's end. A run
    that ended is released without waiting (:meth:`TrainingJobRun.close_later`: its end record
    is still being written); after an error, which a retry of the task may follow, the release
    and that record are waited for.
    """
    try:
        await handle.wait_for_completion()
        result = await handle.fetch_result()
    except BaseException:
        await handle.close()
        raise
    handle.close_later()
    return result


@task(name="wait-for-completion", task_run_name=_named("train"), **_TASK_OPTIONS)
def watch_completion(job: TrainingJob | str, run: SavedRun) -> TrainingResult:
    """Follow a submitted job through every attempt to its end; return the result.

    Raises:
        JobFailedError: A permanent failure or retryable ones past the attempts (diagnosed).
    """
    block = as_training_job(job)

    async def follow() -> TrainingResult:
        return await _to_the_end(await TrainingJobRun.attach(block, run))

    return run_in_caller_context(follow)


@task(name="wait-for-completion", task_run_name=_named("train"), **_TASK_OPTIONS)
async def awatch_completion(job: TrainingJob | str, run: SavedRun) -> TrainingResult:
    """Async :func:`watch_completion`."""
    return await _to_the_end(await TrainingJobRun.attach(await _job(job), run))


# -- the whole thing -------------------------------------------------------------------------


@task(name="run-training-job", task_run_name=_named("train"), **_TASK_OPTIONS)
def run_training_job(
    job: TrainingJob | str, key: str | None = None, rollback: bool = False
) -> TrainingResult:
    """Submit or adopt the job and follow it to the end, with classified retries.

    Args:
        job: The block (or the name it was saved under).
        key: The idempotency key (default: the block's, else flow run id + task run name).
        rollback: Inside a ``transaction()``, delete the job when a later step fails.

    Returns:
        The result: phase, attempts and why, time queued and running, checkpoint, commands.

    Raises:
        JobFailedError: A permanent failure, or retryable ones past the attempts; its message
            (the task's state message) carries the diagnosis.

    Example:
        ::

            from prefect import flow
            from kubedl_prefect.prefect import CLEANUP_HOOKS, run_training_job

            @flow(**CLEANUP_HOOKS)
            def nightly() -> None:
                result = run_training_job("mnist")
                print(result.phase, result.checkpoint)
    """
    block = as_training_job(job)
    return run_in_caller_context(lambda: _run_to_the_end(block, key, rollback))


@task(name="run-training-job", task_run_name=_named("train"), **_TASK_OPTIONS)
async def arun_training_job(
    job: TrainingJob | str, key: str | None = None, rollback: bool = False
) -> TrainingResult:
    """Async :func:`run_training_job`."""
    return await _run_to_the_end(await _job(job), key, rollback)


async def _run_to_the_end(block: TrainingJob, key: str | None, rollback: bool) -> TrainingResult:
    handle = await TrainingJobRun.start(block, key=key)
    if rollback:
        try:
            remember_for_rollback(block, handle.ref)
        except BaseException:
            await handle.close()
            raise
    return await _to_the_end(handle)


@task(name="cancel-training-job", task_run_name=_named("cancel"), **_TASK_OPTIONS)
def cancel_training_job(job: TrainingJob | str, run: SavedRun) -> None:
    """Delete the run's job and wait until its pods and PodGroups are gone (idempotent)."""
    handle = SyncTrainingJobRun.from_saved(as_training_job(job), run)
    try:
        handle.cancel()
    finally:
        handle.close()


@task(name="cancel-training-job", task_run_name=_named("cancel"), **_TASK_OPTIONS)
async def acancel_training_job(job: TrainingJob | str, run: SavedRun) -> None:
    """Async :func:`cancel_training_job`."""
    handle = TrainingJobRun.from_saved(await _job(job), run)
    try:
        await handle.cancel()
    finally:
        await handle.close()


run_training_job.on_rollback(rollback_training_job)
arun_training_job.on_rollback(rollback_training_job)


_RENAMED = {
    "wait_for_admission": "watch_admission",
    "await_for_admission": "awatch_admission",
    "wait_for_completion": "watch_completion",
    "await_for_completion": "awatch_completion",
}


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, _RENAMED)
