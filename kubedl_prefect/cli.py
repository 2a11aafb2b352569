"""The ``kubedl-prefect`` command line: specs (render, validate, import), runs, the test bed.

A thin layer over :mod:`kubedl_prefect.spec` and :mod:`kubedl_prefect.lifecycle`;
``docs/cli.md`` documents the commands, their messages and exit codes:

- ``0``: success (``render`` printed the manifests, ``validate`` one OK line per spec, ``status``
  the job's state, ``logs`` every line until the job ended, ``cancel`` the job is gone); settings
  that break a Pod Security Standards level the spec allows are printed as ``warning:`` lines
  on stderr, with the level;
- ``1``: a spec is invalid (malformed YAML included); each problem on stderr names the field,
  in the order of the spec's lines;
- ``2``: usage error (unknown option, bad or missing value), a file that cannot be read, or a
  run reference that is not one;
- ``3``: the job of a run reference could not be followed: its cluster cannot be reached or
  refuses, the job is gone, or a cancellation did not finish in time.

Start-up matters (``validate`` runs in editors and pre-commit hooks): this module imports only
typer and the error tree; each command imports what it uses when it runs. ``kubedl-prefect
testbed ...`` are the commands of :mod:`kubedl_prefect.testbed.cli`, imported only when one of
them runs (or its help is asked for). ``bench/cli_startup.py`` measures it and
``tests/unit/test_cli.py`` keeps the heavy modules out.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from typer._click.exceptions import MissingParameter
from typer.core import TyperGroup

from kubedl_prefect import __version__
from kubedl_prefect.errors import KubeDLPrefectError, MissingExtraError, SpecError, SpecIssue

if TYPE_CHECKING:
    from typer._click import Command, Context

    from kubedl_prefect.lifecycle.admission import AdmissionState
    from kubedl_prefect.lifecycle.backend import JobRef, LogLine, TrainingBackend
    from kubedl_prefect.lifecycle.run import TrainingRun
    from kubedl_prefect.lifecycle.status import JobStatus
    from kubedl_prefect.spec import Dialect, PodSecurityFinding, TrainingJobSpec
    from kubedl_prefect.spec.porting import ImportedSpec

#: Help of the ``testbed`` group, shown by ``kubedl-prefect --help`` without importing the test
#: bed; the same as :data:`kubedl_prefect.testbed.cli.app`'s.
TESTBED_HELP = "A local Kubernetes test bed: real control plane, simulated GPU nodes, operators."

#: What ``-`` stands for in messages.
STDIN = "<stdin>"

#: The most a run reference may be (a saved run or a TrainingResult is a few KiB).
MAX_REFERENCE_BYTES = 1 << 20


class ExitCode(IntEnum):
    """Exit codes of the command line."""

    OK = 0
    INVALID_SPEC = 1
    USAGE = 2
    JOB = 3


app = typer.Typer(
    name="kubedl-prefect",
    help="Distributed training on Kubernetes (KubeDL, Kubeflow) from Prefect flows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class UnreadableSpecError(Exception):
    """A file could not be read (a usage problem, not an invalid spec)."""


class UnusableReferenceError(Exception):
    """A run reference or the way to its cluster is not usable (a usage problem)."""


# --- choices, without typer's tabs or pydantic's wording ----------------------------------------

DIALECTS = ("kubedl", "kubeflow", "trainer")
IMPORT_DIALECTS = ("auto", *DIALECTS)


def _choice(
    choices: tuple[str, ...], *, required: bool = False
) -> Callable[[typer.Context, typer.CallbackParam, str | None], str | None]:
    """A callback that accepts one of ``choices`` (any case), with a one-line message if not."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
        listed = ", ".join(choices)
        if value is None:
            if required:
                raise MissingParameter(
                    ctx=ctx, param=cast(Any, param), message=f"Choose from {listed}."
                )
            return None
        folded = value.strip().lower()
        if folded in choices:
            return folded
        close = difflib.get_close_matches(folded, choices, n=1)
        guess = f" (did you mean {close[0]}?)" if close else ""
        raise typer.BadParameter(f"{value!r} is not one of {listed}{guess}")

    return check


def _metavar(choices: tuple[str, ...]) -> str:
    return "[" + "|".join(choices) + "]"


# --- reading specs -------------------------------------------------------------------------------


def _is_stdin(path: Path | str) -> bool:
    return str(path) == "-"


def _shown(path: Path | str) -> str:
    return STDIN if _is_stdin(path) else str(path)


def read_input(path: Path | str, *, max_bytes: int) -> tuple[str, str]:
    """The text of the file at ``path`` (``-``: standard input) and how to name it.

    Raises:
        UnreadableSpecError: The file cannot be opened.
        SpecError: It is too large or not UTF-8 (path ``(file)``, with the line and column).
    """
    from kubedl_prefect.spec.reader import Limits, check_size, decode_text, read_text_file

    if _is_stdin(path):
        data = typer.get_binary_stream("stdin").read(max_bytes + 1)
        if len(data) > max_bytes:
            # Refused as too large, never as a UTF-8 sequence cut at the limit: the text with
            # replacement characters encodes to at least as many bytes as were read.
            check_size(data.decode("utf-8", "replace"), Limits(max_bytes), source=STDIN)
        return decode_text(data, source=STDIN), STDIN
    file = Path(path)
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        raise UnreadableSpecError(f"cannot read {file}: {exc.strerror or exc}") from exc
    return read_text_file(file, Limits(max_bytes)), str(file)


def read_spec(path: Path) -> TrainingJobSpec:
    """Read and parse the spec file at ``path`` (``-``: standard input).

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: If it is malformed YAML or an invalid spec.
    """
    return read_spec_with_warnings(path)[0]


def read_spec_with_warnings(path: Path) -> tuple[TrainingJobSpec, list[PodSecurityFinding]]:
    """:func:`read_spec`, and the spec's Pod Security warnings (with their lines).

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: If it is malformed YAML or an invalid spec.
    """
    from kubedl_prefect.spec.io import loads_spec_with_warnings
    from kubedl_prefect.spec.reader import SPEC_LIMITS

    text, source = read_input(path, max_bytes=SPEC_LIMITS.max_bytes)
    return loads_spec_with_warnings(text, source=source)


def issue_line(issue: SpecIssue) -> int | None:
    """The spec line a problem names (``(line 4)`` in its text), if it names one."""
    found = re.search(r"\(line (\d+)\)", issue.problem)
    return int(found.group(1)) if found else None


def by_line(error: SpecError) -> SpecError:
    """The same error with its problems in the order of the spec's lines (unplaced ones last).

    Example:
        >>> late = SpecIssue("image", "empty (line 9)", "set it")
        >>> early = SpecIssue("name", "too long (line 2)", "shorten it")
        >>> [i.path for i in by_line(SpecError([late, early])).issues]
        ['name', 'image']
    """
    lines = [issue_line(issue) for issue in error.issues]
    order = sorted(range(len(lines)), key=lambda n: (lines[n] is None, lines[n] or 0, n))
    return SpecError([error.issues[n] for n in order], source=error.source)


def warning_lines(warnings: Sequence[PodSecurityFinding], where: str = "") -> list[str]:
    """The ``warning: ...`` lines the commands print on stderr, one per finding.

    Example:
        >>> from kubedl_prefect.spec import PodSecurityFinding, PodSecurityLevel
        >>> finding = PodSecurityFinding("hostPID", PodSecurityLevel.BASELINE, "shares", "remove")
        >>> warning_lines([finding], "x.yaml: ")
        ['warning: x.yaml: hostPID: shares, which the Baseline Pod Security level forbids \
(fix: remove)']
    """
    return [f"warning: {where}{finding}" for finding in warnings]


def render_file(
    path: Path,
    dialect: Dialect | str,
    *,
    name_key: str | None = None,
    attempt: int = 1,
    namespace: str | None = None,
) -> str:
    """Render the spec file at ``path`` for ``dialect`` and return the manifest as YAML.

    Args:
        path: The spec file (``-``: standard input).
        dialect: ``kubedl``, ``kubeflow`` or ``trainer``.
        name_key: When given, the job is named like the lifecycle names it:
            :func:`~kubedl_prefect.spec.job_name` of the spec name, this key and ``attempt``.
        attempt: The attempt number for the name (with ``name_key``).
        namespace: ``metadata.namespace`` of the manifest, if given.

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: If the spec is invalid, or does not fit the operator.
    """
    from kubedl_prefect.spec.io import dump_manifests

    manifest = _render_one(path, dialect, name_key, attempt, namespace)
    return dump_manifests([manifest])


def _render_one(
    path: Path,
    dialect: Dialect | str,
    name_key: str | None,
    attempt: int,
    namespace: str | None,
) -> dict[str, Any]:
    from kubedl_prefect.spec.naming import job_name
    from kubedl_prefect.spec.renderers import RenderOptions, render
    from kubedl_prefect.spec.validation import validate

    spec, warnings = read_spec_with_warnings(path)
    validate(spec, dialect, source=_shown(path))  # the operator's rules, naming the file
    _warn(warnings, f"{_shown(path)}: ")
    name = job_name(spec.name, name_key, attempt) if name_key is not None else None
    manifest = dict(render(spec, dialect, RenderOptions(job_name=name, namespace=namespace)))
    if str(dialect) == "trainer":  # what a TrainJob runs differently, on stderr
        from kubedl_prefect.spec.renderers.trainer import trainer_notes

        for field, text in trainer_notes(spec):
            typer.echo(f"note: {_shown(path)}: {field}: {text}", err=True)
    return manifest


def validate_file(path: Path, dialect: Dialect | str | None = None) -> TrainingJobSpec:
    """Check the spec file at ``path`` (for ``dialect`` too, when given) and return the spec.

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: Listing every problem, each with its field path and fix.
    """
    spec, warnings = _validated(path, dialect)
    _warn(warnings, f"{_shown(path)}: ")
    return spec


def _validated(
    path: Path, dialect: Dialect | str | None
) -> tuple[TrainingJobSpec, list[PodSecurityFinding]]:
    from kubedl_prefect.spec.validation import validate

    spec, warnings = read_spec_with_warnings(path)
    validate(spec, dialect, source=_shown(path))
    return spec, warnings


def _warn(warnings: Sequence[PodSecurityFinding], where: str) -> None:
    for line in warning_lines(warnings, where):
        typer.echo(line, err=True)


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _issue_data(issue: SpecIssue) -> dict[str, Any]:
    return {
        "path": issue.path,
        "problem": issue.problem,
        "fix": issue.fix,
        "line": issue_line(issue),
    }


def _finding_data(finding: PodSecurityFinding) -> dict[str, Any]:
    return {
        "path": finding.path,
        "level": str(finding.level),
        "problem": finding.problem,
        "fix": finding.fix,
        "line": finding.line,
        "allowed": finding.allowed,
    }


def _one_stdin(paths: Sequence[Path]) -> None:
    if sum(1 for path in paths if _is_stdin(path)) > 1:
        raise typer.BadParameter("standard input (-) can be read only once")


SpecsArgument = Annotated[
    list[Path],
    typer.Argument(
        help="Training-job specs (YAML); - reads one from standard input.",
        metavar="SPEC",
        show_default=False,
    ),
]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kubedl-prefect {__version__}")
        raise typer.Exit(ExitCode.OK)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
) -> None:
    pass


@app.command("render")
def render_command(
    specs: SpecsArgument,
    dialect: Annotated[
        str | None,
        typer.Option(
            "--dialect",
            "-d",
            help="Required: the operator to render for.",
            metavar=_metavar(DIALECTS),
            callback=_choice(DIALECTS, required=True),
        ),
    ] = None,
    name_key: Annotated[
        str | None,
        typer.Option(
            "--name-key",
            help="Name the job <name>-<hash of KEY>-a<ATTEMPT>, as the lifecycle does.",
        ),
    ] = None,
    attempt: Annotated[
        int | None,
        typer.Option("--attempt", min=1, max=99, help="Attempt number (needs --name-key)."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Set metadata.namespace.")
    ] = None,
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            help="yaml (documents) or json (one object; a v1 List for several specs).",
            metavar=_metavar(("yaml", "json")),
            callback=_choice(("yaml", "json")),
        ),
    ] = "yaml",
) -> None:
    """Print the custom resource of each SPEC on stdout; nothing if any SPEC is invalid."""
    if attempt is not None and name_key is None:
        raise typer.BadParameter("--attempt needs --name-key", param_hint="--attempt")
    _one_stdin(specs)
    assert dialect is not None  # required by its callback
    manifests: list[dict[str, Any]] = []
    failed: ExitCode | None = None
    for path in specs:
        try:
            manifests.append(_render_one(path, dialect, name_key, attempt or 1, namespace))
        except (UnreadableSpecError, SpecError) as exc:
            failed = max(failed or ExitCode.OK, _report(exc))
    if failed is not None:
        raise typer.Exit(failed)
    if output == "json":
        if len(manifests) == 1:
            _echo_json(manifests[0])
        else:
            _echo_json({"apiVersion": "v1", "kind": "List", "items": manifests})
        return
    from kubedl_prefect.spec.io import dump_manifests

    typer.echo(dump_manifests(manifests), nl=False)


@app.command("validate")
def validate_command(
    specs: SpecsArgument,
    dialect: Annotated[
        str | None,
        typer.Option(
            "--dialect",
            "-d",
            help="Also check the rules of this operator.",
            metavar=_metavar(DIALECTS),
            callback=_choice(DIALECTS),
        ),
    ] = None,
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            help="text (OK lines; problems on stderr) or json (one report on stdout).",
            metavar=_metavar(("text", "json")),
            callback=_choice(("text", "json")),
        ),
    ] = "text",
) -> None:
    """Check each SPEC; print one OK line each, or every problem (field, problem, fix)."""
    _one_stdin(specs)
    scope = (
        f"for {dialect}"
        if dialect is not None
        else "(operator-specific checks skipped: add --dialect kubedl, kubeflow or trainer)"
    )
    results: list[dict[str, Any]] = []
    worst = ExitCode.OK
    for path in specs:
        result: dict[str, Any] = {
            "file": _shown(path),
            "valid": False,
            "dialect": dialect,
            "framework": None,
            "name": None,
            "warnings": [],
            "problems": [],
            "error": None,
        }
        results.append(result)
        try:
            spec, warnings = _validated(path, dialect)
        except UnreadableSpecError as exc:
            worst = max(worst, ExitCode.USAGE)
            result["error"] = str(exc)
            if output == "text":
                _report(exc)
            continue
        except SpecError as exc:
            worst = max(worst, ExitCode.INVALID_SPEC)
            result["problems"] = [_issue_data(issue) for issue in by_line(exc).issues]
            if output == "text":
                _report(exc)
            continue
        result.update(valid=True, framework=spec.framework.value, name=spec.name)
        result["warnings"] = [_finding_data(w) for w in warnings]
        if output == "text":
            _warn(warnings, f"{_shown(path)}: ")
            typer.echo(
                f"OK: {_shown(path)}: {spec.framework.value} job {spec.name!r} is valid {scope}"
            )
    if output == "json":
        _echo_json({"valid": worst == ExitCode.OK, "results": results})
    if worst != ExitCode.OK:
        raise typer.Exit(worst)


@app.command("import")
def import_command(
    manifests: Annotated[
        list[Path],
        typer.Argument(
            help="KubeDL or Kubeflow job manifests (YAML, one or several documents each); "
            "- reads them from standard input.",
            metavar="MANIFEST",
            show_default=False,
        ),
    ],
    dialect: Annotated[
        str,
        typer.Option(
            "--dialect",
            "-d",
            help="The manifests' operator; auto: read it from each apiVersion.",
            metavar=_metavar(IMPORT_DIALECTS),
            callback=_choice(IMPORT_DIALECTS),
        ),
    ] = "auto",
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            help="yaml (specs with the importer's comments) or json (a list, notes apart).",
            metavar=_metavar(("yaml", "json")),
            callback=_choice(("yaml", "json")),
        ),
    ] = "yaml",
) -> None:
    """Print a training-job spec for each job in each MANIFEST (see docs/porting.md)."""
    from kubedl_prefect.spec.porting import dump_imported, import_manifests
    from kubedl_prefect.spec.reader import MANIFEST_LIMITS

    _one_stdin(manifests)
    imported: list[ImportedSpec] = []
    failed: ExitCode | None = None
    for path in manifests:
        try:
            text, source = read_input(path, max_bytes=MANIFEST_LIMITS.max_bytes)
            items = import_manifests(text, dialect=dialect, source=source)
        except (UnreadableSpecError, SpecError) as exc:
            failed = max(failed or ExitCode.OK, _report(exc))
            continue
        for item in items:
            _warn(item.warnings, f"{_shown(path)}: {item.kind} {item.name!r}: ")
        imported += items
    if failed is not None:
        raise typer.Exit(failed)
    if output == "json":
        from kubedl_prefect.spec.io import spec_to_data

        _echo_json(
            [
                {
                    "kind": item.kind,
                    "name": item.name,
                    "namespace": item.namespace,
                    "dialect": item.dialect.value,
                    "spec": spec_to_data(item.spec),
                    "notes": [{"path": note.path, "text": note.text} for note in item.notes],
                }
                for item in imported
            ]
        )
        return
    typer.echo(dump_imported(imported), nl=False)


def _report(exc: UnreadableSpecError | SpecError) -> ExitCode:
    """Print ``exc`` on stderr; return its exit code."""
    if isinstance(exc, UnreadableSpecError):
        typer.echo(f"error: {exc}", err=True)
        return ExitCode.USAGE
    typer.echo(f"error: {by_line(exc)}", err=True)
    return ExitCode.INVALID_SPEC


# --- runs: status, logs, cancel of a saved reference ------------------------------------------


def read_reference(given: str) -> JobRef:
    """The job reference in ``given``: a file, ``-`` (standard input) or the JSON text itself.

    The JSON may be a reference (``JobRef.to_json()``), a saved run (``TrainingJobRun.to_dict()``,
    whose ``ref`` it takes), a ``TrainingResult`` (its ``ref``: the final attempt), or a record
    that holds one of those as its ``result``.

    Raises:
        UnusableReferenceError: It cannot be read, is not JSON, or holds no reference.
    """
    from kubedl_prefect.lifecycle.backend import JobRef

    if given.lstrip().startswith("{"):
        text, where = given, "the reference given"
    else:
        try:
            text, where = read_input(given, max_bytes=MAX_REFERENCE_BYTES)
        except (UnreadableSpecError, SpecError) as exc:
            raise UnusableReferenceError(
                str(exc).replace("training-job spec", "reference")
            ) from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UnusableReferenceError(
            f"{where} is not JSON ({exc}); pass JobRef.to_json(), a saved run's to_dict() or a "
            "TrainingResult, as a file, - or the text"
        ) from exc
    try:
        return JobRef.from_dict(_unwrap_reference(data))
    except KubeDLPrefectError as exc:
        raise UnusableReferenceError(f"{where}: {exc}") from exc


def _unwrap_reference(data: Any) -> Any:
    """The reference's own data inside a saved run, a result, or a record of either."""
    for _ in range(3):
        if not isinstance(data, dict):
            return data
        result = data.get("result")
        if isinstance(result, str) and result.lstrip().startswith("{"):
            try:
                result = json.loads(result)
            except ValueError:
                return data
        if isinstance(data.get("ref"), dict):
            data = data["ref"]
        elif isinstance(result, dict) and "apiVersion" not in data:
            data = result
        else:
            return data
    return data


def backend_for(
    ref: JobRef,
    *,
    kubeconfig: Path | None = None,
    context: str | None = None,
    cluster: str | None = None,
) -> TrainingBackend:
    """A backend that can reach the job of ``ref``, on the reference's namespace and dialect.

    Args:
        ref: The job's reference.
        kubeconfig: The kubeconfig file to use (default: ``$KUBECONFIG``, ``~/.kube/config``,
            else the pod's ServiceAccount), as kubectl does.
        context: The kubeconfig context (default: the file's current one).
        cluster: Instead: a saved Prefect cluster block, by name (the flow's own credentials).

    Raises:
        UnusableReferenceError: The flags do not fit the reference, or the block cannot be loaded.
    """
    if cluster is not None:
        if kubeconfig is not None or context is not None:
            raise UnusableReferenceError(
                "--cluster names a saved block with its own credentials: pass it, or "
                "--kubeconfig/--context, not both"
            )
        from kubedl_prefect.prefect.blocks import load_cluster

        try:
            block = load_cluster(cluster)
        except KubeDLPrefectError as exc:
            raise UnusableReferenceError(str(exc)) from exc
        return block.backend(dialect=ref.dialect, namespace=ref.namespace)
    if ref.backend == "local":
        if kubeconfig is not None or context is not None:
            raise UnusableReferenceError(
                f"job {ref.name} ran on the local backend ({ref.cluster}); --kubeconfig and "
                "--context are for a Kubernetes cluster"
            )
        from kubedl_prefect.lifecycle.local import LocalBackend

        return LocalBackend(ref.namespace)
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend

    return KubernetesBackend(
        namespace=ref.namespace,
        dialect=ref.dialect,
        kubeconfig=str(kubeconfig) if kubeconfig is not None else None,
        context=context,
    )


@dataclass(frozen=True)
class JobState:
    """What ``kubedl-prefect status`` reports: the job's phase now, and why it ended.

    Args:
        ref: The reference (with the uid the cluster gave, if it lacked one).
        status: The job's status.
        admission: Whether its replicas are scheduled, while it has not ended.
        diagnosis: Why it failed, for a failed job.
        replayed: Read from the logical job's record (the job may be gone).
    """

    ref: JobRef
    status: JobStatus
    admission: AdmissionState | None
    diagnosis: Any
    replayed: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``--output json``)."""
        status = self.status
        return {
            "ref": self.ref.to_dict(),
            "phase": status.phase.value,
            "reason": status.reason,
            "message": status.message,
            "replicas": {
                role: dataclasses.asdict(counts) for role, counts in sorted(status.replicas.items())
            },
            "startTime": status.start_time,
            "completionTime": status.completion_time,
            "admission": None
            if self.admission is None
            else {"admitted": self.admission.admitted, "reason": self.admission.reason},
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(),
            "replayed": self.replayed,
        }

    def lines(self) -> list[str]:
        """The human-readable report."""
        ref, status = self.ref, self.status
        where = "" if ref.backend == "local" else f"{ref.namespace}/"
        said = ": ".join(part for part in (status.reason, status.message) if part)
        lines = [
            f"job:        {ref.kind} {where}{ref.name} (attempt {ref.attempt}, key {ref.key!r})",
            f"cluster:    {ref.cluster or '-'} ({ref.backend}, {ref.dialect} operator)",
            f"phase:      {status.phase.value}" + (f" ({said})" if said else ""),
        ]
        if self.admission is not None and not status.phase.terminal:
            admitted = "admitted" if self.admission.admitted else "not admitted"
            reason = f": {self.admission.reason}" if self.admission.reason else ""
            lines.append(f"admission:  {admitted}{reason}")
        counts = [
            f"{role} {c.active} active, {c.succeeded} succeeded, {c.failed} failed"
            for role, c in sorted(status.replicas.items())
        ]
        if counts:
            lines.append(f"replicas:   {'; '.join(counts)}")
        if status.start_time:
            lines.append(f"started:    {status.start_time}")
        if status.completion_time:
            lines.append(f"completed:  {status.completion_time}")
        if self.diagnosis is not None:
            lines.append(f"diagnosis:  {self.diagnosis.summary()}")
            if self.diagnosis.hint:
                lines.append(f"hint:       {self.diagnosis.hint}")
        if self.replayed:
            lines.append("(read from the run record: the job itself may be gone)")
        return lines


async def job_state(run: TrainingRun) -> JobState:
    """The phase of the job of ``run`` now, without changing anything about it.

    On Kubernetes the current phase is the first one the backend's phase stream yields (it reads
    no other objects and fails nothing); a job that has ended, or is gone with its end recorded,
    is read through ``wait_completed``, which returns at once, with the diagnosis. The local
    backend's ``wait_completed`` reports the current phase first: that is taken, and the wait
    is left.
    """
    import asyncio

    from kubedl_prefect.errors import JobCancelledError
    from kubedl_prefect.kube.runtime import KubeRuntime
    from kubedl_prefect.lifecycle.backend import PhaseUpdate, WaitTimeouts
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend

    unlimited = WaitTimeouts(
        admission_s=None, startup_s=None, completion_s=None, delete_on_timeout=False
    )
    backend = run.backend
    if isinstance(backend, KubernetesBackend):

        async def first() -> PhaseUpdate | None:
            phases = cast("AsyncGenerator[PhaseUpdate, None]", backend.phases(run.ref))
            try:
                return await anext(phases, None)
            finally:
                await phases.aclose()

        try:
            update = await KubeRuntime.get().run(first())
        except JobCancelledError:
            update = None  # gone: its end may be recorded
        if update is not None and not update.phase.terminal:
            return JobState(run.ref, update.status, update.admission, None, False)
        outcome = await run.wait_completed(timeouts=unlimited)
        return JobState(run.ref, outcome.status, None, outcome.diagnosis, outcome.replayed)

    loop = asyncio.get_running_loop()
    seen: asyncio.Future[PhaseUpdate] = loop.create_future()

    def keep_first(update: PhaseUpdate) -> None:
        if not seen.done():
            seen.set_result(update)

    def observed(update: PhaseUpdate) -> None:  # on a delivery thread
        loop.call_soon_threadsafe(keep_first, update)

    waiting = asyncio.ensure_future(run.wait_completed(timeouts=unlimited, on_phase=observed))
    either: set[asyncio.Future[Any]] = {waiting, seen}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if waiting.done() or seen.result().phase.terminal:  # ended: the outcome is on its way
        outcome = await waiting
        return JobState(run.ref, outcome.status, None, outcome.diagnosis, outcome.replayed)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    update = seen.result()
    return JobState(run.ref, update.status, update.admission, None, False)


RefArgument = Annotated[
    str,
    typer.Argument(
        help="The saved run reference: a JSON file, - for standard input, or the JSON text "
        "(JobRef.to_json(), a saved run's to_dict(), a TrainingResult).",
        metavar="REF",
        show_default=False,
    ),
]
KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster).",
        show_default=False,
    ),
]
ContextOption = Annotated[
    str | None, typer.Option("--context", help="Kubeconfig context (default: the current one).")
]
ClusterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="A saved Prefect cluster block (name or type-slug/name), instead of a kubeconfig: "
        "the credentials the flow used.",
    ),
]
RunOutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        help="text or json.",
        metavar=_metavar(("text", "json")),
        callback=_choice(("text", "json")),
    ),
]


def _on_run(
    reference: str,
    kubeconfig: Path | None,
    context: str | None,
    cluster: str | None,
    action: Callable[[TrainingRun], Any],
    *,
    gone: Callable[[JobRef], None] | None = None,
) -> Any:
    """Attach to the job of ``reference`` and await ``action`` on it; map errors to exit codes."""
    import asyncio

    from kubedl_prefect.errors import JobCancelledError
    from kubedl_prefect.lifecycle.run import areattach

    try:
        ref = read_reference(reference)
        backend = backend_for(ref, kubeconfig=kubeconfig, context=context, cluster=cluster)
    except UnusableReferenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from exc

    async def attached() -> Any:
        try:
            try:
                run = await areattach(ref, backend=backend)
            except JobCancelledError:
                if gone is None:
                    raise
                gone(ref)
                return None
            return await action(run)
        finally:
            await backend.close()

    try:
        return asyncio.run(attached())
    except KubeDLPrefectError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.JOB) from exc


@app.command("status")
def status_command(
    reference: RefArgument,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    cluster: ClusterOption = None,
    output: RunOutputOption = "text",
) -> None:
    """Show the phase of the job of a saved run reference (and why it failed, if it did)."""
    state: JobState = _on_run(reference, kubeconfig, context, cluster, job_state)
    if output == "json":
        _echo_json(state.to_dict())
    else:
        typer.echo("\n".join(state.lines()))


@app.command("logs")
def logs_command(
    reference: RefArgument,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    cluster: ClusterOption = None,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", help="Start each line with its RFC 3339 time.")
    ] = False,
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            help="text ([replica] line) or json (one object per line).",
            metavar=_metavar(("text", "json")),
            callback=_choice(("text", "json")),
        ),
    ] = "text",
) -> None:
    """Print every replica's log lines, each with its replica, following them until the job ends."""

    def text_of(line: LogLine) -> str:
        if output == "json":
            data = {
                "replica": line.replica,
                "container": line.container,
                "timestamp": line.timestamp,
                "attempt": line.attempt,
                "text": line.text,
            }
            return json.dumps(data, ensure_ascii=False)
        stamp = f"{line.timestamp} " if timestamps else ""
        return f"{stamp}[{line.replica}] {line.text}"

    async def follow(run: TrainingRun) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        following = asyncio.current_task()
        assert following is not None
        closed: list[bool] = []

        def show(line: LogLine) -> None:  # on a delivery thread, in order
            if closed:
                return
            try:
                typer.echo(text_of(line))
            except BrokenPipeError:  # `logs ... | head`: stop following, quietly
                closed.append(True)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                loop.call_soon_threadsafe(following.cancel)

        try:
            await run.follow_logs(show)
        except asyncio.CancelledError:
            if not closed:
                raise

    _on_run(reference, kubeconfig, context, cluster, follow)


@app.command("cancel")
def cancel_command(
    reference: RefArgument,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    cluster: ClusterOption = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0, help="Seconds to wait until its pods and PodGroups are gone."
        ),
    ] = 120.0,
) -> None:
    """Delete the job of a saved run reference and wait until its pods are gone (idempotent)."""

    def already_gone(ref: JobRef) -> None:
        typer.echo(f"{ref.kind} {ref.name} is already gone")

    async def cancel(run: TrainingRun) -> None:
        await run.cancel(timeout_s=timeout)
        typer.echo(f"{run.ref.kind} {run.ref.name} cancelled: its pods are gone")

    _on_run(reference, kubeconfig, context, cluster, cancel, gone=already_gone)


# --- the test bed ----------------------------------------------------------------------------


class LazyTestbedGroup(TyperGroup):
    """The ``testbed`` command group, whose commands are imported when it is used.

    Listing, resolving or running a command of the group imports
    :mod:`kubedl_prefect.testbed.cli` and takes its commands over, so ``testbed`` behaves (help,
    errors, exit codes) as that Typer app does; nothing is imported for other commands.
    """

    def _load(self) -> None:
        if not self.commands:
            try:
                from kubedl_prefect.testbed.cli import app as testbed_app
            except MissingExtraError as exc:
                # Without the extra `testbed`: its message and hint, as the group's errors are.
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from exc

            self.commands.update(typer.main.get_group(testbed_app).commands)

    def list_commands(self, ctx: Context) -> list[str]:
        """Names of the test bed's commands, in their order."""
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        """The test bed's command ``cmd_name``, if there is one."""
        self._load()
        return super().get_command(ctx, cmd_name)


app.add_typer(
    typer.Typer(help=TESTBED_HELP, no_args_is_help=True),
    name="testbed",
    cls=LazyTestbedGroup,
)


def main() -> None:
    """Entry point of the ``kubedl-prefect`` console script.

    Pydantic plugins (validation observers such as tracing) have nothing to observe in a command
    line, and finding them scans every installed distribution's entry points at the first
    validation; they are off in this process unless ``PYDANTIC_DISABLE_PLUGINS`` says otherwise.
    """
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    app()


if __name__ == "__main__":
    main()
