"""Prefect artifacts of a training run: replica table, training progress, and a summary.

Three artifacts per logical job (spec name + key), each keyed ``<spec name>-<key hash>-<what>``
so a schedule's runs of one job line up on Prefect's Artifacts page, and each linked to the flow
run and task run:

- ``...-replicas``, a table (role, index, pod, node, phase, restarts), created at the first
  phase change and updated in place at every later one;
- ``...-progress``, a progress bar driven by the training program itself: a log line that is a
  JSON object with a numeric ``step`` and ``total`` (see :func:`parse_progress`) moves it; it is
  updated only when the whole percentage changes, so at most 100 times whatever the run time;
- ``...-summary``, markdown written at the end: the outcome, the admission wait and its reason,
  time queued and running, every attempt and why it ended, the checkpoint location, and the
  ``kubectl`` commands to see the job and its logs.

The builders are pure; :class:`ArtifactWriter` sends through Prefect's client (one request per
create or update) and counts its requests.

The model chain adds two markdown artifacts, written by its tasks: ``<model>-registration``
(:func:`registration_markdown`: the version, its lineage, the gate's decision with both values)
and ``<service>-serving`` (:func:`serving_markdown`: the InferenceService, its ``storageUri``, the
runtime KServe chose and the URL, or the rollback and its reason, or the manifest rendered
without being applied).
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from kubedl_prefect.lifecycle.replicas import ReplicaState
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


def artifact_key(record_name: str, what: str) -> str:
    """An artifact key (lower-case letters, digits and dashes) for one logical job.

    Example:
        >>> artifact_key("mnist-siru7c5qacsk", "replicas")
        'mnist-siru7c5qacsk-replicas'
    """
    return re.sub(r"[^a-z0-9-]+", "-", f"{record_name}-{what}".lower()).strip("-")


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


@dataclass(frozen=True)
class Progress:
    """How far the training program says it is."""

    step: float
    total: float

    @property
    def percent(self) -> float:
        """0 to 100."""
        return max(0.0, min(100.0, 100.0 * self.step / self.total))


def parse_progress(text: str) -> Progress | None:
    """The progress a log line reports: a JSON object with numeric ``step`` and ``total > 0``.

    Other keys (``epoch``, ``loss``...) are allowed and ignored; anything else is no progress.

    Example:
        >>> parse_progress('{"step": 250, "total": 1000, "loss": 0.41}').percent
        25.0
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
    return Progress(float(step), float(total))


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
        f"| admission wait | {_duration(result.queued_s)} |",
        f"| waited for | {_cell(result.admission_reason or 'nothing (admitted at once)')} |",
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


class ArtifactWriter:
    """Creates and updates the artifacts of one logical job through Prefect's client.

    Call it from any thread inside the run's context (:meth:`RunContext.bind`); requests are
    counted in :attr:`requests`. A failing request is logged by the caller, never raised into
    the watch.

    Args:
        record_name: ``<spec name>-<key hash>``, the stem of the artifact keys.
        flow_run_id: The flow run to link the artifacts to.
        task_run_id: The task run to link them to.
    """

    def __init__(self, record_name: str, flow_run_id: UUID | None, task_run_id: UUID | None):
        self.record_name = record_name
        self.flow_run_id = flow_run_id
        self.task_run_id = task_run_id
        self.requests = 0
        self._ids: dict[str, UUID] = {}
        self._lock = threading.Lock()
        self._last_percent: int | None = None
        self._last_rows: list[dict[str, Any]] | None = None
        self._unsent: tuple[list[dict[str, Any]], str] | None = None
        self._open: Any = None

    def _client(self) -> Any:
        if self._open is None:
            from prefect.client.orchestration import get_client

            self._open = get_client(sync_client=True)
            self._open.__enter__()
        return self._open

    def close(self) -> None:
        """Close the client (one per writer: its connection is reused between requests)."""
        with self._lock:
            client, self._open = self._open, None
        if client is not None:
            client.__exit__(None, None, None)

    def _put(self, what: str, kind: str, data: Any, description: str) -> None:
        from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

        with self._lock:
            client = self._client()
            existing = self._ids.get(what)
            self.requests += 1
            if existing is not None:
                client.update_artifact(existing, ArtifactUpdate(data=data))
                return
            created = client.create_artifact(
                ArtifactCreate(
                    key=artifact_key(self.record_name, what),
                    type=kind,
                    description=description,
                    data=data,
                    flow_run_id=self.flow_run_id,
                    task_run_id=self.task_run_id,
                )
            )
            self._ids[what] = created.id

    def replicas(self, states: Sequence[ReplicaState], job: str) -> None:
        """Create or update the replica table (nothing is sent when it did not change)."""
        rows = replica_rows(states)
        if rows == self._last_rows:
            return
        self._unsent = (rows, job)
        self._put("replicas", "table", json.dumps(rows), f"Replicas of `{job}`")
        self._last_rows, self._unsent = rows, None  # remembered once Prefect has them

    def resend(self) -> None:
        """Send the replica table again if its last update never reached Prefect.

        A Prefect API that was down longer than its client retries (about a minute) loses the
        update of the terminal phase, and no later phase change would send it: the end of the
        run sends it once more.
        """
        if self._unsent is not None:
            rows, job = self._unsent
            self._put("replicas", "table", json.dumps(rows), f"Replicas of `{job}`")
            self._last_rows, self._unsent = rows, None

    def progress(self, progress: Progress, job: str) -> None:
        """Create or move the progress bar (only when the whole percentage changes)."""
        percent = int(progress.percent)
        if percent == self._last_percent:
            return
        self._put("progress", "progress", float(percent), f"Training progress of `{job}`")
        self._last_percent = percent

    def summary(self, result: TrainingResult) -> None:
        """Write the summary of the finished run."""
        self._put(
            "summary",
            "markdown",
            summary_markdown(result),
            f"Summary of training job `{result.spec_name}`",
        )


# -- the model chain ------------------------------------------------------------------------


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
