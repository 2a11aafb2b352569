"""The ``kubedl-prefect`` command line: render and validate training-job specs; the test bed.

A thin layer over :mod:`kubedl_prefect.spec`; ``docs/cli.md`` documents the commands, their
messages and exit codes:

- ``0``: success (``render`` printed the manifest, ``validate`` printed one OK line);
- ``1``: the spec is invalid (malformed YAML included); each problem on stderr names the field;
- ``2``: usage error (unknown option, bad value) or a spec file that cannot be read.

``kubedl-prefect testbed ...`` are the commands of :mod:`kubedl_prefect.testbed.cli`, imported
only when one of them runs (or its help is asked for): ``render`` and ``validate`` load neither
the test bed nor the Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from typer.core import TyperGroup

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    Dialect,
    RenderOptions,
    TrainingJobSpec,
    dump_manifests,
    job_name,
    loads_spec,
    render,
    validate,
)
from kubedl_prefect.spec.porting import DialectChoice, import_file
from kubedl_prefect.spec.reader import SPEC_LIMITS, read_text_file

if TYPE_CHECKING:
    from typer._click import Command, Context

_T = TypeVar("_T")

#: Help of the ``testbed`` group, shown by ``kubedl-prefect --help`` without importing the test
#: bed; the same as :data:`kubedl_prefect.testbed.cli.app`'s.
TESTBED_HELP = "A local Kubernetes test bed: real control plane, simulated GPU nodes, operators."


class ExitCode(IntEnum):
    """Exit codes of the command line."""

    OK = 0
    INVALID_SPEC = 1
    USAGE = 2


app = typer.Typer(
    name="kubedl-prefect",
    help="Distributed training on Kubernetes (KubeDL, Kubeflow) from Prefect flows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class UnreadableSpecError(Exception):
    """The spec file could not be read (a usage problem, not an invalid spec)."""


def read_spec(path: Path) -> TrainingJobSpec:
    """Read and parse the spec file at ``path``.

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: If it is malformed YAML or an invalid spec.
    """
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise UnreadableSpecError(f"cannot read {path}: {exc.strerror or exc}") from exc
    # Size limit, and text that is not UTF-8 reported with its line, column and fix.
    text = read_text_file(path, SPEC_LIMITS)
    return loads_spec(text, source=str(path))


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
        path: The spec file.
        dialect: ``kubedl`` or ``kubeflow``.
        name_key: When given, the job is named like the lifecycle names it:
            :func:`~kubedl_prefect.spec.job_name` of the spec name, this key and ``attempt``.
        attempt: The attempt number for the name (with ``name_key``).
        namespace: ``metadata.namespace`` of the manifest, if given.

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: If the spec is invalid, or does not fit the operator.
    """
    spec = read_spec(path)
    name = job_name(spec.name, name_key, attempt) if name_key is not None else None
    manifest = render(spec, dialect, RenderOptions(job_name=name, namespace=namespace))
    return dump_manifests([manifest])


def validate_file(path: Path, dialect: Dialect | str | None = None) -> TrainingJobSpec:
    """Check the spec file at ``path`` (for ``dialect`` too, when given) and return the spec.

    Raises:
        UnreadableSpecError: If the file cannot be read.
        SpecError: Listing every problem, each with its field path and fix.
    """
    spec = read_spec(path)
    validate(spec, dialect, source=str(path))
    return spec


SpecArgument = Annotated[
    Path, typer.Argument(help="The training-job spec (YAML).", metavar="SPEC", show_default=False)
]


@app.command("render")
def render_command(
    spec: SpecArgument,
    dialect: Annotated[
        Dialect,
        typer.Option("--dialect", "-d", help="The operator to render for.", case_sensitive=False),
    ],
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
) -> None:
    """Print the custom resource for SPEC as YAML on stdout."""
    if attempt is not None and name_key is None:
        raise typer.BadParameter("--attempt needs --name-key", param_hint="--attempt")
    text = _run(
        lambda: render_file(
            spec, dialect, name_key=name_key, attempt=attempt or 1, namespace=namespace
        )
    )
    typer.echo(text, nl=False)


@app.command("validate")
def validate_command(
    spec: SpecArgument,
    dialect: Annotated[
        Dialect | None,
        typer.Option(
            "--dialect",
            "-d",
            help="Also check the rules of this operator.",
            case_sensitive=False,
        ),
    ] = None,
) -> None:
    """Check SPEC; print one OK line, or every problem (field, problem, fix) on stderr."""
    parsed = _run(lambda: validate_file(spec, dialect))
    scope = (
        f"for {dialect.value}"
        if dialect is not None
        else "(operator-specific checks skipped: add --dialect kubedl or --dialect kubeflow)"
    )
    typer.echo(f"OK: {spec}: {parsed.framework.value} job {parsed.name!r} is valid {scope}")


@app.command("import")
def import_command(
    manifest: Annotated[
        Path,
        typer.Argument(
            help="KubeDL or Kubeflow job manifests (YAML, one or several documents).",
            metavar="MANIFEST",
            show_default=False,
        ),
    ],
    dialect: Annotated[
        DialectChoice,
        typer.Option(
            "--dialect",
            "-d",
            help="The manifests' operator; auto: read it from each apiVersion.",
            case_sensitive=False,
        ),
    ] = DialectChoice.AUTO,
) -> None:
    """Print a training-job spec for each job in MANIFEST (see docs/porting.md)."""
    if not manifest.is_file():
        _run(lambda: _unreadable(manifest))
    typer.echo(_run(lambda: import_file(manifest, dialect)), nl=False)


def _unreadable(path: Path) -> None:
    raise UnreadableSpecError(f"cannot read {path}: no such file")


def _run(action: Callable[[], _T]) -> _T:
    """Run ``action``; turn our errors into messages on stderr and the documented exit codes."""
    try:
        return action()
    except UnreadableSpecError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from exc
    except SpecError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.INVALID_SPEC) from exc


class LazyTestbedGroup(TyperGroup):
    """The ``testbed`` command group, whose commands are imported when it is used.

    Listing, resolving or running a command of the group imports
    :mod:`kubedl_prefect.testbed.cli` and takes its commands over, so ``testbed`` behaves (help,
    errors, exit codes) as that Typer app does; nothing is imported for other commands.
    """

    def _load(self) -> None:
        if not self.commands:
            from kubedl_prefect.testbed.cli import app as testbed_app

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
    """Entry point of the ``kubedl-prefect`` console script."""
    app()
