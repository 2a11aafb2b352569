"""Bounded, strict reading: size and alias limits in linear time, scalars, encodings, tabs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spec_helpers import minimal

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import dump_spec, load_spec, loads_spec, parse_spec, reader, render
from kubedl_prefect.spec.reader import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_SPEC_BYTES,
    parse_document,
    read_text_file,
)
from kubedl_prefect.spec.renderers import MAX_MANIFEST_BYTES

SPEC = "name: mnist\nimage: busybox:1.36\nreplicas: {master: 1, worker: 2}\n"


def refused(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        loads_spec(text)
    return info.value


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs": ``width ** levels`` scalars from a few hundred bytes."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return SPEC + "podTemplate:\n  spec:\n    bomb:\n" + "".join(f"      {x}\n" for x in lines)


def test_an_alias_bomb_is_refused_at_once() -> None:
    bomb = alias_bomb()
    assert len(bomb) < 700
    error = refused(bomb)  # 9**9 scalars once expanded: only a count that stops returns
    (issue,) = error.issues
    assert issue.path == "(yaml)"
    assert f"more than {MAX_NODES:,} nodes once its aliases are expanded" in issue.problem
    assert "line " in issue.problem
    assert "alias" in issue.fix


def test_aliases_within_the_limit_are_fine() -> None:
    text = "name: mnist\nimage: &img busybox:1.36\nreplicas:\n  master: {image: *img}\n"
    assert loads_spec(text).replicas["master"].image == "busybox:1.36"


def test_recursive_aliases_and_deep_nesting_are_refused() -> None:
    (issue,) = refused(SPEC + "podTemplate: &loop {spec: {x: *loop}}\n").issues
    assert "refers to the node that contains it" in issue.problem
    deep = SPEC + "podTemplate: {spec: {x: " + "[" * 100 + "]" * 100 + "}}\n"
    (issue,) = refused(deep).issues
    assert f"deeper than {MAX_DEPTH} levels" in issue.problem
    deeper = SPEC + "podTemplate: {spec: {x: " + "[" * 100_000 + "]" * 100_000 + "}}\n"
    (issue,) = refused(deeper).issues
    assert "nest" in issue.problem
    assert "flatten" in issue.fix


def test_an_oversize_spec_is_refused_without_being_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big.yaml"
    with big.open("w", encoding="utf-8") as handle:
        handle.write(SPEC)
        handle.write("env:\n")
        for index in range(400_000):  # about 10 MiB
            handle.write(f"  VAR_{index}: value\n")
    reads: list[int] = []
    real_open = Path.open

    def counting_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(self, *args, **kwargs)
        real_read = handle.read
        handle.read = lambda size=-1: reads.append(size) or real_read(size)  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    monkeypatch.setattr(reader, "_Composer", None)  # parsing it at all would raise TypeError
    with pytest.raises(SpecError) as info:
        load_spec(big)
    assert reads == [MAX_SPEC_BYTES + 1]  # one bounded read, not the 10 MiB
    (issue,) = info.value.issues
    assert issue.path == "(file)"
    assert f"at most {MAX_SPEC_BYTES // 1024} KiB are accepted" in issue.problem
    assert "MiB" in issue.problem
    monkeypatch.undo()
    text = big.read_text(encoding="utf-8")
    monkeypatch.setattr(reader, "_Composer", None)
    with pytest.raises(SpecError, match="at most 256 KiB"):
        loads_spec(text)  # refused by its size before any parsing


def test_a_spec_at_the_limit_reads_quickly() -> None:
    text = SPEC + "env:\n" + "".join(f"  VAR_{i}: value-{i}\n" for i in range(10_000))
    assert len(text.encode()) < MAX_SPEC_BYTES
    spec = loads_spec(text)  # its speed is bench material, not a test's
    assert spec.env is not None
    assert len(spec.env) == 10_000


def test_a_manifest_over_the_api_server_limit_is_refused() -> None:
    script = "x" * (300 * 1024)
    spec = parse_spec(minimal(command=["python", "-c", script]))  # two roles of 300 KiB
    with pytest.raises(SpecError) as info:
        render(spec, "kubeflow")
    (issue,) = info.value.issues
    assert issue.path == "(manifest)"
    assert f"at most {MAX_MANIFEST_BYTES // 1024} KiB" in issue.problem
    assert "ConfigMap" in issue.fix
    small = parse_spec(minimal(command=["python", "-c", "x" * 1024]))
    render(small, "kubeflow")


@pytest.mark.parametrize(
    ("scalar", "words"),
    [
        ("yes", "the boolean true for YAML 1.1"),
        ("Off", "the boolean false for YAML 1.1"),
        ("y", "the boolean true"),
        ("0755", "the number 493 for YAML 1.1"),
        ("1_000", "the number 1000"),
        ("1:30", "the number 90"),
        ("0b101", "the number 5"),
        ("0o17", "text for YAML 1.1"),
    ],
)
def test_scalars_yaml_versions_read_differently_are_refused(scalar: str, words: str) -> None:
    (issue,) = refused(SPEC + f"env: {{FLAG: {scalar}}}\n").issues
    assert issue.path == "(yaml)"
    assert words in issue.problem
    assert "line 4, column 13" in issue.problem
    assert "quote it" in issue.fix


def test_quoted_and_unambiguous_scalars_are_read_as_written() -> None:
    spec = loads_spec(
        SPEC + "env: {A: 'yes', B: '0755', C: 1.0e-5, D: 1.50, E: 2024-01-01, F: 1e9, G: 7}\n"
    )
    assert spec.env is not None
    assert {k: v.value for k, v in spec.env.items()} == {
        "A": "yes",
        "B": "0755",
        "C": "1.0e-5",
        "D": "1.50",
        "E": "2024-01-01",
        "F": "1e9",
        "G": "7",
    }
    resources = loads_spec(SPEC + "resources: {cpu: 0.50, memory: 1e9}\n").resources
    assert resources is not None
    assert (resources.cpu, resources.memory) == ("0.50", "1e9")


@pytest.mark.parametrize(
    ("field", "yaml_value", "path"),
    [
        ("count", "true", "replicas.worker.count"),
        ("gpus", "true", "replicas.worker.resources.gpus"),
        ("count", "2.0", "replicas.worker.count"),
        ("count", "'2'", "replicas.worker.count"),
    ],
)
def test_numbers_are_strict(field: str, yaml_value: str, path: str) -> None:
    body = (
        f"{{count: {yaml_value}}}" if field == "count" else f"{{resources: {{gpus: {yaml_value}}}}}"
    )
    (issue,) = refused(f"name: a\nimage: b\nreplicas:\n  master: 1\n  worker: {body}\n").issues
    assert issue.path == path
    assert "line 5" in issue.problem
    assert "whole number" in issue.fix


def test_booleans_are_refused_wherever_numbers_go() -> None:
    error = refused(
        SPEC.replace("worker: 2", "worker: true")
        + "backoffLimit: false\nresources: {gpus: true, cpu: true}\n"
    )
    problems = {issue.path: issue for issue in error.issues}
    assert set(problems) == {"replicas.worker", "backoffLimit", "resources.gpus", "resources.cpu"}
    assert "boolean" in problems["replicas.worker"].problem
    assert "boolean" in problems["backoffLimit"].problem
    assert "boolean" in problems["resources.cpu"].problem


def test_flags_are_strict() -> None:
    (issue,) = refused(SPEC + "network: {hostNetwork: 1}\n").issues
    assert issue.path == "network.hostNetwork"
    assert "true or false" in issue.fix


def test_a_non_utf8_file_names_line_column_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(SPEC.encode() + "labels: {team: caf\u00e9}\n".encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    (issue,) = info.value.issues
    assert issue.problem == "byte 0xe9 at line 4, column 19 is not UTF-8"
    assert "iconv" in issue.fix
    path.write_bytes("\ufeffname: x\n".encode("utf-16"))
    with pytest.raises(SpecError, match="UTF-16"):
        read_text_file(path)
    path.write_bytes(b"\xef\xbb\xbf" + SPEC.encode())  # a UTF-8 byte-order mark is fine
    assert load_spec(path).name == "mnist"


def test_a_tab_says_to_indent_with_spaces() -> None:
    (issue,) = refused("name: a\nreplicas:\n\tmaster: 1\n").issues
    assert "tab" in issue.problem
    assert "line 3, column 1" in issue.problem
    assert "indent with spaces" in issue.fix


def test_control_characters_are_named() -> None:
    (issue,) = refused(SPEC + "labels: {a: \x1b}\n").issues
    assert "U+001B at line 4, column 13" in issue.problem


def test_documents_read_the_same_by_kubectl_are_dumped() -> None:
    spec = parse_spec(minimal(env={"A": "yes", "B": "y", "C": "0755", "D": "1e3", "E": "~"}))
    text = dump_spec(spec)
    for value in ("'yes'", "'y'", "'0755'", "'1e3'", "'~'"):
        assert value in text
    assert loads_spec(text) == spec


def test_several_documents_and_keys() -> None:
    with pytest.raises(SpecError, match="expected one document, found 2"):
        loads_spec(SPEC + "---\n" + SPEC)
    (issue,) = refused(SPEC + "? [a, b]\n: c\n").issues
    assert "mapping key is itself a list" in issue.problem
    (issue,) = refused(SPEC + "labels: !custom {a: b}\n").issues
    assert "remove the tag" in issue.fix
    _, data = parse_document("base: &b {x: 1}\nmerged: {<<: *b, z: 2}\n")
    assert data["merged"] == {"x": 1, "z": 2}
