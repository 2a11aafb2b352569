"""Validation before submission: spec data in, a valid spec or one :class:`SpecError` out.

:func:`parse_spec` builds a :class:`~kubedl_prefect.spec.model.TrainingJobSpec` from plain data
(a YAML document, a dict) and translates pydantic's errors into
:class:`~kubedl_prefect.errors.SpecIssue` objects: a dotted field path in the spec's own
(camelCase) spelling, the problem, and a fix, with "did you mean" for misspelt fields.
:func:`validate` adds the checks that depend on the operator.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.checks import dialect_issues
from kubedl_prefect.spec.fields import LazyModel
from kubedl_prefect.spec.model import TrainingJobSpec
from kubedl_prefect.spec.paths import format_path, parse_path
from kubedl_prefect.spec.reader import source_text
from kubedl_prefect.spec.types import Dialect

__all__ = [
    "LineOf",
    "as_dialect",
    "format_path",
    "issues_from_validation_error",
    "parse_path",
    "parse_spec",
    "validate",
]

LineOf = Callable[[Sequence[str | int]], int | None]
"""Maps a location in the input document to its 1-based line number, when known."""


def parse_spec(
    data: Any, *, source: str | None = None, line_of: LineOf | None = None
) -> TrainingJobSpec:
    """Build a spec from plain data, or raise one :class:`SpecError` listing every problem.

    Args:
        data: The spec as a mapping (camelCase keys, as in YAML; snake_case is accepted too).
        source: Where the data came from (a file name), for the error message.
        line_of: Maps a field location to a line number, added to each problem when known.

    Raises:
        SpecError: If the data is not a valid spec; nothing else is raised.

    Example:
        >>> spec = parse_spec({"name": "mnist", "image": "busybox", "replicas": {"master": 1}})
        >>> spec.replicas["master"].count
        1
    """
    if not isinstance(data, Mapping):
        raise SpecError(
            [
                SpecIssue(
                    "(document)",
                    f"the spec must be a mapping of fields, not {type(data).__name__}",
                    "start the document with fields such as `name:`, `image:` and `replicas:`",
                )
            ],
            source=source,
        )
    try:
        return TrainingJobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(issues_from_validation_error(exc, line_of=line_of), source=source) from exc


def validate(
    spec: TrainingJobSpec, dialect: Dialect | str | None = None, *, source: str | None = None
) -> None:
    """Check ``spec`` for the operator of ``dialect`` (only dialect-free rules when ``None``).

    The model already enforces the dialect-free rules when it is built; this adds the
    operator's own (KubeDL needs a PyTorch ``Master`` and has no elastic policy, ...) and checks
    the manifest it renders to: every container has an image, and the object is small enough
    for the API server (see :data:`kubedl_prefect.spec.renderers.MAX_MANIFEST_BYTES`).

    Args:
        spec: The spec to check.
        dialect: ``kubedl`` or ``kubeflow``; ``None`` adds nothing to the model's own checks.
        source: Where the spec came from, for the error message (default: its name).

    Raises:
        SpecError: Listing every problem, each with its field path and fix.
    """
    if dialect is None:
        return
    chosen = as_dialect(dialect)
    issues = dialect_issues(spec, chosen)
    if not issues:
        from kubedl_prefect.spec.renderers import manifest_issues, render_unchecked

        issues = manifest_issues(render_unchecked(spec, chosen))
    if issues:
        where = source or spec.name
        raise SpecError(issues, source=f"{where} (for {chosen.value})")


def as_dialect(value: Dialect | str) -> Dialect:
    """``value`` as a :class:`Dialect`.

    Raises:
        SpecError: If it names no dialect.
    """
    try:
        return Dialect(value)
    except ValueError:
        choices = ", ".join(d.value for d in Dialect)
        raise SpecError(
            [SpecIssue("dialect", f"unknown dialect {value!r}", f"use one of: {choices}")]
        ) from None


def issues_from_validation_error(
    exc: ValidationError, *, line_of: LineOf | None = None
) -> list[SpecIssue]:
    """Translate pydantic's errors on a :class:`TrainingJobSpec` into spec issues."""
    issues: list[SpecIssue] = []
    for error in exc.errors(include_url=False):
        ctx = error.get("ctx") or {}
        if error["type"] == "spec_issues":
            for issue in ctx["issues"]:
                line = line_of(parse_path(issue.path)) if line_of is not None else None
                if line is not None:
                    issue = SpecIssue(issue.path, f"{issue.problem} (line {line})", issue.fix)
                issues.append(issue)
            continue
        loc = tuple(error["loc"])
        path = format_path(loc)
        problem, fix = _describe(error, loc)
        line = line_of(loc) if line_of is not None else None
        if line is not None:
            problem = f"{problem} (line {line})"
        issues.append(SpecIssue(path, problem, fix))
    return issues


def _describe(error: ErrorDetails, loc: tuple[str | int, ...]) -> tuple[str, str]:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "spec_field":
        return str(ctx["problem"]), str(ctx["fix"])
    if kind == "extra_forbidden":
        field = str(loc[-1])
        known = _known_fields(loc[:-1])
        import difflib  # here, not at the top: kubedl-prefect validate starts sooner

        close = difflib.get_close_matches(field, known, n=1, cutoff=0.6)
        if len(loc) == 3 and loc[0] == "replicas" and field in _known_fields(()):
            return (
                f"{field!r} is a setting of the whole job, not of one role",
                f"move {field} to the top level of the spec",
            )
        if close:
            fix = f"did you mean `{close[0]}`?"
        elif known:
            fix = f"remove it; the fields here are: {', '.join(known)}"
        else:
            fix = "remove it"
        return f"unknown field {field!r}", fix
    if kind == "missing":
        return "this field is required", f"add `{loc[-1]}`"
    if kind in {"enum", "literal_error"}:
        expected = str(ctx.get("expected", ""))
        given = error.get("input")
        if loc and loc[-1] == "[key]":
            choices = re.findall(r"'([^']*)'", expected)
            import difflib

            close = difflib.get_close_matches(str(given), choices, n=1, cutoff=0.5)
            hint = f"did you mean `{close[0]}`? " if close else ""
            return f"{given!r} is not allowed here", f"{hint}use one of: {expected}"
        return f"{given!r} is not allowed", f"use {expected}"
    typed = _wrong_type(kind, error.get("input"))
    if typed is not None:
        return typed
    return error["msg"], _generic_fix(kind, ctx)


def _wrong_type(kind: str, given: Any) -> tuple[str, str] | None:
    """Problem and fix for a value of the wrong scalar type, naming what was given."""
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        if isinstance(given, bool):
            return (
                f"{str(given).lower()} is a boolean, where a whole number goes",
                "write a whole number, e.g. 1 (YAML reads true and false as booleans)",
            )
        if isinstance(given, str):
            return (
                f"{given!r} is text, where a whole number goes",
                "write the whole number unquoted",
            )
        if isinstance(given, float):
            return f"{given} is not a whole number", "write a whole number, without a decimal point"
    if kind == "bool_type" and not isinstance(given, bool):
        return f"{given!r} is not true or false", "write true or false (unquoted)"
    if kind == "string_type" and isinstance(given, bool | int | float):
        shown = str(given).lower() if isinstance(given, bool) else source_text(given)
        what = "a boolean" if isinstance(given, bool) else "a number"
        return f"{shown} is {what}, where text goes", f"quote it: '{shown}'"
    return None


def _generic_fix(kind: str, ctx: Mapping[str, Any]) -> str:
    bounds = {
        "greater_than_equal": "a value of at least {ge}",
        "greater_than": "a value greater than {gt}",
        "less_than_equal": "a value of at most {le}",
        "less_than": "a value less than {lt}",
        "too_short": "at least {min_length} item(s)",
        "too_long": "at most {max_length} item(s)",
        "string_too_short": "a non-empty value",
    }
    if kind in bounds:
        return "use " + bounds[kind].format(**ctx)
    kinds = {
        "string_type": "a string (quote it in YAML)",
        "int_type": "a whole number",
        "int_parsing": "a whole number",
        "int_from_float": "a whole number",
        "bool_type": "true or false",
        "bool_parsing": "true or false",
        "list_type": "a list (`- item` lines)",
        "dict_type": "a mapping (`key: value` lines)",
        "model_type": "a mapping (`key: value` lines)",
        "model_attributes_type": "a mapping (`key: value` lines)",
    }
    if kind in kinds:
        return "write " + kinds[kind]
    return "see docs/spec.md for this field"


def _known_fields(loc: Sequence[str | int]) -> list[str]:
    """The field names (aliases) accepted at ``loc``, found by walking the model's types."""
    target: Any = TrainingJobSpec
    for part in loc:
        target = _step(target, part)
        if target is None:
            return []
    model = _model_in(target)
    if model is None:
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _step(annotation: Any, part: str | int) -> Any:
    model = _model_in(annotation)
    if model is not None:
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                lazy = [m for m in info.metadata if isinstance(m, LazyModel)]
                return lazy[0].model() if lazy else info.annotation
        return None
    for candidate in _unwrap(annotation):
        origin = typing.get_origin(candidate)
        args = typing.get_args(candidate)
        if origin is list and isinstance(part, int):
            return args[0]
        if origin is dict and isinstance(part, str):
            return args[1]
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _unwrap(annotation: Any) -> list[Any]:
    """The alternatives of an annotation, with ``Annotated`` and ``Optional`` peeled off.

    A :class:`~kubedl_prefect.spec.fields.LazyModel` field stands for its model (imported by
    then: the value was validated).
    """
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        lazy = [m for m in metadata if isinstance(m, LazyModel)]
        return [lazy[0].model()] if lazy else _unwrap(base)
    if origin in (typing.Union, types.UnionType):
        return [alt for arg in typing.get_args(annotation) for alt in _unwrap(arg)]
    return [annotation]
