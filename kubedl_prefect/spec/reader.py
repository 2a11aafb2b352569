r"""Bounded, strict reading of YAML: specs and the manifests ``kubedl-prefect import`` reads.

Every input goes through one reader that runs in time linear in its size, whatever the input:

- **Size.** A spec may have at most :data:`MAX_SPEC_BYTES`, a file of manifests to import at most
  :data:`MAX_MANIFEST_FILE_BYTES`; a file is not even read past the limit.
- **Aliases.** YAML anchors and aliases share a node; expanded, a few hundred bytes of nested
  aliases make billions of nodes (the "billion laughs"), and everything that walks the data
  (validation, rendering) would walk them all. The reader composes the document itself from
  the parser's events and counts the nodes of the *expanded* document as it goes: past
  :data:`MAX_NODES` it stops. Recursive aliases and nesting deeper than :data:`MAX_DEPTH` are
  refused as well.
- **Scalars.** YAML 1.1 (kubectl, PyYAML) and YAML 1.2 read some plain scalars differently:
  ``yes``/``no``/``on``/``off`` (and ``y``/``n``) are booleans for YAML 1.1 and strings for
  YAML 1.2, ``0755`` is octal 493 or decimal 755, ``1_000`` and ``1:30`` are numbers or text.
  Such a scalar is refused with its line and column: quoting it, or writing ``true``, ``false``
  or a plain decimal number, says what is meant. ``true``/``false``, decimal and hex integers,
  floats with a dot, and ``null``/``~`` mean the same to both and are read as such; every other
  plain scalar (``2024-01-01``, ``1e9``, ``busybox:1.36``) is a string.
- **Characters.** The text must be UTF-8 (a byte that is not is reported with its line and
  column) and printable; a tab where YAML wants indentation is reported as such.
- **Duplicate keys** are refused (PyYAML would keep the last one).

Integers and floats keep the text they were written as (:class:`SourceInt`,
:class:`SourceFloat`), so that a number written into a string field (an environment value,
a quantity) keeps its spelling: ``LR: 1.0e-5`` stays ``"1.0e-5"``.

Example:
    >>> node, data = parse_document("replicas: {worker: 2}\nenv: {LR: 1.0e-5}\n")
    >>> data["replicas"]["worker"], data["env"]["LR"].text
    (2, '1.0e-5')
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.paths import format_path
from kubedl_prefect.spec.printable import NON_PRINTABLE

MAX_SPEC_BYTES: Final = 256 * 1024
"""The largest spec accepted, in bytes of UTF-8 (256 KiB).

The examples are 1 to 2 KiB and the largest upstream example manifest is about 3 KiB; a spec
that carries large pod-template fragments stays far below this. A bigger spec would render to a
manifest over :data:`kubedl_prefect.spec.renderers.MAX_MANIFEST_BYTES` as soon as a few roles
share it, and reading it would no longer be quick.
"""

MAX_MANIFEST_FILE_BYTES: Final = 1024 * 1024
"""The largest file of manifests ``kubedl-prefect import`` reads (1 MiB, several documents)."""

MAX_NODES: Final = 100_000
"""The most nodes (scalars, sequences, mappings) a document may have with its aliases expanded.

Specs have hundreds of nodes; a spec at :data:`MAX_SPEC_BYTES` written without aliases cannot
reach the limit. It bounds the work of everything that walks the data: validating 100,000 nodes
takes a fraction of a second.
"""

MAX_DEPTH: Final = 64
"""The deepest nesting of sequences and mappings accepted.

A rendered manifest nests about 16 levels (``spec.*ReplicaSpecs.Worker.template.spec.affinity
...values``); the limit keeps the recursive steps after reading (construction, validation)
far from Python's recursion limit.
"""


@dataclass(frozen=True)
class Limits:
    """What one reader accepts.

    Attributes:
        max_bytes: The most bytes of UTF-8 text.
        max_nodes: The most nodes with aliases expanded (per document).
        max_depth: The deepest nesting.
        what: What is read, for messages ("spec", "manifest file").
    """

    max_bytes: int
    max_nodes: int = MAX_NODES
    max_depth: int = MAX_DEPTH
    what: str = "spec"


SPEC_LIMITS: Final = Limits(MAX_SPEC_BYTES)
"""The limits of a spec document."""

MANIFEST_LIMITS: Final = Limits(MAX_MANIFEST_FILE_BYTES, what="manifest file")
"""The limits of a file of manifests to import."""


class SourceInt(int):
    """An integer read from YAML, with the text it was written as (``text``)."""

    text: str


class SourceFloat(float):
    """A float read from YAML, with the text it was written as (``text``)."""

    text: str


def source_text(value: int | float) -> str:
    """The text a number was written as, when it was read from YAML; else its usual spelling.

    Example:
        >>> source_text(parse_document("x: 1.50")[1]["x"]), source_text(1.5)
        ('1.50', '1.5')
    """
    text = getattr(value, "text", None)
    if isinstance(text, str):
        return text
    return format(value, "g") if isinstance(value, float) else str(value)


def plain_numbers(data: Any) -> Any:
    """``data`` with :class:`SourceInt` and :class:`SourceFloat` turned into plain numbers."""
    if isinstance(data, dict):
        return {plain_numbers(k): plain_numbers(v) for k, v in data.items()}
    if isinstance(data, list):
        return [plain_numbers(v) for v in data]
    if isinstance(data, SourceInt):
        return int(data)
    if isinstance(data, SourceFloat):
        return float(data)
    return data


def _human_size(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MiB"
    if size >= 1024:
        return f"{size / 1024:.0f} KiB"
    return f"{size} bytes"


def _issue(path: str, problem: str, fix: str, source: str | None) -> SpecError:
    return SpecError([SpecIssue(path, problem, fix)], source=source)


def read_text_file(path: str | Path, limits: Limits = SPEC_LIMITS) -> str:
    r"""Read a YAML file as text, refusing files over the limit and text that is not UTF-8.

    The file is read at most up to ``limits.max_bytes`` plus one byte.

    Raises:
        SpecError: With path ``(file)``: the file cannot be read, is too large, or is not UTF-8
            (the first bad byte's line and column).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".yaml") as f:
        ...     _ = f.write(b"name: caf\xe9\n")
        ...     f.flush()
        ...     try:
        ...         read_text_file(f.name)
        ...     except SpecError as error:
        ...         print(error.issues[0].problem)
        byte 0xe9 at line 1, column 10 is not UTF-8
    """
    file = Path(path)
    try:
        with file.open("rb") as handle:
            data = handle.read(limits.max_bytes + 1)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise _issue(
            "(file)", f"cannot read {file}: {reason}", "check the path and permissions", str(file)
        ) from exc
    if len(data) > limits.max_bytes:
        try:
            size = f"{_human_size(file.stat().st_size)}"
        except OSError:
            size = "more"
        raise _too_large(size, limits, str(file))
    return decode_text(data, source=str(file))


def _too_large(size: str, limits: Limits, source: str | None) -> SpecError:
    return _issue(
        "(file)",
        f"the {limits.what} is {size}; at most {_human_size(limits.max_bytes)} are accepted",
        "keep large content out of the spec: put scripts and data in a ConfigMap or a volume "
        "and mount it",
        source,
    )


_BOMS: Final = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def decode_text(data: bytes, *, source: str | None = None) -> str:
    """``data`` decoded as UTF-8 (an initial byte-order mark is dropped).

    Raises:
        SpecError: With path ``(file)``, naming the line and column of the first byte that is
            not UTF-8, or the encoding a byte-order mark announces.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise _issue(
                "(file)",
                f"the text is {encoding}-encoded (it starts with a {encoding} byte-order mark)",
                f"save it as UTF-8, e.g. `iconv -f {encoding} -t UTF-8 FILE > FILE.utf8`",
                source,
            )
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        column = len(data[line_start : exc.start].decode("utf-8")) + 1
        raise _issue(
            "(file)",
            f"byte 0x{data[exc.start]:02x} at line {line}, column {column} is not UTF-8",
            "save the file as UTF-8; from Latin-1 or Windows-1252, for example: "
            "`iconv -f WINDOWS-1252 -t UTF-8 FILE > FILE.utf8`",
            source,
        ) from None


def check_size(text: str, limits: Limits = SPEC_LIMITS, *, source: str | None = None) -> None:
    """Refuse ``text`` if its UTF-8 encoding exceeds ``limits.max_bytes``.

    Raises:
        SpecError: With path ``(file)``.
    """
    if len(text) > limits.max_bytes:  # at least one byte per character: no need to encode
        raise _too_large(f"over {_human_size(limits.max_bytes)}", limits, source)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise _too_large(_human_size(size), limits, source)


# --- plain scalars -------------------------------------------------------------------------

_NULL: Final = re.compile(r"^(?:~|null|Null|NULL|)\Z")
_BOOL: Final = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)\Z")
_INT: Final = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9]*)|0x[0-9a-fA-F]+)\Z")
_FLOAT: Final = re.compile(
    r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)
_YAML11_BOOL: Final = re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF)\Z")
_YAML11_NUMBER: Final = re.compile(
    r"^(?:[-+]?0[0-9_]+(?:\.[0-9_]*)?"  # leading zero: octal in YAML 1.1
    r"|[-+]?0[bo][0-9_]+"  # binary (1.1), octal (1.2)
    r"|[-+]0x[0-9a-fA-F_]+|0x[0-9a-fA-F]*_[0-9a-fA-F_]*"  # signed hex, hex with '_'
    r"|[-+]?(?:[0-9][0-9_]*)?_[0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"  # '_' in a number
    r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?)\Z"  # base 60
)
_TAG_NULL: Final = "tag:yaml.org,2002:null"
_TAG_BOOL: Final = "tag:yaml.org,2002:bool"
_TAG_INT: Final = "tag:yaml.org,2002:int"
_TAG_FLOAT: Final = "tag:yaml.org,2002:float"
_TAG_STR: Final = "tag:yaml.org,2002:str"
_TAG_MERGE: Final = "tag:yaml.org,2002:merge"
_TAG_SEQ: Final = "tag:yaml.org,2002:seq"
_TAG_MAP: Final = "tag:yaml.org,2002:map"


_PYYAML_TIMESTAMP: Final = re.compile(r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}")


def is_ambiguous_text(text: str) -> bool:
    """Whether ``text``, written as a plain scalar, could be read as something else than a string.

    By this reader, YAML 1.1 (kubectl, PyYAML) or YAML 1.2: such strings must be quoted.

    Example:
        >>> [is_ambiguous_text(t) for t in ("y", "0755", "1.5", "~", "busybox:1.36")]
        [True, True, True, True, False]
    """
    return bool(
        _NULL.match(text)
        or _BOOL.match(text)
        or _INT.match(text)
        or _FLOAT.match(text)
        or _YAML11_BOOL.match(text)
        or _YAML11_NUMBER.match(text)
        or _PYYAML_TIMESTAMP.match(text)
        or re.match(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\Z", text)
        or text == "<<"
    )


class _ReadError(yaml.MarkedYAMLError):
    """A problem the reader itself found, with its own fix."""

    def __init__(self, problem: str, mark: Any, fix: str) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.fix = fix


def _resolve_plain(value: str, mark: Any) -> str:
    if _NULL.match(value):
        return _TAG_NULL
    if _BOOL.match(value):
        return _TAG_BOOL
    if _INT.match(value):
        return _TAG_INT
    if _FLOAT.match(value):
        return _TAG_FLOAT
    if value == "<<":
        return _TAG_MERGE
    if _YAML11_BOOL.match(value):
        meaning = "true" if value.lower() in {"y", "yes", "on"} else "false"
        raise _ReadError(
            f"{value!r} is the boolean {meaning} for YAML 1.1 (kubectl, PyYAML) but the string "
            f"{value!r} for YAML 1.2",
            mark,
            f"write {meaning} for a flag, or quote it ('{value}') for text",
        )
    if _YAML11_NUMBER.match(value):
        yaml11 = yaml.safe_load(value)
        reading = (
            f"the number {yaml11} for YAML 1.1 (kubectl, PyYAML)"
            if isinstance(yaml11, int | float)
            else "text for YAML 1.1 (kubectl, PyYAML)"
        )
        raise _ReadError(
            f"{value!r} is {reading}, but not for YAML 1.2 (octal, binary, base-60 and '_' "
            "separators differ between the two)",
            mark,
            "write the number in plain decimal (no leading zero, no '_'), or quote it "
            f"('{value}') for text",
        )
    return _TAG_STR


_JSON_SCALAR_TAGS: Final = {
    _TAG_STR: "a string",
    _TAG_INT: "an integer",
    _TAG_FLOAT: "a number",
    _TAG_BOOL: "true or false",
    _TAG_NULL: "null",
}
"""The explicit scalar tags accepted (``!!str``, ``!!int``...): JSON's scalars, nothing else."""

_TAG_FIXES: Final = {
    "tag:yaml.org,2002:set": "write a list instead ([a, b]): a set has no order, so the spec "
    "would not read (and hash) the same from one run to the next",
    "tag:yaml.org,2002:binary": "write the text itself; for bytes, write base64 as a plain "
    "string and decode it in the program",
    "tag:yaml.org,2002:timestamp": "quote the date or time: it is text to the spec",
    "tag:yaml.org,2002:omap": "write a plain mapping (key: value lines)",
    "tag:yaml.org,2002:pairs": "write a plain mapping (key: value lines)",
    "tag:yaml.org,2002:merge": "write the merge key `<<` without a tag",
}


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,") else tag


def _refused_tag(tag: str, mark: Any) -> _ReadError:
    return _ReadError(
        f"the tag {_short_tag(tag)} is not allowed: a spec holds JSON data only (text, numbers, "
        "true/false, null, mappings and lists)",
        mark,
        _TAG_FIXES.get(tag, "remove the tag (the `!...` before the value)"),
    )


def _explicit_scalar_tag(tag: str, value: str, mark: Any) -> str:
    """``tag`` if it is one of JSON's scalars and ``value`` reads as one, else refused.

    ``!!int 0755`` and ``!!bool yes`` are refused like their untagged forms: PyYAML would read
    them the YAML 1.1 way.
    """
    if tag not in _JSON_SCALAR_TAGS:
        raise _refused_tag(tag, mark)
    if tag == _TAG_STR:
        return tag
    implied = _resolve_plain(value, mark)
    if implied == tag or (tag == _TAG_FLOAT and implied == _TAG_INT):
        return tag
    raise _ReadError(
        f"{value!r} is not {_JSON_SCALAR_TAGS[tag]}, as its tag {_short_tag(tag)} says",
        mark,
        "remove the tag, or write a value of that type",
    )


def _collection_tag(tag: str | None, default: str, mark: Any) -> str:
    """The tag of a sequence or mapping: only ``!!seq`` and ``!!map`` (or none) are accepted."""
    if tag in (None, "!", default):
        return default
    raise _refused_tag(tag, mark)


_UNSAFE_CHARACTER: Final = re.compile("[\x00\ud800-\udfff]")
"""NUL, and lone surrogates: what no argument, environment variable or encoder takes."""


def unsafe_character_problem(text: str) -> tuple[str, str] | None:
    r"""Problem and fix for a NUL or lone surrogate in ``text``, if it holds one.

    An operating system ends every argument and environment entry at a NUL (the local
    supervisor fails on it, a container runtime refuses it), and a lone surrogate (from
    ``"\ud800"``) cannot be encoded as UTF-8, so the spec could not even be hashed.

    Example:
        >>> unsafe_character_problem("a\x00b")[0]
        'the text holds a NUL character (character 2)'
    """
    found = _UNSAFE_CHARACTER.search(text)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return (
            f"the text holds a NUL character (character {found.start() + 1})",
            "remove it: no program argument, environment variable or Kubernetes field can hold it",
        )
    return (
        f"the text holds a lone surrogate U+{ord(char):04X} (character {found.start() + 1})",
        "remove it: it is not a character, and no text encoding can write it",
    )


def _check_scalar_text(value: str, mark: Any) -> None:
    r"""Refuse a NUL (written as the escape ``"\0"``) or a lone surrogate in a scalar."""
    problem = unsafe_character_problem(value)
    if problem is not None:
        raise _ReadError(problem[0], mark, problem[1])


class _Constructor(yaml.constructor.SafeConstructor):
    """PyYAML's safe constructor; numbers keep their text."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        number = SourceInt(super().construct_yaml_int(node))
        number.text = node.value
        return number

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        number = SourceFloat(super().construct_yaml_float(node))
        number.text = node.value
        return number


_Constructor.yaml_constructors = {
    **yaml.constructor.SafeConstructor.yaml_constructors,
    _TAG_INT: _Constructor.construct_yaml_int,
    _TAG_FLOAT: _Constructor.construct_yaml_float,
}

_LOADER: Final[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""The parser: libyaml's when PyYAML was built with it (ten times faster), else PyYAML's."""


class _Frame:
    """An open collection: its node, its anchor, the node count at its start.

    A plain class, not a dataclass: making a dataclass costs ``kubedl-prefect validate``'s start.
    """

    __slots__ = ("anchor", "node", "start_count")

    def __init__(
        self, node: yaml.SequenceNode | yaml.MappingNode, anchor: str | None, start_count: int
    ) -> None:
        self.node = node
        self.anchor = anchor
        self.start_count = start_count


class _Composer:
    """Builds the node graph of each document from parser events, within the limits."""

    def __init__(self, text: str, limits: Limits) -> None:
        self.text = text
        self.limits = limits
        self.parser = _LOADER(text)

    def documents(self) -> Iterator[yaml.Node | None]:
        try:
            parser = self.parser
            parser.get_event()  # StreamStart
            while not parser.check_event(yaml.StreamEndEvent):
                parser.get_event()  # DocumentStart
                node = self._document()
                parser.get_event()  # DocumentEnd
                yield node
        finally:
            self.parser.dispose()

    def _document(self) -> yaml.Node | None:
        anchors: dict[str, tuple[yaml.Node, int]] = {}
        open_anchors: set[str] = set()
        stack: list[_Frame] = []
        count = 0
        root: yaml.Node | None = None
        limits = self.limits
        while True:
            if self.parser.check_event(yaml.DocumentEndEvent):
                return root
            event: Any = self.parser.get_event()
            start: Any = event.start_mark  # libyaml's marks are not yaml.Mark to the type stubs
            end: Any = event.end_mark
            node: yaml.Node | None = None
            if isinstance(event, yaml.AliasEvent):
                if event.anchor in open_anchors:
                    raise _ReadError(
                        f"alias *{event.anchor} refers to the node that contains it",
                        event.start_mark,
                        "remove the recursive alias: a spec is a tree",
                    )
                if event.anchor not in anchors:
                    raise _ReadError(
                        f"alias *{event.anchor} names no anchor defined before it",
                        event.start_mark,
                        f"define &{event.anchor} before using *{event.anchor}",
                    )
                node, size = anchors[event.anchor]
                count += size
            elif isinstance(event, yaml.ScalarEvent):
                tag = event.tag
                if tag is None or tag == "!":
                    plain = event.implicit[0]
                    tag = _resolve_plain(event.value, event.start_mark) if plain else _TAG_STR
                    if tag == _TAG_MERGE and not self._at_key(stack):
                        tag = _TAG_STR
                else:
                    tag = _explicit_scalar_tag(tag, event.value, event.start_mark)
                _check_scalar_text(event.value, event.start_mark)
                node = yaml.ScalarNode(tag, event.value, start, end, style=event.style)
                count += 1
                if event.anchor is not None:
                    anchors[event.anchor] = (node, 1)
            elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
                count += 1
                if len(stack) >= limits.max_depth:
                    raise _ReadError(
                        f"the document nests deeper than {limits.max_depth} levels",
                        event.start_mark,
                        "flatten the structure; a spec nests about 15 levels at most",
                    )
                collection: yaml.SequenceNode | yaml.MappingNode
                if isinstance(event, yaml.SequenceStartEvent):
                    tag = _collection_tag(event.tag, _TAG_SEQ, event.start_mark)
                    collection = yaml.SequenceNode(
                        tag, [], start, None, flow_style=event.flow_style
                    )
                else:
                    tag = _collection_tag(event.tag, _TAG_MAP, event.start_mark)
                    collection = yaml.MappingNode(tag, [], start, None, flow_style=event.flow_style)
                if event.anchor is not None:
                    open_anchors.add(event.anchor)
                self._attach(stack, collection)
                stack.append(_Frame(collection, event.anchor, count))
                if root is None:
                    root = collection
            elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
                frame = stack.pop()
                frame.node.end_mark = end
                if isinstance(frame.node, yaml.MappingNode):
                    _check_keys(frame.node)
                if frame.anchor is not None:
                    open_anchors.discard(frame.anchor)
                    anchors[frame.anchor] = (frame.node, count - frame.start_count + 1)
            if count > limits.max_nodes:
                raise _ReadError(
                    f"the document has more than {limits.max_nodes:,} nodes once its aliases "
                    "are expanded",
                    event.start_mark,
                    "use fewer aliases (*name): each one copies its anchor's whole subtree",
                )
            if node is not None:
                if root is None:
                    root = node
                else:
                    self._attach(stack, node)

    @staticmethod
    def _at_key(stack: list[_Frame]) -> bool:
        if not stack or not isinstance(stack[-1].node, yaml.MappingNode):
            return False
        pairs = stack[-1].node.value
        return not pairs or pairs[-1][1] is not None

    @staticmethod
    def _attach(stack: list[_Frame], node: yaml.Node) -> None:
        if not stack:
            return
        parent = stack[-1].node
        if isinstance(parent, yaml.SequenceNode):
            parent.value.append(node)
        elif parent.value and parent.value[-1][1] is None:
            parent.value[-1] = (parent.value[-1][0], node)
        else:
            parent.value.append((node, None))


def _check_keys(node: yaml.MappingNode) -> None:
    seen: dict[str, yaml.Node] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode):
            raise _ReadError(
                "a mapping key is itself a list or a mapping",
                key.start_mark,
                "use a plain string as the key",
            )
        if key.value in seen and key.tag != _TAG_MERGE:
            first = seen[key.value].start_mark.line + 1
            raise _ReadError(
                f"duplicate key {key.value!r} (first given on line {first})",
                key.start_mark,
                "keep only one",
            )
        seen[key.value] = key


def _where(mark: yaml.Mark | None) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown place"


def _yaml_error(exc: yaml.YAMLError, text: str, source: str | None) -> SpecError:
    if isinstance(exc, _ReadError):
        return _issue("(yaml)", f"{exc.problem} at {_where(exc.problem_mark)}", exc.fix, source)
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed YAML"
        fix = "fix the YAML syntax there"
        if "nesting depth" in problem:  # libyaml's own limit, below ours when it is deeper
            problem = "the document nests too deep"
            fix = "flatten the structure; a spec nests about 15 levels at most"
        elif mark is not None and _char_at(text, mark) == "\t":
            problem = f"a tab character ({problem})"
            fix = "indent with spaces: YAML does not allow tabs for indentation"
        elif "found undefined tag handle" in problem or "could not determine a constructor" in (
            problem
        ):
            fix = "remove the tag (the `!...` before the value)"
        return _issue("(yaml)", f"{problem} at {_where(mark)}", fix, source)
    return _issue("(yaml)", str(exc), "fix the YAML syntax", source)


def _char_at(text: str, mark: yaml.Mark) -> str:
    lines = text.splitlines()
    if 0 <= mark.line < len(lines) and 0 <= mark.column < len(lines[mark.line]):
        return lines[mark.line][mark.column]
    return ""


def _check_characters(text: str, source: str | None) -> None:
    bad = NON_PRINTABLE.search(text)
    if bad is None:
        return
    line = text.count("\n", 0, bad.start()) + 1
    column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
    raise _issue(
        "(yaml)",
        f"control character U+{ord(bad.group()):04X} at line {line}, column {column}",
        "remove it: YAML text may hold only printable characters, tabs and line breaks "
        '(write it as an escape in a double-quoted string, e.g. "\\x07")',
        source,
    )


def parse_documents(
    text: str, *, source: str | None = None, limits: Limits = SPEC_LIMITS
) -> list[tuple[yaml.Node | None, Any]]:
    """Every document of ``text``: its node graph (for line numbers) and its data.

    Raises:
        SpecError: With path ``(file)`` (too large) or ``(yaml)`` (malformed, over a limit,
            ambiguous scalar, duplicate key), naming the line and column.
    """
    check_size(text, limits, source=source)
    _check_characters(text, source)
    documents: list[tuple[yaml.Node | None, Any]] = []
    try:
        for node in _Composer(text, limits).documents():
            data = None if node is None else _Constructor().construct_document(node)
            documents.append((node, data))
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, source) from exc
    return documents


def parse_document(
    text: str, *, source: str | None = None, limits: Limits = SPEC_LIMITS
) -> tuple[yaml.Node | None, Any]:
    """The one document of ``text`` (see :func:`parse_documents`).

    Raises:
        SpecError: As :func:`parse_documents`, and if ``text`` holds several documents.
    """
    documents = parse_documents(text, source=source, limits=limits)
    if len(documents) > 1:
        second = documents[1][0]
        where = f" (the second starts at line {second.start_mark.line + 1})" if second else ""
        raise _issue(
            "(yaml)",
            f"expected one document, found {len(documents)}{where}",
            "keep one spec per file (remove the `---` separators)",
            source,
        )
    return documents[0] if documents else (None, None)


# --- Python data -----------------------------------------------------------------------------


def data_issue(data: Any, limits: Limits = SPEC_LIMITS) -> SpecIssue | None:
    """The first reason to refuse ``data`` (a spec given as Python data), before validating it.

    A dict given to the Python API has no text to bound, but the same numbers as YAML apply:
    at most ``limits.max_nodes`` nodes (each mapping, list, key and value is one), counted each
    time they are reached, so a dict or list referenced many times counts as many times, as an
    expanded alias does (a few shared references make billions of nodes); and at most
    ``limits.max_depth`` nested mappings and lists (which also stops a dict that contains
    itself). The walk stops at the limit: it takes time in the limit, never in the expanded
    size. Text holding a NUL or a lone surrogate, and data that is not JSON-like (a set, whose
    order changes between runs; bytes), are refused as well. Validated models met on the way
    are walked as their data.

    Returns:
        The issue, with the path where the walk stopped; ``None`` when ``data`` is fine.

    Example:
        >>> shared = {"a": [1, 2, 3]}
        >>> for _ in range(40):
        ...     shared = {"a": shared, "b": shared}
        >>> print(data_issue(shared).problem)  # doctest: +ELLIPSIS
        the spec has more than 100,000 nodes (mappings, lists, keys and values, a shared one ...
    """
    count = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        count += 1
        if count > limits.max_nodes:
            return _too_many(loc, limits)
        if isinstance(value, BaseModel):
            value = value.model_dump(by_alias=True, exclude_none=True)
        if isinstance(value, str):
            problem = unsafe_character_problem(value)
            if problem is not None:
                return SpecIssue(format_path(loc), *problem)
        elif isinstance(value, Mapping | list | tuple):
            if len(loc) + 1 > limits.max_depth:
                return SpecIssue(
                    format_path(loc),
                    f"the {limits.what} nests deeper than {limits.max_depth} levels here",
                    "flatten the structure; a spec nests about 15 levels at most (a mapping "
                    "that contains itself nests without end)",
                )
            if isinstance(value, Mapping):
                count += len(value)  # the keys
                if count > limits.max_nodes:
                    return _too_many(loc, limits)
                for key, item in value.items():
                    here = (*loc, key if isinstance(key, str) else str(key))
                    if isinstance(key, str) and (problem := unsafe_character_problem(key)):
                        return SpecIssue(format_path(here), f"the key: {problem[0]}", problem[1])
                    stack.append((item, here))
            else:
                stack.extend((item, (*loc, index)) for index, item in enumerate(value))
        elif isinstance(value, set | frozenset | bytes | bytearray):
            kind = "a set" if isinstance(value, set | frozenset) else "bytes"
            return SpecIssue(
                format_path(loc),
                f"{kind} is not spec data (JSON-like data only: text, numbers, true/false, "
                "None, mappings and lists)",
                "give a list (a set has no order, so the spec would hash differently from one "
                "run to the next)"
                if kind == "a set"
                else "give text (a str)",
            )
    return None


def _too_many(loc: tuple[str | int, ...], limits: Limits) -> SpecIssue:
    return SpecIssue(
        format_path(loc),
        f"the {limits.what} has more than {limits.max_nodes:,} nodes (mappings, lists, keys and "
        "values, a shared one counted each time it is reached); the count passed the limit here",
        "give each part once: a dict or list referenced from many places is copied into every "
        "one of them",
    )
