"""The quick path of the console script: ``validate`` and ``render`` without typer.

Importing typer and building its parameters (typer coerces each one through a pydantic
``TypeAdapter``) takes about a third of a ``kubedl-prefect validate`` start. Editors and
pre-commit hooks run ``validate`` on every save, so the console script reads a plain
``validate``/``render`` command line itself and runs the same functions as the typer commands
(:mod:`kubedl_prefect.cli.specs`). Anything else, or anything it does not read exactly (help, an
unknown or repeated option, a wrong choice, a missing value, ``--``, two ``-``), goes to the typer
app, which prints its usage and messages as always: the quick path declines rather than guesses.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from kubedl_prefect.cli.specs import DIALECTS, ExitCode, echo, render_specs, validate_specs

# Records of this module are a named tuple and a plain class, not dataclasses: making a dataclass
# (its methods are generated and compiled) costs the start they are here to shorten.


class _Option(NamedTuple):
    """An option that takes one value: its keyword, and the values it accepts (any if none)."""

    key: str
    choices: tuple[str, ...] = ()


_VALIDATE: Mapping[str, _Option] = {
    "--dialect": _Option("dialect", DIALECTS),
    "-d": _Option("dialect", DIALECTS),
    "--output": _Option("output", ("text", "json")),
    "-o": _Option("output", ("text", "json")),
}
_RENDER: Mapping[str, _Option] = {
    "--dialect": _Option("dialect", DIALECTS),
    "-d": _Option("dialect", DIALECTS),
    "--output": _Option("output", ("yaml", "json")),
    "-o": _Option("output", ("yaml", "json")),
    "--namespace": _Option("namespace"),
    "-n": _Option("namespace"),
    "--name-key": _Option("name_key"),
    "--attempt": _Option("attempt"),
}
_OPTIONS: Mapping[str, Mapping[str, _Option]] = {"validate": _VALIDATE, "render": _RENDER}

_ATTEMPT = re.compile(r"[0-9]{1,2}")


class CommandLine:
    """A ``validate`` or ``render`` command line as the quick path read it."""

    __slots__ = ("command", "options", "specs")

    def __init__(
        self,
        command: str,
        specs: list[Path] | None = None,
        options: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.specs: list[Path] = [] if specs is None else specs
        self.options: dict[str, str] = {} if options is None else options

    def __repr__(self) -> str:
        return (
            f"CommandLine(command={self.command!r}, specs={self.specs!r}, options={self.options!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommandLine):
            return NotImplemented
        return (self.command, self.specs, self.options) == (
            other.command,
            other.specs,
            other.options,
        )


def parse(argv: Sequence[str]) -> CommandLine | None:
    """Read ``argv`` (without the program name); ``None`` unless it is a plain command line.

    Example:
        >>> parse(["render", "a.yaml", "-d", "KubeDL"])
        CommandLine(command='render', specs=[PosixPath('a.yaml')], options={'dialect': 'kubedl'})
        >>> parse(["render", "a.yaml"]) is None  # typer says that --dialect is missing
        True
        >>> parse(["validate", "a.yaml", "--dialect", "kubdl"]) is None  # and suggests kubedl
        True
    """
    if not argv or argv[0] not in _OPTIONS:
        return None
    known = _OPTIONS[argv[0]]
    line = CommandLine(argv[0])
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg == "-" or (arg and not arg.startswith("-")):
            line.specs.append(Path(arg))
            continue
        name, equals, value = arg.partition("=")
        if not equals:
            if not rest:
                return None
            value = rest.pop(0)
        option = known.get(name)
        if option is None or (equals and not name.startswith("--")):
            return None
        if not value or value.startswith("-") or option.key in line.options:
            return None
        if option.choices:
            value = value.strip().lower()
            if value not in option.choices:
                return None
        line.options[option.key] = value
    return line if _complete(line) else None


def _complete(line: CommandLine) -> bool:
    """Whether typer would run ``line`` as it is, without a usage error of its own."""
    if not line.specs or sum(1 for path in line.specs if str(path) == "-") > 1:
        return False
    if line.command == "validate":
        return True
    attempt = line.options.get("attempt")
    if attempt is not None and (
        "name_key" not in line.options
        or not _ATTEMPT.fullmatch(attempt)
        or not 1 <= int(attempt) <= 99
    ):
        return False
    return "dialect" in line.options


def _runner(line: CommandLine) -> Callable[[], ExitCode]:
    options = line.options
    if line.command == "validate":
        return lambda: validate_specs(
            line.specs, options.get("dialect"), options.get("output", "text")
        )
    return lambda: render_specs(
        line.specs,
        options["dialect"],
        name_key=options.get("name_key"),
        attempt=int(options.get("attempt", "1")),
        namespace=options.get("namespace"),
        output=options.get("output", "yaml"),
    )


class _QuietFlush:
    """A stream whose flush ignores a closed pipe, so that the exit says nothing more."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise


#: Pydantic's plugin finder, which imports ``importlib.metadata`` (email, zipfile, socket...) at
#: the first validation even when ``PYDANTIC_DISABLE_PLUGINS`` turns every plugin off.
_PLUGIN_LOADER = "pydantic.plugin._loader"
_PLUGINS_OFF = ("__all__", "1", "true")  # the values for which pydantic loads no plugin


class _NoPlugins(types.ModuleType):
    """Stands in for pydantic's plugin finder while every plugin is off: it finds none.

    Any other name is taken from the real module, loaded then (a later pydantic may ask for
    more than ``get_plugins``).
    """

    def __init__(self) -> None:
        super().__init__(_PLUGIN_LOADER)
        self._real: types.ModuleType | None = None

    @staticmethod
    def get_plugins() -> tuple[()]:
        """No plugins, as pydantic's own finder answers with ``PYDANTIC_DISABLE_PLUGINS`` set."""
        return ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system asking (__path__): none
            raise AttributeError(name)
        if self._real is None:
            import importlib.machinery
            import importlib.util

            import pydantic.plugin

            spec = importlib.machinery.PathFinder.find_spec(
                _PLUGIN_LOADER, list(pydantic.plugin.__path__)
            )
            if spec is None or spec.loader is None:
                raise AttributeError(name)
            self._real = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self._real)
        return getattr(self._real, name)


@contextmanager
def _without_plugin_discovery() -> Iterator[None]:
    """While plugins are off, skip importing what pydantic's plugin finder imports to find none.

    ``importlib.metadata`` is a tenth of a ``validate`` start, for an answer known in advance.
    The stand-in leaves ``sys.modules`` afterwards, so that a program that calls the console
    script's :func:`~kubedl_prefect.cli.main` keeps pydantic as it was.
    """
    if os.environ.get("PYDANTIC_DISABLE_PLUGINS") not in _PLUGINS_OFF or (
        _PLUGIN_LOADER in sys.modules
    ):
        yield
        return
    stand_in = _NoPlugins()
    sys.modules[_PLUGIN_LOADER] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(_PLUGIN_LOADER) is stand_in:
            del sys.modules[_PLUGIN_LOADER]


def run_quickly(argv: Sequence[str]) -> int | None:
    """Run a plain ``validate`` or ``render`` command line; its exit code, or ``None``.

    ``None``: the command line is not one the quick path reads (see :func:`parse`), or shell
    completion is asked for; nothing was done, and the typer app should run it. Interrupts and
    a closed output pipe end as typer ends them (exit 130, exit 1).
    """
    if any(name.startswith("_") and name.endswith("_COMPLETE") for name in os.environ):
        return None
    line = parse(argv)
    if line is None:
        return None
    try:
        with _without_plugin_discovery():
            return _runner(line)()
    except KeyboardInterrupt:
        return 130
    except EOFError:
        echo(err=True)
        echo("Aborted!", err=True)
        return 1
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        sys.stdout = _QuietFlush(sys.stdout)
        sys.stderr = _QuietFlush(sys.stderr)
        return 1
