"""Prefect artifacts of a training run: replica table, training progress, and a summary.

Four artifacts per training job, keyed ``<stem>-<what>``, where the stem (:func:`artifact_stem`)
names the deployment and the spec — ``<flow>-<deployment>-<spec name>`` in a deployment's run,
``<flow>-<spec name>`` in a flow run of no deployment, ``<spec name>`` outside any flow — and
never the run's key: every scheduled run of a deployment writes the same keys, so its runs line
up on Prefect's Artifacts page. Each is linked to the flow run and task run:

- ``...-replicas``, a table (role, index, pod, node, phase, restarts), created at the first
  phase change and updated in place at every later one; while the job is queued, its
  description says why (:func:`replicas_description`);
- ``...-progress``, a progress bar driven by the training program itself: a log line that is a
  JSON object with a numeric ``step`` and ``total`` (see :func:`parse_progress`) moves it, and
  its description says the step, the epoch and the latest metrics (``loss``, ``accuracy``...:
  the line's other numeric keys); it is updated only when the whole percentage changes, so at
  most 100 times whatever the run time;
- ``...-metrics``, a table beside the bar, updated with it: one row with the step, the total,
  the epoch and every metric of the latest progress line;
- ``...-summary``, markdown written at the end: the outcome, the admission wait and its reason,
  time queued (requeues included) and running, how often its queue requeued it, every attempt
  and why it ended, the checkpoint location, and the ``kubectl`` commands to see the job and its
  logs.

The builders are pure; :class:`ArtifactWriter` sends through Prefect's client (one request per
create or update) and counts its requests.

The model chain adds markdown and link artifacts, written by its tasks: ``<model>-registration``
(:func:`registration_markdown`: the version, its lineage, the gate's decision with both values)
and ``<service>-serving`` (:func:`serving_markdown`: the InferenceService, its ``storageUri``, the
runtime KServe chose and the URL, or the rollback and its reason, or the manifest rendered
without being applied); ``<model>-mlflow-run``, ``<model>-model-version`` and
``<service>-endpoint`` link to the MLflow run, the model version in the MLflow UI and the
served endpoint (:func:`web_link`: only ``http(s)`` URLs of the configured servers).
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit
from uuid import UUID

from kubedl_prefect.lifecycle.replicas import ReplicaState
from kubedl_prefect.lifecycle.status import TrainerProgress
from kubedl_prefect.prefect.results import TrainingResult
from kubedl_prefect.registry.gate import GateDecision
from kubedl_prefect.registry.lineage import (
    TAG_ATTEMPT,
    TAG_FLOW_RUN,
    TAG_IMAGE,
    TAG_JOB_NAME,
    TAG_JOB_UID,
    TAG_NAMESPACE,
    TAG_SPEC_HASH,
    recorded_metrics,
)

if TYPE_CHECKING:
    from kubedl_prefect.errors import InferenceServiceNotReadyError
    from kubedl_prefect.registry.mlflow_registry import RegisteredVersion, ResolvedModel
    from kubedl_prefect.serving.deploy import ServingOutcome

REPLICA_COLUMNS = ("role", "index", "pod", "node", "phase", "restarts")
"""The replica table's columns, in order."""


def artifact_key(stem: str, what: str) -> str:
    """An artifact key (lower-case letters, digits and single dashes).

    Example:
        >>> artifact_key("retrain-nightly-mnist", "replicas")
        'retrain-nightly-mnist-replicas'
        >>> artifact_key("Train_Flow--MNIST v2", "progress")
        'train-flow-mnist-v2-progress'
    """
    return re.sub(r"[^a-z0-9]+", "-", f"{stem}-{what}".lower()).strip("-")


def artifact_stem(spec_name: str, flow: str | None = None, deployment: str | None = None) -> str:
    """The stem of a training job's artifact keys: the deployment (or flow) and the spec.

    Not the run's key: a schedule's runs have keys of their own (their slots) but write the
    same artifact keys, so they line up. Two jobs of one spec in one flow run (a sweep) share
    the keys; each still has artifacts of its own, linked to its task run.

    Example:
        >>> artifact_stem("mnist", "retrain", "nightly")
        'retrain-nightly-mnist'
        >>> artifact_stem("mnist", "train")
        'train-mnist'
        >>> artifact_stem("mnist")
        'mnist'
    """
    return "-".join(part for part in (flow, deployment, spec_name) if part)


def replica_rows(states: Sequence[ReplicaState]) -> list[dict[str, Any]]:
    """The replica table's rows.

    Example:
        >>> from kubedl_prefect.lifecycle.replicas import ReplicaState
        >>> replica_rows([ReplicaState("worker-0", "worker", 0, "p", "n", "Running", 1)])
        [{'role': 'worker', 'index': 0, 'pod': 'p', 'node': 'n', 'phase': 'Running', 'restarts': 1}]
    """
    return [
        {
            "role": s.role or s.replica,
            "index": s.index if s.index >= 0 else "",
            "pod": s.pod,
            "node": s.node or "(not scheduled)",
            "phase": s.phase,
            "restarts": s.restarts,
        }
        for s in states
    ]


MAX_METRICS = 20
"""Metrics of one progress line kept (the first ones, in the line's order)."""
MAX_METRIC_NAME = 64
"""Longest metric name kept (longer ones are left out)."""


@dataclass(frozen=True)
class Progress:
    """How far the training program says it is, and its latest metrics.

    Args:
        step: The step reached.
        total: The steps in all.
        epoch: The epoch, if the line says it.
        metrics: The line's other numeric keys (``loss``, ``accuracy``...), in its order.
    """

    step: float
    total: float
    epoch: float | None = None
    metrics: tuple[tuple[str, float], ...] = ()

    @property
    def percent(self) -> float:
        """0 to 100."""
        return max(0.0, min(100.0, 100.0 * self.step / self.total))

    def done(self) -> Progress:
        """The same progress at its end (the run succeeded): the metrics stay the latest."""
        return Progress(self.total, self.total, self.epoch, self.metrics)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: float) -> str:
    return f"{value:g}"


def progress_row(progress: Progress) -> dict[str, Any]:
    """The metrics table's one row: step, total, epoch, then every metric.

    Example:
        >>> progress_row(parse_progress('{"step": 250, "total": 1000, "epoch": 3, "loss": 0.41}'))
        {'step': 250, 'total': 1000, 'epoch': 3, 'loss': 0.41}
    """

    def plain(value: float) -> float | int:
        return int(value) if float(value).is_integer() else value

    row: dict[str, Any] = {"step": plain(progress.step), "total": plain(progress.total)}
    if progress.epoch is not None:
        row["epoch"] = plain(progress.epoch)
    row.update((name, plain(value)) for name, value in progress.metrics)
    return row


def replicas_description(job: str, waiting: str = "") -> str:
    """The replica table's description: the job, and why it is queued while it is.

    Example:
        >>> replicas_description("mnist-a1")
        'Replicas of `mnist-a1`'
        >>> replicas_description("mnist-a1", "ClusterQueue gpu has no room yet: 2 more "
        ...                      "nvidia.com/gpu needed in flavor kwok-gpu")
        'Replicas of `mnist-a1` — queued: ClusterQueue gpu has no room yet: 2 more \
nvidia.com/gpu needed in flavor kwok-gpu'
    """
    text = f"Replicas of `{job}`"
    if waiting:
        text += f" — queued: {waiting.splitlines()[0][:500]}"
    return text


def progress_description(progress: Progress, job: str) -> str:
    """The progress bar's description: the job, the step, the epoch and the latest metrics.

    Example:
        >>> line = '{"step": 250, "total": 1000, "epoch": 3, "loss": 0.41}'
        >>> progress_description(parse_progress(line), "mnist-a1")
        'Training progress of `mnist-a1`: step 250 of 1000, epoch 3 — loss 0.41'
    """
    text = f"Training progress of `{job}`: step {_show(progress.step)} of {_show(progress.total)}"
    if progress.epoch is not None:
        text += f", epoch {_show(progress.epoch)}"
    if progress.metrics:
        text += " — " + ", ".join(f"{name} {_show(value)}" for name, value in progress.metrics)
    return text


def parse_progress(text: str) -> Progress | None:
    """The progress a log line reports: a JSON object with numeric ``step`` and ``total > 0``.

    A numeric ``epoch`` is kept, and so are the other numeric keys (``loss``, ``accuracy``...)
    as the latest metrics (at most :data:`MAX_METRICS`); other values are ignored. Anything else
    is no progress.

    Example:
        >>> progress = parse_progress('{"step": 250, "total": 1000, "epoch": 3, "loss": 0.41}')
        >>> progress.percent, progress.epoch, progress.metrics
        (25.0, 3.0, (('loss', 0.41),))
        >>> parse_progress("epoch 3 done") is None
        True
    """
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}") and '"step"' in stripped):
        return None
    try:
        data = json.loads(stripped)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    step, total = data.get("step"), data.get("total")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (step, total)):
        return None
    assert isinstance(step, int | float)
    assert isinstance(total, int | float)
    if total <= 0 or not math.isfinite(step) or not math.isfinite(total):
        return None
    epoch = data.get("epoch")
    metrics = [
        (name, float(value))
        for name, value in data.items()
        if name not in ("step", "total", "epoch")
        and _number(value)
        and 0 < len(name) <= MAX_METRIC_NAME
    ]
    return Progress(
        float(step),
        float(total),
        float(epoch) if _number(epoch) and epoch is not None else None,
        tuple(metrics[:MAX_METRICS]),
    )


def trainer_reported_progress(reported: TrainerProgress) -> Progress | None:
    """The progress a TrainJob's program reported to Trainer's status server (``trainerStatus``).

    The percentage is the step of 100; a numeric ``epoch`` metric is the epoch and the other
    numeric metrics (Trainer keeps every value as a string) are the latest metrics, as a JSON
    progress line's would be. ``None`` without a percentage.

    Example:
        >>> from kubedl_prefect.lifecycle.status import TrainerProgress
        >>> progress = trainer_reported_progress(
        ...     TrainerProgress(percent=40, metrics={"epoch": "2", "loss": "0.3", "note": "x"})
        ... )
        >>> progress.percent, progress.epoch, progress.metrics
        (40.0, 2.0, (('loss', 0.3),))
    """
    if reported.percent is None:
        return None
    numbers: list[tuple[str, float]] = []
    for name, text in reported.metrics.items():
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value) and 0 < len(name) <= MAX_METRIC_NAME:
            numbers.append((name, value))
    epoch = dict(numbers).get("epoch")
    metrics = tuple((name, value) for name, value in numbers if name != "epoch")
    return Progress(float(reported.percent), 100.0, epoch, metrics[:MAX_METRICS])


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def waited_for(result: TrainingResult) -> str:
    """What the summary says the job waited for: the reason and its category.

    Example:
        >>> from kubedl_prefect.prefect.results import TrainingResult
        >>> waited_for(TrainingResult(spec_name="m", key="k", phase="Succeeded", ref={},
        ...     queued_s=125.0, admission_reason="0/2 nodes: Insufficient nvidia.com/gpu",
        ...     admission_blocker="InsufficientGPU"))
        '0/2 nodes: Insufficient nvidia.com/gpu (InsufficientGPU)'
        >>> waited_for(TrainingResult(spec_name="m", key="k", phase="Succeeded", ref={},
        ...     queued_s=0.4))
        'nothing (admitted at once)'
    """
    if result.admission_reason:
        reason = result.admission_reason
        if result.admission_blocker and result.admission_blocker not in reason:
            reason += f" ({result.admission_blocker})"
        return reason
    if result.queued_s is not None and result.queued_s >= 1.0:
        return "not seen: the job was admitted before this task run looked (see its events)"
    return "nothing (admitted at once)"


def summary_markdown(result: TrainingResult) -> str:
    """The markdown summary of a finished run.

    Example:
        >>> from kubedl_prefect.prefect.results import TrainingResult
        >>> text = summary_markdown(TrainingResult(
        ...     spec_name="mnist", key="nightly", phase="Succeeded", queued_s=12.0,
        ...     ref={"name": "mnist-x-a1", "namespace": "ml", "kind": "PyTorchJob"}))
        >>> "Succeeded" in text and "12s" in text
        True
    """
    ref = result.ref
    lines = [
        f"# Training job `{result.spec_name}`: {result.phase}",
        "",
        f"Job `{ref.get('namespace')}/{ref.get('name')}` ({ref.get('kind')}, "
        f"{ref.get('dialect', '')} operator), key `{result.key}`"
        + (
            " — outcome replayed from the job's record, nothing trained."
            if result.replayed
            else "."
        ),
        "",
        "| | |",
        "| --- | --- |",
        f"| admission wait | {_duration(result.queued_s)}{_after_requeues(result)} |",
        f"| waited for | {_cell(waited_for(result))} |",
        f"| requeues | {result.requeues} |",
        f"| running | {_duration(result.running_s)} |",
        f"| total | {_duration(result.total_s)} |",
        f"| attempts | {len(result.attempts) or 1} |",
        f"| checkpoint | {_cell(result.checkpoint or '(none in the spec)')} |",
    ]
    failure = result.failure()
    if failure is not None:
        lines += [
            "",
            f"**Failure**: {_cell(failure.summary())}",
            "",
            f"What to do: {_cell(failure.hint)}",
        ]
    if result.attempts:
        lines += [
            "",
            "## Attempts",
            "",
            "| attempt | job | ended | why |",
            "| --- | --- | --- | --- |",
        ]
        for attempt in result.attempts:
            why = attempt.reason or ("" if attempt.phase == "Succeeded" else "—")
            lines.append(
                f"| {attempt.attempt} | `{attempt.name}` | {attempt.phase} | {_cell(why)} |"
            )
    if result.commands:
        lines += ["", "## Look at it", "", "```console", *result.commands, "```"]
    return "\n".join(lines) + "\n"


def _after_requeues(result: TrainingResult) -> str:
    """`` (20s of it after 1 requeue)``: the part of the admission wait that followed evictions."""
    if not result.requeues or result.requeued_s is None:
        return ""
    plural = "s" if result.requeues > 1 else ""
    return f" ({_duration(result.requeued_s)} of it after {result.requeues} requeue{plural})"


class ArtifactWriter:
    """Creates and updates the artifacts of one training job through Prefect's client.

    Call it from any thread inside the run's context (:meth:`RunContext.bind`); requests are
    counted in :attr:`requests`. A failing request is logged by the caller, never raised into
    the watch. Once :meth:`close` has run, the run's artifacts are final: a late update (a log
    line or phase change delivered after the run's end) is dropped, neither sent nor given a
    client of its own that nobody would close.

    Args:
        stem: The stem of the artifact keys (:func:`artifact_stem`).
        flow_run_id: The flow run to link the artifacts to.
        task_run_id: The task run to link them to.
    """

    def __init__(self, stem: str, flow_run_id: UUID | None, task_run_id: UUID | None):
        self.stem = stem
        self.flow_run_id = flow_run_id
        self.task_run_id = task_run_id
        self.requests = 0
        self._ids: dict[str, UUID] = {}
        self._lock = threading.Lock()
        self._last_percent: int | None = None
        self._last_rows: list[dict[str, Any]] | None = None
        self._last_description = ""
        self._unsent: tuple[list[dict[str, Any]], str] | None = None
        self._open: Any = None
        self._closed = False
        self.latest: Progress | None = None
        """The latest progress a line reported (sent or not)."""

    def key(self, what: str) -> str:
        """The key of one of this job's artifacts (``replicas``, ``progress``...)."""
        return artifact_key(self.stem, what)

    def _client(self) -> Any:
        if self._open is None:
            from prefect.client.orchestration import get_client

            self._open = get_client(sync_client=True)
            self._open.__enter__()
        return self._open

    def close(self) -> None:
        """Close the client (one per writer: its connection is reused between requests).

        The writer stays closed: later updates are dropped (the run's artifacts are final).
        """
        with self._lock:
            client, self._open, self._closed = self._open, None, True
        if client is not None:
            client.__exit__(None, None, None)

    def _put(self, what: str, kind: str, data: Any, description: str) -> None:
        from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

        with self._lock:
            if self._closed:  # the run ended: a late update would reopen a client for ever
                return
            client = self._client()
            existing = self._ids.get(what)
            self.requests += 1
            if existing is not None:
                client.update_artifact(existing, ArtifactUpdate(data=data, description=description))
                return
            created = client.create_artifact(
                ArtifactCreate(
                    key=self.key(what),
                    type=kind,
                    description=description,
                    data=data,
                    flow_run_id=self.flow_run_id,
                    task_run_id=self.task_run_id,
                )
            )
            self._ids[what] = created.id

    def replicas(self, states: Sequence[ReplicaState], job: str, *, waiting: str = "") -> None:
        """Create or update the replica table (nothing is sent when it did not change).

        ``waiting`` is why the job is queued, while it is: the table's description says it
        (:func:`replicas_description`), so the flow run's page shows why nothing runs yet.
        """
        rows = replica_rows(states)
        description = replicas_description(job, waiting)
        if (rows, description) == (self._last_rows, self._last_description):
            return
        self._unsent = (rows, description)
        self._put("replicas", "table", json.dumps(rows), description)
        # Remembered once Prefect has them.
        self._last_rows, self._last_description, self._unsent = rows, description, None

    def resend(self) -> None:
        """Send the replica table again if its last update never reached Prefect.

        A Prefect API that was down longer than its client retries (about a minute) loses the
        update of the terminal phase, and no later phase change would send it: the end of the
        run sends it once more.
        """
        if self._unsent is not None:
            rows, description = self._unsent
            self._put("replicas", "table", json.dumps(rows), description)
            self._last_rows, self._last_description, self._unsent = rows, description, None

    def progress(self, progress: Progress, job: str) -> None:
        """Move the progress bar and its metrics table (only when the whole percentage changes).

        The bar's description and the table carry the step, the epoch and the metrics of the
        line that moved it.
        """
        self.latest = progress
        percent = int(progress.percent)
        if percent == self._last_percent:
            return
        self._put("progress", "progress", float(percent), progress_description(progress, job))
        self._last_percent = percent
        self._put(
            "metrics",
            "table",
            json.dumps([progress_row(progress)]),
            f"Latest metrics of `{job}`",
        )

    def summary(self, result: TrainingResult) -> None:
        """Write the summary of the finished run."""
        self._put(
            "summary",
            "markdown",
            summary_markdown(result),
            f"Summary of training job `{result.spec_name}`",
        )


# -- the model chain ------------------------------------------------------------------------


def web_link(server: str | None, path: str = "") -> str | None:
    """``server`` + ``path`` when ``server`` is a plain ``http(s)`` address, else ``None``.

    Only a server the flow was configured with (the registry block's tracking URI, the URL
    KServe gave the service) is linked, and only over ``http(s)``: a ``file:`` or
    ``databricks`` tracking URI, another scheme, or an address with ``user:password@`` in it
    makes no link.

    Example:
        >>> web_link("https://mlflow.example.com/", "/#/runs/r1")
        'https://mlflow.example.com/#/runs/r1'
        >>> web_link("file:///tmp/mlruns", "/#/runs/r1") is None
        True
        >>> web_link("javascript:alert(1)") is None
        True
    """
    if not server:
        return None
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    return server.rstrip("/") + path


def mlflow_run_link(tracking_uri: str | None, run_id: str | None) -> str | None:
    """The MLflow UI's page of a run (``<server>/#/runs/<run id>``, which opens it).

    Example:
        >>> mlflow_run_link("http://127.0.0.1:5000", "ab12")
        'http://127.0.0.1:5000/#/runs/ab12'
    """
    return web_link(tracking_uri, f"/#/runs/{quote(run_id, safe='')}") if run_id else None


def model_version_link(tracking_uri: str | None, model: str, version: str) -> str | None:
    """The MLflow UI's page of a registered model version.

    Example:
        >>> model_version_link("http://127.0.0.1:5000", "fraud detector", "3")
        'http://127.0.0.1:5000/#/models/fraud%20detector/versions/3'
    """
    return web_link(
        tracking_uri, f"/#/models/{quote(model, safe='')}/versions/{quote(version, safe='')}"
    )


def _value(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def registration_markdown(
    version: RegisteredVersion,
    decision: GateDecision | None = None,
    resolved: ResolvedModel | None = None,
) -> str:
    """The markdown summary of a registration: the version, its lineage, the gate's decision.

    Example:
        >>> from kubedl_prefect.registry.gate import GateDecision
        >>> from kubedl_prefect.registry.mlflow_registry import RegisteredVersion
        >>> version = RegisteredVersion("fraud", "3", "models:/m-ab", "r1", "m-ab", "READY",
        ...                             {"kubedl-prefect.io/job-name": "fraud-x-a1"})
        >>> text = registration_markdown(version, GateDecision(
        ...     "fraud", "champion", "3", "2", "accuracy", 0.93, 0.9, True, "better"))
        >>> "promoted" in text and "0.93" in text and "fraud-x-a1" in text
        True
    """
    tags = version.tags
    if decision is None:
        outcome = "registered"
    else:
        outcome = "promoted" if decision.promoted else "not promoted"
    lines = [
        f"# Model `{version.model_name}` version {version.version}: {outcome}",
        "",
        f"`{version.model_uri}`"
        + ("" if version.created else " — found: an earlier try of this step had made it")
        + ".",
        "",
        "| | |",
        "| --- | --- |",
        f"| status | {version.status} |",
        f"| source | `{_cell(version.source)}` |",
        f"| run | `{version.run_id or '—'}` |",
        f"| training job | `{tags.get(TAG_NAMESPACE, '?')}/{tags.get(TAG_JOB_NAME, '?')}` "
        f"(uid `{tags.get(TAG_JOB_UID, '?')}`, attempt {tags.get(TAG_ATTEMPT, '?')}) |",
        f"| image | {_cell(tags.get(TAG_IMAGE, '—'))} |",
        f"| spec hash | `{tags.get(TAG_SPEC_HASH, '—')}` |",
        f"| flow run | `{tags.get(TAG_FLOW_RUN, '—')}` |",
    ]
    if resolved is not None:
        lines.append(f"| storageUri | `{_cell(resolved.storage_uri)}` |")
    metrics = recorded_metrics(tags)
    if metrics:
        lines.append(
            "| metrics | " + ", ".join(f"{k} {v:g}" for k, v in sorted(metrics.items())) + " |"
        )
    if decision is not None:
        champion = (
            f"{_value(decision.champion_value)} (version {decision.champion_version})"
            if decision.champion_version is not None
            else "— (no champion)"
        )
        lines += [
            "",
            f"## Gate on `{decision.metric}` (alias `{decision.alias}`)",
            "",
            "| candidate | champion | decision | why |",
            "| --- | --- | --- | --- |",
            f"| {_value(decision.candidate_value)} (version {decision.candidate_version}) "
            f"| {champion} | {'promoted' if decision.promoted else 'rejected'} "
            f"| {_cell(decision.reason)} |",
        ]
    return "\n".join(lines) + "\n"


def serving_markdown(
    *,
    name: str,
    namespace: str,
    storage_uri: str,
    requested_runtime: str | None = None,
    outcome: ServingOutcome | None = None,
    error: InferenceServiceNotReadyError | None = None,
    manifest: dict[str, Any] | None = None,
    note: str = "",
) -> str:
    """The markdown summary of serving: Ready (URL, runtime), rolled back (reason), or rendered.

    Example:
        >>> text = serving_markdown(name="fraud", namespace="ml", storage_uri="s3://b/m",
        ...                         manifest={"kind": "InferenceService"}, note="serve=none")
        >>> "not applied" in text and "kind: InferenceService" in text
        True
    """
    import yaml

    if outcome is not None:
        title = "Ready"
    elif error is not None:
        title = "rolled back" if error.rolled_back else "not Ready"
    else:
        title = "rendered, not applied"
    lines = [
        f"# InferenceService `{namespace}/{name}`: {title}",
        "",
        "| | |",
        "| --- | --- |",
        f"| storageUri | `{_cell(storage_uri)}` |",
        f"| runtime asked for | {_cell(requested_runtime or '(KServe chooses)')} |",
    ]
    if outcome is not None:
        lines += [
            f"| runtime chosen | {_cell(outcome.runtime or '(not reported)')} |",
            f"| URL | {_cell(outcome.url or '(none yet)')} |",
            f"| generation | {outcome.generation} |",
            f"| spec changed | {'yes' if outcome.changed else 'no: it was serving already'} |",
        ]
    if error is not None:
        lines += [
            f"| reason | {_cell(error.reason)} |",
            f"| timed out | {'yes' if error.timed_out else 'no'} |",
            f"| rolled back | {'yes' if error.rolled_back else 'no'} |",
            "",
            f"**What happened**: {_cell(error.message)}",
            "",
            f"What to do: {_cell(error.hint or '')}",
        ]
    if note:
        lines += ["", _cell(note)]
    if manifest is not None:
        lines += ["", "## Manifest", "", "```yaml", yaml.safe_dump(manifest, sort_keys=False)]
        lines[-1] = lines[-1].rstrip("\n")
        lines.append("```")
    return "\n".join(lines) + "\n"
