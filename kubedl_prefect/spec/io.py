r"""Loading specs from YAML and dumping specs and manifests to YAML.

Reading goes through :mod:`kubedl_prefect.spec.reader`: bounded in size, alias expansion and
depth, strict about scalars YAML 1.1 and 1.2 read differently, and about duplicate keys. YAML
problems become :class:`~kubedl_prefect.errors.SpecError` with line and column numbers, and so do
spec problems: each issue names the field path and the line it is on.

Dumping quotes every string that some YAML reader could take for something else (``yes``,
``y``, ``0755``, ``1:30``...), so that kubectl and our reader read the output alike. It emits
with libyaml when PyYAML was built with it (PyYAML's pure-Python emitter was 4% of the work of a
``kubedl-prefect render``). Both emitters write the same text for every manifest and spec of the
golden files, and for any string but three kinds, which libyaml writes so that they read back to
the same data: a character above U+FFFF is escaped (``"\U0001F600"``), so are NEL and the line
and paragraph separators (``"\N"``, ``"\L"``; PyYAML's emitter folds them into text that
does not read back), and a mapping key that needs escapes is an explicit key (``? "a\rb"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml
from pydantic.alias_generators import to_camel

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.model import SPEC_API_VERSION, SPEC_KIND, TrainingJobSpec
from kubedl_prefect.spec.pod_security import PodSecurityFinding, pod_security_warnings
from kubedl_prefect.spec.reader import (
    SPEC_LIMITS,
    SourceFloat,
    SourceInt,
    is_ambiguous_text,
    parse_document,
    read_text_file,
)
from kubedl_prefect.spec.validation import parse_spec

_LEADING_FIELDS: Final = ("apiVersion", "kind", "name", "framework", "podSecurity")


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


def loads_spec_with_warnings(
    text: str, *, source: str | None = None
) -> tuple[TrainingJobSpec, list[PodSecurityFinding]]:
    """:func:`loads_spec`, and the spec's Pod Security warnings with their lines.

    The warnings are the settings that break the Restricted level, and the Baseline ones the
    spec allows with ``podSecurity: privileged``
    (:func:`~kubedl_prefect.spec.pod_security.pod_security_warnings`).

    Raises:
        SpecError: As :func:`loads_spec`.

    Example:
        >>> spec, warnings = loads_spec_with_warnings(
        ...     "{name: m, image: i, replicas: {master: 1},"
        ...     " podTemplate: {spec: {securityContext: {runAsNonRoot: false}}}}"
        ... )
        >>> [(w.path, w.level.value, w.line) for w in warnings]
        [('podTemplate.spec.securityContext.runAsNonRoot', 'Restricted', 1)]
    """
    node, data = parse_document(text, source=source, limits=SPEC_LIMITS)
    spec = parse_spec(data, source=source, line_of=lambda loc: _line_of(node, loc))
    return spec, pod_security_warnings(spec, line_of=lambda loc: _line_of(node, loc))


SPEC_FILE_SUFFIXES: Final = (".yaml", ".yml", ".json")
"""The file names :func:`load_untrusted_spec` reads."""

SPEC_ROOT_ENV: Final = "KUBEDL_PREFECT_SPEC_ROOT"
"""The environment variable naming the folder spec files named by blocks must be in."""


def spec_root() -> Path:
    """Where spec files named by a block may be: ``$KUBEDL_PREFECT_SPEC_ROOT``, else the cwd.

    The flow's working directory is the project a deployment pulled (``flows/prefect.yaml``
    sets it), so its spec files are there; the variable is set by whoever runs the worker, not
    by whoever edits a block.
    """
    configured = os.environ.get(SPEC_ROOT_ENV)
    return Path(configured).expanduser() if configured else Path.cwd()


def load_untrusted_spec(path: str | Path, *, root: str | Path | None = None) -> TrainingJobSpec:
    """Read a spec file whose path comes from untrusted input (a block's ``spec_file``).

    Whoever can edit a block must not be able to read the worker's files through it, or have
    their lines quoted into task states and logs. So the file must

    - be named ``*.yaml``, ``*.yml`` or ``*.json`` (and resolve to such a name);
    - resolve, symlinks followed, inside ``root`` (default :func:`spec_root`); a relative path
      is taken relative to ``root``;
    - be a regular file of at most :data:`~kubedl_prefect.spec.reader.MAX_SPEC_BYTES`;

    and its content is quoted in messages only once it has parsed as a spec document: a YAML
    mapping with ``name`` and ``replicas`` (or ``kind: TrainingJob``). A file that is not valid
    YAML, or not such a mapping, is refused with its path and nothing of its content.

    Raises:
        SpecError: With path ``(file)`` for the refusals above; else as :func:`loads_spec`.
    """
    shown = str(path) if str(path).isprintable() else repr(str(path))  # no forged log lines
    base = Path(root) if root is not None else spec_root()
    name = Path(path)
    if name.suffix.lower() not in SPEC_FILE_SUFFIXES:
        raise _not_read(shown, "is not a spec file: only .yaml, .yml and .json files are read")
    try:
        base = base.resolve()
        file = (base / name.expanduser()).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise _not_read(shown, "cannot be resolved") from exc
    if not file.is_relative_to(base):
        raise _not_read(
            shown,
            f"is outside the folder spec files are read from ({base}; set {SPEC_ROOT_ENV} on the "
            "worker to change it)",
        )
    if file.suffix.lower() not in SPEC_FILE_SUFFIXES:
        raise _not_read(shown, "is a link to a file that is not a spec file")
    if not file.is_file():
        raise _not_read(shown, "is not a file")
    text = read_text_file(file, SPEC_LIMITS)
    try:
        node, data = parse_document(text, source=shown, limits=SPEC_LIMITS)
    except SpecError as exc:
        if all(issue.path == "(yaml)" for issue in exc.issues):
            raise _not_read(shown, "is not a spec document: it is not valid YAML") from None
        raise
    if not _looks_like_a_spec(data):
        raise _not_read(
            shown,
            "is not a spec document: a spec is a mapping with name and replicas (or kind: "
            "TrainingJob)",
        )
    return parse_spec(data, source=shown, line_of=lambda loc: _line_of(node, loc))


def _looks_like_a_spec(data: Any) -> bool:
    """A mapping of our kind (or of no kind) that names a job and its replicas."""
    if not isinstance(data, dict):
        return False
    if data.get("kind", SPEC_KIND) != SPEC_KIND:
        return False
    if data.get("apiVersion", SPEC_API_VERSION) != SPEC_API_VERSION:
        return False
    return "kind" in data or ("name" in data and "replicas" in data)


def _not_read(path: str, problem: str) -> SpecError:
    return SpecError(
        [
            SpecIssue(
                "(file)",
                f"{path} {problem}",
                "name a spec file (YAML) inside the project the flow runs in; check it with "
                "`kubedl-prefect validate FILE` on that machine",
            )
        ],
        source=path,
    )


def spec_to_data(spec: TrainingJobSpec) -> dict[str, Any]:
    """The spec as plain data in its YAML spelling, without fields left at their defaults.

    Literal environment values are written as plain strings (``LOGLEVEL: DEBUG``), and a role's
    ``count`` and ``restartPolicy`` come first.
    """
    data = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    head = {"apiVersion": SPEC_API_VERSION, "kind": SPEC_KIND, "name": spec.name}
    head["framework"] = spec.framework.value
    if spec.pod_security is not None:  # in sight, where the spec starts
        head["podSecurity"] = spec.pod_security
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


if TYPE_CHECKING:
    _SafeDumper = yaml.SafeDumper
else:  # libyaml's emitter when PyYAML has it (ten times faster), else PyYAML's
    _SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_SafeDumper):
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
