"""The typer app of the ``kubedl-prefect`` command line (see :mod:`kubedl_prefect.cli`).

Every command of ``docs/cli.md``. ``render`` and ``validate`` run the functions of
:mod:`kubedl_prefect.cli.specs`, which the console script's quick path runs too, without this
module. ``kubedl-prefect testbed ...`` are the commands of :mod:`kubedl_prefect.testbed.cli`,
imported only when one of them runs (or its help is asked for).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from typer._click.exceptions import MissingParameter
from typer.core import TyperGroup

from kubedl_prefect import __version__
from kubedl_prefect.cli.specs import (
    DIALECTS,
    ExitCode,
    UnreadableSpecError,
    echo_json,
    is_stdin,
    read_input,
    render_specs,
    report,
    shown,
    validate_specs,
    warn,
)
from kubedl_prefect.errors import KubeDLPrefectError, MissingExtraError, SpecError

if TYPE_CHECKING:
    from typer._click import Command, Context

    from kubedl_prefect.lifecycle.admission import AdmissionState
    from kubedl_prefect.lifecycle.backend import JobRef, LogLine, TrainingBackend
    from kubedl_prefect.lifecycle.run import TrainingRun
    from kubedl_prefect.lifecycle.status import JobStatus
    from kubedl_prefect.spec.porting import ImportedSpec

#: Help of the ``testbed`` group, shown by ``kubedl-prefect --help`` without importing the test
#: bed; the same as :data:`kubedl_prefect.testbed.cli.app`'s.
TESTBED_HELP = "A local Kubernetes test bed: real control plane, simulated GPU nodes, operators."

#: The most a run reference may be (a saved run or a TrainingResult is a few KiB).
MAX_REFERENCE_BYTES = 1 << 20

app = typer.Typer(
    name="kubedl-prefect",
    help="Distributed training on Kubernetes (KubeDL, Kubeflow) from Prefect flows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class UnusableReferenceError(Exception):
    """A run reference or the way to its cluster is not usable (a usage problem)."""


# --- choices, without typer's tabs or pydantic's wording ----------------------------------------

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


def _one_stdin(paths: Sequence[Path]) -> None:
    if sum(1 for path in paths if is_stdin(path)) > 1:
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
    code = render_specs(
        specs,
        dialect,
        name_key=name_key,
        attempt=attempt or 1,
        namespace=namespace,
        output=output,
    )
    if code != ExitCode.OK:
        raise typer.Exit(code)


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
    code = validate_specs(specs, dialect, output)
    if code != ExitCode.OK:
        raise typer.Exit(code)


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
            failed = max(failed or ExitCode.OK, report(exc))
            continue
        for item in items:
            warn(item.warnings, f"{shown(path)}: {item.kind} {item.name!r}: ")
        imported += items
    if failed is not None:
        raise typer.Exit(failed)
    if output == "json":
        from kubedl_prefect.spec.io import spec_to_data

        echo_json(
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
        echo_json(state.to_dict())
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


def testbed_missing(exc: ImportError) -> MissingExtraError:
    """What an import of the test bed that failed lacks, as the extra ``testbed`` error.

    The test bed is the distribution kubedl-prefect-testbed, which the extra installs: without
    it there is no :mod:`kubedl_prefect.testbed` at all; with it but without its own dependencies
    the package raises :class:`MissingExtraError` itself. Any other import error is re-raised.
    """
    if isinstance(exc, MissingExtraError):
        return exc
    if isinstance(exc, ModuleNotFoundError) and exc.name == "kubedl_prefect.testbed":
        return MissingExtraError(
            "the test bed (kubedl_prefect.testbed)",
            extra="testbed",
            missing=["kubedl-prefect-testbed"],
        )
    raise exc


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
            except ImportError as exc:
                # Without the extra `testbed`: its message and hint, as the group's errors are.
                missing = testbed_missing(exc)
                typer.echo(f"error: {missing}", err=True)
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
