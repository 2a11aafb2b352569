"""Loading specs from YAML and dumping specs and manifests to YAML.

YAML problems become :class:`~kubedl_prefect.errors.SpecError` with line numbers, and so do
spec problems: each issue names the field path and the line it is on. Duplicate keys, which
PyYAML would silently collapse to the last one, are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic.alias_generators import to_camel

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.model import SPEC_API_VERSION, SPEC_KIND, TrainingJobSpec
from kubedl_prefect.spec.validation import parse_spec

_LEADING_FIELDS: Final = ("apiVersion", "kind", "name", "framework")


def loads_spec(text: str, *, source: str | None = None) -> TrainingJobSpec:
    """Parse a spec from YAML text.

    Args:
        text: One YAML document.
        source: Where the text came from (a file name), for error messages.

    Raises:
        SpecError: If the YAML is malformed or the spec invalid; issues carry line numbers.

    Example:
        >>> loads_spec("{name: mnist, image: busybox, replicas: {master: 1}}").name
        'mnist'
    """
    node, data = _compose(text, source)
    return parse_spec(data, source=source, line_of=lambda loc: _line_of(node, loc))


def load_spec(path: str | Path) -> TrainingJobSpec:
    """Read and parse a spec file.

    Raises:
        SpecError: If the file cannot be read, is malformed YAML, or holds an invalid spec.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            [SpecIssue("(file)", f"cannot read {file}: {exc}", "check the path and permissions")],
            source=str(file),
        ) from exc
    return loads_spec(text, source=str(file))


def spec_to_data(spec: TrainingJobSpec) -> dict[str, Any]:
    """The spec as plain data in its YAML spelling, without fields left at their defaults."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    head = {"apiVersion": SPEC_API_VERSION, "kind": SPEC_KIND, "name": spec.name}
    head["framework"] = spec.framework.value
    data["replicas"] = {role: _role_data(fields) for role, fields in data["replicas"].items()}
    return head | {k: v for k, v in data.items() if k not in _LEADING_FIELDS}


def _role_data(fields: dict[str, Any]) -> Any:
    count = fields.pop("count", 1)
    if not fields:
        return count  # the `worker: 2` shorthand
    return {"count": count, **fields}


def dump_spec(spec: TrainingJobSpec) -> str:
    """The spec as a YAML document that :func:`loads_spec` reads back to an equal spec."""
    return dump_yaml(spec_to_data(spec))


def dump_yaml(data: Any) -> str:
    """Block-style YAML, keys in insertion order, long strings unwrapped."""
    return yaml.safe_dump(
        data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1_000_000
    )


def dump_manifests(manifests: Iterable[Mapping[str, Any]]) -> str:
    """Several manifests as one multi-document YAML stream (``---`` separated)."""
    return yaml.safe_dump_all(
        [dict(m) for m in manifests],
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1_000_000,
        explicit_start=True,
    )


def _compose(text: str, source: str | None) -> tuple[yaml.Node | None, Any]:
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # checks the characters already
        node = loader.get_single_node()
        if node is not None:
            _refuse_duplicate_keys(node)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        problem = exc.problem or exc.context or "malformed YAML"
        fix = (
            "keep only one" if isinstance(exc, _DuplicateKeyError) else "fix the YAML syntax there"
        )
        raise SpecError(
            [SpecIssue("(yaml)", f"{problem} at {where}", fix)],
            source=source,
        ) from exc
    except yaml.YAMLError as exc:
        raise SpecError(
            [SpecIssue("(yaml)", str(exc), "fix the YAML syntax")], source=source
        ) from exc
    finally:
        if loader is not None:
            loader.dispose()
    return node, data


class _DuplicateKeyError(yaml.MarkedYAMLError):
    pass


def _refuse_duplicate_keys(node: yaml.Node) -> None:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: dict[str, yaml.Node] = {}
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        first = seen[key.value].start_mark.line + 1
                        raise _DuplicateKeyError(
                            problem=f"duplicate key {key.value!r} (first given on line {first})",
                            problem_mark=key.start_mark,
                        )
                    seen[key.value] = key
                stack += [key, value]
        elif isinstance(current, yaml.SequenceNode):
            stack += current.value


def _line_of(node: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    """The line naming the field at ``loc`` (or its closest existing parent), 1-based."""
    if node is None:
        return None
    current, line = node, node.start_mark.line + 1
    for part in loc:
        if part == "[key]":
            break
        found = _child(current, part)
        if found is None:
            break
        key, current = found
        line = (key or current).start_mark.line + 1
    return line


def _child(node: yaml.Node, part: str | int) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
        return (None, node.value[part]) if 0 <= part < len(node.value) else None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and str(part) in (key.value, to_camel(key.value)):
                return key, value
    return None
