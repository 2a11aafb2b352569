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

Start-up matters (``validate`` runs in editors and pre-commit hooks). The package has three
parts: :mod:`.specs` does what ``validate`` and ``render`` do, without typer; :mod:`.commands`
is the typer app of every command (``app``); :mod:`.quick` reads a plain ``validate`` or
``render`` command line for the console script (:func:`main`), which then imports neither typer
nor the app, and hands any other to the app. Each command imports what it uses when it runs.
``bench/cli_startup.py`` measures the start; ``tests/unit/test_cli.py`` keeps the heavy modules
out of it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from kubedl_prefect.cli.specs import (
    DIALECTS,
    STDIN,
    ExitCode,
    UnreadableSpecError,
    by_line,
    issue_line,
    read_input,
    read_spec,
    read_spec_with_warnings,
    render_file,
    validate_file,
    warning_lines,
)

if TYPE_CHECKING:
    from kubedl_prefect.cli.commands import (
        MAX_REFERENCE_BYTES,
        TESTBED_HELP,
        JobState,
        UnusableReferenceError,
        app,
        backend_for,
        read_reference,
    )

#: Names of the typer app's module, imported from it on first use.
_FROM_COMMANDS = frozenset(
    {
        "MAX_REFERENCE_BYTES",
        "TESTBED_HELP",
        "JobState",
        "UnusableReferenceError",
        "app",
        "backend_for",
        "read_reference",
    }
)

__all__ = [
    "DIALECTS",
    "MAX_REFERENCE_BYTES",
    "STDIN",
    "TESTBED_HELP",
    "ExitCode",
    "JobState",
    "UnreadableSpecError",
    "UnusableReferenceError",
    "app",
    "backend_for",
    "by_line",
    "issue_line",
    "main",
    "read_input",
    "read_reference",
    "read_spec",
    "read_spec_with_warnings",
    "render_file",
    "validate_file",
    "warning_lines",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_COMMANDS:
        from kubedl_prefect.cli import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Entry point of the ``kubedl-prefect`` console script.

    A plain ``validate`` or ``render`` command line runs on the quick path
    (:func:`kubedl_prefect.cli.quick.run_quickly`); any other goes to the typer app.

    Pydantic plugins (validation observers such as tracing) have nothing to observe in a command
    line, and finding them scans every installed distribution's entry points at the first
    validation; they are off in this process unless ``PYDANTIC_DISABLE_PLUGINS`` says otherwise.
    """
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from kubedl_prefect.cli.quick import run_quickly

    code = run_quickly(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from kubedl_prefect.cli.commands import app

    app()
