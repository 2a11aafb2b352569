"""Documentation that cannot drift: every YAML and Python block of README.md and docs/*.md holds.

Each fenced block whose language is ``yaml`` (``yml``) or ``python`` (``py``) is one test, named
``<file>:<line of the opening fence>``. Other blocks (``console``, plain) are not checked.

YAML blocks must parse, and then:

- a training-job spec (``kind: TrainingJob``, our ``apiVersion``, or both ``name`` and
  ``replicas``) must pass :func:`~kubedl_prefect.spec.loads_spec` and
  :func:`~kubedl_prefect.spec.validate` for the dialects it claims, else for at least one;
- a spec fragment (a mapping whose keys are all spec fields, e.g. ``volumes:`` alone) must pass
  the same once merged over a minimal spec (its keys replacing the minimal spec's);
- a Kubernetes object (it has ``apiVersion`` or ``kind``) must have both, as strings;
- any other YAML (``prefect.yaml``, configuration) must only parse.

A YAML block whose first line is a comment naming a file of the repository
(``# examples/pytorch-mnist.yaml``) must agree with that file: equal to it, or, with
``(abridged)`` after the name, equal to it in every top-level field the block shows.

Python blocks are compiled, then type-checked by mypy with the project's configuration (strict),
all in one mypy run. Each block is a module of its own and must import what it uses, unless it
says otherwise in an HTML comment on the line(s) just before its opening fence, invisible once
rendered:

- ``<!-- check: continues -->``: the block continues the previous Python block of the same
  file (it is checked after it, and may use its names);
- ``<!-- check: given`` followed by Python lines and ``-->``: declarations the block takes from
  its surroundings (``testbed: Testbed``), checked in front of it but not shown;
- ``<!-- check: dialects kubeflow -->`` (YAML): the dialects a spec claims; each must accept it;
- ``<!-- check: runs -->``: the block (with what it continues or is given) also runs, in a
  process of its own from the repository's root, and must exit 0: for examples that need no
  server or cluster, so that one that raises cannot be shown.

A block that uses an API which does not exist (yet) fails: the docs are fixed, or the API added.
The same goes for the module names ``docs/architecture.md`` mentions (``spec.model``) and every
``kubedl_prefect.…`` name any page mentions: each must exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    Dialect,
    TrainingJobSpec,
    loads_spec,
    parse_spec,
    spec_to_data,
    validate,
)

REPO: Final = Path(__file__).resolve().parents[2]
PAGES: Final = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES: Final = {"yaml": "yaml", "yml": "yaml", "python": "python", "py": "python"}
DIRECTIVES: Final = ("continues", "given", "dialects", "runs")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
_REFERENCE = re.compile(r"^#\s*(?P<path>[\w./-]+\.(?:ya?ml|json))(?P<abridged>\s*\(abridged\))?")

MINIMAL_SPEC: Final[dict[str, Any]] = {
    "name": "docs-example",
    "image": "busybox:1.36",
    "replicas": {"master": 1, "worker": 2},
}
"""What a spec fragment is merged over."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str  # relative to the repository
    line: int  # 1-based line of the opening fence
    language: str  # "yaml" or "python"
    text: str
    directives: tuple[tuple[str, str], ...] = ()  # (word, rest) of each check comment
    body_line: int = 0  # 1-based line of the block's first line of content

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def directive(self, word: str) -> str | None:
        for name, rest in self.directives:
            if name == word:
                return rest
        return None


def _directives_before(lines: list[str], fence_index: int) -> list[tuple[str, str]]:
    """The ``<!-- check: ... -->`` comments that end right above line ``fence_index``."""
    found: list[tuple[str, str]] = []
    end = fence_index - 1
    while end >= 0 and lines[end].strip().endswith("-->"):
        start = end
        while start >= 0 and "<!--" not in lines[start]:
            start -= 1
        if start < 0:
            break
        comment = "\n".join(lines[start : end + 1]).strip()
        body = comment[len("<!--") : -len("-->")].strip()
        if body.startswith("check:"):
            word, _, rest = body[len("check:") :].strip().partition("\n")
            head, _, inline = word.partition(" ")
            found.append((head.strip(), (inline + "\n" + rest).strip("\n")))
        end = start - 1
    return list(reversed(found))


def collect_blocks(page: Path) -> list[Block]:
    """The YAML and Python blocks of one page."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        info = opening["info"].strip().split()
        language = LANGUAGES.get(info[0].lower()) if info else None
        content: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence[0] * len(fence)) and set(closing) == {fence[0]}:
                break
            content.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        if language is not None:
            blocks.append(
                Block(
                    page=str(page.relative_to(REPO) if page.is_relative_to(REPO) else page),
                    line=index + 1,
                    language=language,
                    text="\n".join(content) + "\n",
                    directives=tuple(_directives_before(lines, index)),
                    body_line=index + 2,
                )
            )
        index = end + 1
    return blocks


BLOCKS: Final = [block for page in PAGES for block in collect_blocks(page)]
YAML_BLOCKS: Final = [block for block in BLOCKS if block.language == "yaml"]
PYTHON_BLOCKS: Final = [block for block in BLOCKS if block.language == "python"]


def test_the_pages_have_blocks_to_check() -> None:
    assert YAML_BLOCKS, "no YAML block found: is the fence parser broken?"
    assert PYTHON_BLOCKS, "no Python block found: is the fence parser broken?"
    assert any(block.page == "README.md" for block in YAML_BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_directives_are_known(block: Block) -> None:
    for word, rest in block.directives:
        assert word in DIRECTIVES, f"{block.id}: unknown check directive {word!r}"
        if word == "dialects":
            assert block.language == "yaml", f"{block.id}: dialects applies to YAML blocks"
            for name in rest.split():
                assert name in {d.value for d in Dialect}, f"{block.id}: no dialect {name!r}"
        else:
            assert block.language == "python", f"{block.id}: {word} applies to Python blocks"


CONVENTION_PAGE = """\
Some text.

```python
from kubedl_prefect.spec import load_spec
```

<!-- check: continues -->
```python
spec = load_spec("examples/pytorch-mnist.yaml")
```

<!-- check: given
from kubedl_prefect.testbed import Testbed
testbed: Testbed
-->
```py
print(testbed)
```

  <!-- check: dialects kubeflow -->
  ```yaml
  replicas: {worker: 2}
  ```

```console
$ not checked
```
"""


def test_the_convention(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(CONVENTION_PAGE, encoding="utf-8")
    blocks = collect_blocks(page)
    assert [(b.line, b.language) for b in blocks] == [
        (3, "python"),
        (8, "python"),
        (16, "python"),
        (21, "yaml"),
    ]
    assert blocks[1].directive("continues") == ""
    assert (
        blocks[2].directive("given")
        == "from kubedl_prefect.testbed import Testbed\ntestbed: Testbed"
    )
    assert blocks[3].directive("dialects") == "kubeflow"
    assert blocks[3].text == "replicas: {worker: 2}\n"
    built = {block.line: module for block, module in modules(blocks[:3])}
    assert built[3].lines == ["from kubedl_prefect.spec import load_spec"]
    assert built[8].lines == [
        "from kubedl_prefect.spec import load_spec",
        'spec = load_spec("examples/pytorch-mnist.yaml")',
    ]
    assert [line for _, line in built[8].origin] == [4, 9]
    assert built[16].lines == [
        "from kubedl_prefect.testbed import Testbed",
        "testbed: Testbed",
        "print(testbed)",
    ]


# --- YAML ----------------------------------------------------------------------------------

SPEC_FIELDS: Final = {
    key for name, info in TrainingJobSpec.model_fields.items() for key in (name, info.alias)
}


def is_full_spec(data: dict[str, Any]) -> bool:
    return (
        data.get("kind") == "TrainingJob"
        or str(data.get("apiVersion", "")).startswith("kubedl-prefect.io/")
        or {"name", "replicas"} <= set(data)
    )


def check_dialects(block: Block, spec: TrainingJobSpec) -> None:
    claimed = block.directive("dialects")
    dialects = [Dialect(name) for name in claimed.split()] if claimed else list(Dialect)
    refusals: dict[Dialect, SpecError] = {}
    for dialect in dialects:
        try:
            validate(spec, dialect, source=block.id)
        except SpecError as exc:
            refusals[dialect] = exc
    if claimed:
        assert not refusals, "\n".join(str(e) for e in refusals.values())
    else:
        assert len(refusals) < len(dialects), (
            f"{block.id}: no dialect accepts this spec:\n"
            + "\n".join(str(e) for e in refusals.values())
        )


def normalized(data: Any) -> Any:
    """Spec data in its canonical spelling; anything else as it is."""
    if isinstance(data, dict) and is_full_spec(data):
        return spec_to_data(parse_spec(data))
    return data


def check_reference(block: Block, documents: list[Any]) -> None:
    first = block.text.lstrip().splitlines()[0] if block.text.strip() else ""
    reference = _REFERENCE.match(first)
    if reference is None:
        return
    target = REPO / reference["path"]
    assert target.is_file(), f"{block.id}: names {reference['path']}, which does not exist"
    assert len(documents) == 1, f"{block.id}: a block naming a file holds one document"
    shown = normalized(documents[0])
    actual = normalized(yaml.safe_load(target.read_text(encoding="utf-8")))
    if reference["abridged"]:
        assert isinstance(shown, dict)
        assert isinstance(actual, dict)
        differing = {key for key in shown if shown[key] != actual.get(key)}
        assert not differing, f"{block.id} disagrees with {reference['path']} on {differing}"
    else:
        assert shown == actual, f"{block.id} disagrees with {reference['path']}"


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[block.id for block in YAML_BLOCKS])
def test_yaml_block(block: Block) -> None:
    try:
        documents = list(yaml.safe_load_all(block.text))
    except yaml.YAMLError as exc:
        pytest.fail(f"{block.id}: not valid YAML: {exc}")
    for data in documents:
        if not isinstance(data, dict):
            continue
        if is_full_spec(data):
            text = block.text if len(documents) == 1 else yaml.safe_dump(data)
            check_dialects(block, loads_spec(text, source=block.id))
        elif "apiVersion" in data or "kind" in data:
            for key in ("apiVersion", "kind"):
                value = data.get(key)
                assert isinstance(value, str), f"{block.id}: a Kubernetes object needs {key}"
                assert value, f"{block.id}: a Kubernetes object needs {key}"
        elif set(data) <= SPEC_FIELDS:
            check_dialects(block, parse_spec({**MINIMAL_SPEC, **data}, source=block.id))
    check_reference(block, documents)


# --- Python --------------------------------------------------------------------------------


@dataclass
class Module:
    """The text mypy checks for one block, and which block and page line each line came from."""

    name: str
    lines: list[str] = field(default_factory=list)
    origin: list[tuple[str, int]] = field(default_factory=list)  # (block id, page line)

    def add(self, block: Block, text: str, first_line: int, *, fixed_line: bool = False) -> None:
        for offset, line in enumerate(text.splitlines()):
            self.lines.append(line)
            self.origin.append((block.id, first_line if fixed_line else first_line + offset))


def module_for(block: Block, chain: list[Block]) -> Module:
    """``block`` preceded by the blocks it continues and by what each is given."""
    module = Module("docs_" + re.sub(r"\W", "_", block.id))
    for part in [*chain, block]:
        given = part.directive("given")
        if given:
            module.add(part, given, part.line - 1, fixed_line=True)
        module.add(part, part.text, part.body_line)
    return module


def modules(blocks: list[Block]) -> Iterator[tuple[Block, Module]]:
    """The module of each Python block: alone, or after the blocks it continues."""
    chains: dict[str, list[Block]] = {}
    for block in blocks:
        previous = chains.get(block.page, [])
        chain = previous if block.directive("continues") is not None else []
        yield block, module_for(block, chain)
        chains[block.page] = [*chain, block]


_MYPY_LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): (?P<kind>error|note): (?P<message>.*)$")


@pytest.fixture(scope="module")
def mypy_findings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Run mypy once over every Python block; its errors, by the block they are in."""
    folder = tmp_path_factory.mktemp("docs-blocks")
    by_path: dict[str, Module] = {}
    for _block, module in modules(PYTHON_BLOCKS):
        path = folder / f"{module.name}.py"
        path.write_text("\n".join(module.lines) + "\n", encoding="utf-8")
        by_path[path.name] = module
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--no-error-summary",
            "--no-pretty",
            "--hide-error-context",
            *(str(folder / name) for name in by_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode in (0, 1), f"mypy did not run:\n{done.stdout}\n{done.stderr}"
    findings: dict[str, list[str]] = {block.id: [] for block in PYTHON_BLOCKS}
    for line in done.stdout.splitlines():
        match = _MYPY_LINE.match(line)
        if match is None or match["kind"] != "error":
            continue
        module = by_path.get(Path(match["path"]).name)
        if module is None:
            continue  # an error in the package itself: the package's own check reports it
        block_id, page_line = module.origin[int(match["line"]) - 1]
        page = block_id.rpartition(":")[0]
        findings[block_id].append(f"{page}:{page_line}: {match['message']}")
    return findings


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[block.id for block in PYTHON_BLOCKS])
def test_python_block(block: Block, mypy_findings: dict[str, list[str]]) -> None:
    try:
        compile(block.text, block.id, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{block.page}:{block.body_line - 1 + (exc.lineno or 1)}: {exc.msg}")
    errors = mypy_findings[block.id]
    assert not errors, "the block does not type-check:\n" + "\n".join(errors)


RUNNING_BLOCKS: Final = [
    (block, module)
    for block, module in modules(PYTHON_BLOCKS)
    if block.directive("runs") is not None
]


@pytest.mark.parametrize(
    ("block", "module"), RUNNING_BLOCKS, ids=[block.id for block, _ in RUNNING_BLOCKS]
)
def test_python_block_runs(block: Block, module: Module, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(module.lines) + "\n"],
        cwd=REPO,
        env={**os.environ, "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{block.id} does not run:\n{done.stdout}\n{done.stderr}"


# --- module names ----------------------------------------------------------------------------

_SPAN = re.compile(r"`([^`\n]+)`")
_SHORT_NAME = re.compile(r"^(errors|spec|kube|lifecycle|testbed|cli)(\.[A-Za-z_]\w*)*$")
_FULL_NAME = re.compile(r"^kubedl_prefect(\.[A-Za-z_]\w*)+(?=\(|$)")


def mentioned_names() -> list[tuple[str, str]]:
    """``(page, dotted name)`` of every package name the pages mention in code spans."""
    found: dict[tuple[str, str], None] = {}
    for page in PAGES:
        relative = str(page.relative_to(REPO))
        for span in _SPAN.findall(page.read_text(encoding="utf-8")):
            span = span.strip()
            full = _FULL_NAME.match(span)
            if full is not None:
                found[(relative, full.group(0))] = None
            elif relative == "docs/architecture.md" and _SHORT_NAME.match(span):
                found[(relative, f"kubedl_prefect.{span}")] = None
    return list(found)


NAMES: Final = mentioned_names()


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute reached from one."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            target: Any = import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue
            raise
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def architecture_table() -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names in parentheses after it)`` of each row of architecture.md's tables."""
    rows = []
    for line in (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or len(cells) < 2:
            continue
        spans = _SPAN.findall(cells[-1])
        if not spans or not _SHORT_NAME.match(spans[0]):
            continue
        attributes = _SPAN.findall(cells[-1].partition("(")[2].partition(")")[0])
        rows.append((spans[0], tuple(a for a in attributes if a.isidentifier())))
    return rows


TABLE: Final = architecture_table()


def test_architecture_names_modules() -> None:
    assert ("spec.model", ("TrainingJobSpec", "RoleSpec")) in TABLE
    assert "lifecycle.kubernetes" in [module for module, _ in TABLE]


@pytest.mark.parametrize(("module", "attributes"), TABLE, ids=[m for m, _ in TABLE])
def test_architecture_module_exists(module: str, attributes: tuple[str, ...]) -> None:
    try:
        found = import_module(f"kubedl_prefect.{module}")
    except ModuleNotFoundError as exc:
        pytest.fail(f"docs/architecture.md names the module {module}, which does not exist: {exc}")
    for attribute in attributes:
        assert hasattr(found, attribute), f"docs/architecture.md: {module} has no {attribute}"


@pytest.mark.parametrize(("page", "name"), NAMES, ids=[f"{p}:{n}" for p, n in NAMES])
def test_named_module_exists(page: str, name: str) -> None:
    assert resolves(name), f"{page} mentions {name}, which does not exist"
