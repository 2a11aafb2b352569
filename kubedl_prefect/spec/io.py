"""Loading specs from YAML and dumping specs and manifests to YAML.

Reading goes through :mod:`kubedl_prefect.spec.reader`: bounded in size, alias expansion and
depth, strict about scalars YAML 1.1 and 1.2 read differently, and about duplicate keys. YAML
problems become :class:`~kubedl_prefect.errors.SpecError` with line and column numbers, and so do
spec problems: each issue names the field path and the line it is on.

Dumping quotes every string that some YAML reader could take for something else (``yes``,
``y``, ``0755``, ``1:30``...), so that kubectl and our reader read the output alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic.alias_generators import to_camel

from kubedl_prefect.spec.model import SPEC_API_VERSION, SPEC_KIND, TrainingJobSpec
from kubedl_prefect.spec.reader import (
    SPEC_LIMITS,
    SourceFloat,
    SourceInt,
    is_ambiguous_text,
    parse_document,
    read_text_file,
)
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
    node, data = parse_document(text, source=source, limits=SPEC_LIMITS)
    return parse_spec(data, source=source, line_of=lambda loc: _line_of(node, loc))


def load_spec(path: str | Path) -> TrainingJobSpec:
    """Read and parse a spec file (at most :data:`~kubedl_prefect.spec.reader.MAX_SPEC_BYTES`).

    Raises:
        SpecError: If the file cannot be read, is too large or not UTF-8 (path ``(file)``), is
            malformed YAML, or holds an invalid spec.
    """
    file = Path(path)
    return loads_spec(read_text_file(file, SPEC_LIMITS), source=str(file))


def spec_to_data(spec: TrainingJobSpec) -> dict[str, Any]:
    """The spec as plain data in its YAML spelling, without fields left at their defaults.

    Literal environment values are written as plain strings (``LOGLEVEL: DEBUG``), and a role's
    ``count`` and ``restartPolicy`` come first.
    """
    data = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    head = {"apiVersion": SPEC_API_VERSION, "kind": SPEC_KIND, "name": spec.name}
    head["framework"] = spec.framework.value
    _literal_env(data)
    data["replicas"] = {role: _role_data(fields) for role, fields in data["replicas"].items()}
    return head | {k: v for k, v in data.items() if k not in _LEADING_FIELDS}


def _literal_env(data: dict[str, Any]) -> None:
    for settings in [data, *data.get("replicas", {}).values()]:
        env = settings.get("env")
        if isinstance(env, dict):
            settings["env"] = {
                name: value["value"] if set(value) == {"value"} else value
                for name, value in env.items()
            }


def _role_data(fields: dict[str, Any]) -> Any:
    count = fields.pop("count", 1)
    if not fields:
        return count  # the `worker: 2` shorthand
    first = {"count": count}
    if "restartPolicy" in fields:
        first["restartPolicy"] = fields.pop("restartPolicy")
    return first | fields


def dump_spec(spec: TrainingJobSpec) -> str:
    """The spec as a YAML document that :func:`loads_spec` reads back to an equal spec."""
    return dump_yaml(spec_to_data(spec))


def dump_yaml(data: Any) -> str:
    """Block-style YAML, keys in insertion order, long strings unwrapped, ambiguous text quoted.

    Example:
        >>> print(dump_yaml({"debug": "y", "mode": "0755", "count": 1}), end="")
        debug: 'y'
        mode: '0755'
        count: 1
    """
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1_000_000,
    )


def dump_manifests(manifests: Iterable[Mapping[str, Any]]) -> str:
    """Several manifests as one multi-document YAML stream (``---`` separated)."""
    return yaml.dump_all(
        [dict(m) for m in manifests],
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1_000_000,
        explicit_start=True,
    )


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting strings that YAML 1.1 or 1.2 would read as non-strings."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        if is_ambiguous_text(data):
            return self.represent_scalar("tag:yaml.org,2002:str", data, style="'")
        return super().represent_str(data)


_Dumper.add_representer(str, _Dumper.represent_str)
_Dumper.add_representer(SourceInt, yaml.SafeDumper.represent_int)
_Dumper.add_representer(SourceFloat, yaml.SafeDumper.represent_float)


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
