"""What ``validate`` and ``render`` do, without typer: reading specs, reports, exit codes.

The typer commands (:mod:`kubedl_prefect.cli.commands`) and the quick path of the console
script (:mod:`kubedl_prefect.cli.quick`) both run these functions, so the two print the same
lines and exit with the same codes. This module imports only the error tree at import time;
the spec layer when a command runs.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kubedl_prefect.errors import SpecError, SpecIssue

if TYPE_CHECKING:
    from kubedl_prefect.spec import Dialect, PodSecurityFinding, TrainingJobSpec

#: What ``-`` stands for in messages.
STDIN = "<stdin>"

#: The operators ``render`` and ``validate --dialect`` accept.
DIALECTS = ("kubedl", "kubeflow", "trainer")


class ExitCode(IntEnum):
    """Exit codes of the command line."""

    OK = 0
    INVALID_SPEC = 1
    USAGE = 2
    JOB = 3


class UnreadableSpecError(Exception):
    """A file could not be read (a usage problem, not an invalid spec)."""


# --- output, as click.echo writes it -------------------------------------------------------------

#: What click strips from output that is not a terminal (a colour or cursor sequence).
_ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")


def _ascii_stream(stream: TextIO) -> bool:
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "ascii").name == "ascii"
    except LookupError:
        return False


def echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Write ``message`` (and a newline) to stdout or stderr and flush, as ``typer.echo`` does.

    Colour sequences are dropped where the stream is not a terminal. A stream set up for ASCII
    only is left to typer, which writes UTF-8 to it: the same bytes with or without typer.
    """
    stream = sys.stderr if err else sys.stdout
    if stream is None:  # no console (pythonw): nothing to write to, as click
        return
    if _ascii_stream(stream):
        import typer

        typer.echo(message, err=err, nl=nl)
        return
    text = message + "\n" if nl else message
    try:
        terminal = stream.isatty()
    except Exception:  # a replaced stream that cannot say: as click, not a terminal
        terminal = False
    if not terminal:
        text = _ANSI.sub("", text)
    if text:
        stream.write(text)
    stream.flush()


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    echo(json.dumps(data, indent=2, ensure_ascii=False))


# --- reading specs -------------------------------------------------------------------------------


def is_stdin(path: Path | str) -> bool:
    """Whether ``path`` stands for standard input (``-``)."""
    return str(path) == "-"


def shown(path: Path | str) -> str:
    """How messages name ``path``."""
    return STDIN if is_stdin(path) else str(path)


def read_input(path: Path | str, *, max_bytes: int) -> tuple[str, str]:
    """The text of the file at ``path`` (``-``: standard input) and how to name it.

    Raises:
        UnreadableSpecError: The file cannot be opened.
        SpecError: It is too large or not UTF-8 (path ``(file)``, with the line and column).
    """
    from kubedl_prefect.spec.reader import Limits, check_size, decode_text, read_text_file

    if is_stdin(path):
        data = sys.stdin.buffer.read(max_bytes + 1)
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


# --- reports -------------------------------------------------------------------------------------


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


def warn(warnings: Sequence[PodSecurityFinding], where: str) -> None:
    """Print the ``warning:`` lines of ``warnings`` on stderr."""
    for line in warning_lines(warnings, where):
        echo(line, err=True)


def report(exc: UnreadableSpecError | SpecError) -> ExitCode:
    """Print ``exc`` on stderr; return its exit code."""
    if isinstance(exc, UnreadableSpecError):
        echo(f"error: {exc}", err=True)
        return ExitCode.USAGE
    echo(f"error: {by_line(exc)}", err=True)
    return ExitCode.INVALID_SPEC


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


# --- render --------------------------------------------------------------------------------------


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
    validate(spec, dialect, source=shown(path))  # the operator's rules, naming the file
    warn(warnings, f"{shown(path)}: ")
    name = job_name(spec.name, name_key, attempt) if name_key is not None else None
    manifest = dict(render(spec, dialect, RenderOptions(job_name=name, namespace=namespace)))
    if str(dialect) == "trainer":  # what a TrainJob runs differently, on stderr
        from kubedl_prefect.spec.renderers.trainer import trainer_notes

        for field, text in trainer_notes(spec):
            echo(f"note: {shown(path)}: {field}: {text}", err=True)
    return manifest


def render_specs(
    specs: Sequence[Path],
    dialect: str,
    *,
    name_key: str | None = None,
    attempt: int = 1,
    namespace: str | None = None,
    output: str = "yaml",
) -> ExitCode:
    """``kubedl-prefect render``: print every manifest, or nothing and each spec's problems."""
    manifests: list[dict[str, Any]] = []
    failed: ExitCode | None = None
    for path in specs:
        try:
            manifests.append(_render_one(path, dialect, name_key, attempt, namespace))
        except (UnreadableSpecError, SpecError) as exc:
            failed = max(failed or ExitCode.OK, report(exc))
    if failed is not None:
        return failed
    if output == "json":
        if len(manifests) == 1:
            echo_json(manifests[0])
        else:
            echo_json({"apiVersion": "v1", "kind": "List", "items": manifests})
        return ExitCode.OK
    from kubedl_prefect.spec.io import dump_manifests

    echo(dump_manifests(manifests), nl=False)
    return ExitCode.OK


# --- validate ------------------------------------------------------------------------------------


def validate_file(path: Path, dialect: Dialect | str | None = None) -> TrainingJobSpec:
    """Check the spec file at ``path`` (for ``dialect`` too, when given) and return the spec.

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: Listing every problem, each with its field path and fix.
    """
    spec, warnings = _validated(path, dialect)
    warn(warnings, f"{shown(path)}: ")
    return spec


def _validated(
    path: Path, dialect: Dialect | str | None
) -> tuple[TrainingJobSpec, list[PodSecurityFinding]]:
    from kubedl_prefect.spec.validation import validate

    spec, warnings = read_spec_with_warnings(path)
    validate(spec, dialect, source=shown(path))
    return spec, warnings


def validate_specs(specs: Sequence[Path], dialect: str | None, output: str = "text") -> ExitCode:
    """``kubedl-prefect validate``: one verdict per spec (text lines, or one JSON report)."""
    scope = (
        f"for {dialect}"
        if dialect is not None
        else "(operator-specific checks skipped: add --dialect kubedl, kubeflow or trainer)"
    )
    results: list[dict[str, Any]] = []
    worst = ExitCode.OK
    for path in specs:
        result: dict[str, Any] = {
            "file": shown(path),
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
                report(exc)
            continue
        except SpecError as exc:
            worst = max(worst, ExitCode.INVALID_SPEC)
            result["problems"] = [_issue_data(issue) for issue in by_line(exc).issues]
            if output == "text":
                report(exc)
            continue
        result.update(valid=True, framework=spec.framework.value, name=spec.name)
        result["warnings"] = [_finding_data(w) for w in warnings]
        if output == "text":
            warn(warnings, f"{shown(path)}: ")
            echo(f"OK: {shown(path)}: {spec.framework.value} job {spec.name!r} is valid {scope}")
    if output == "json":
        echo_json({"valid": worst == ExitCode.OK, "results": results})
    return worst
