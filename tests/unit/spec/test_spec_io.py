"""Loading specs from YAML (errors with line numbers) and dumping them back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from spec_helpers import EXAMPLES, minimal

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    dump_manifests,
    dump_spec,
    dump_yaml,
    load_spec,
    loads_spec,
    parse_spec,
    spec_to_data,
)


def test_problems_carry_the_line_of_the_field() -> None:
    text = "name: mnist\nimage: x\nreplicas:\n  master: 1\n  worker:\n    count: 2\n    bogus: 1\n"
    with pytest.raises(SpecError) as info:
        loads_spec(text, source="job.yaml")
    (issue,) = info.value.issues
    assert issue.path == "replicas.worker.bogus"
    assert "(line 7)" in issue.problem
    assert "job.yaml" in str(info.value)


def test_cross_field_problems_carry_lines_too() -> None:
    text = "name: mnist\nimage: x\nreplicas:\n  master: 1\n  worker:\n    count: 0\n"
    with pytest.raises(SpecError) as info:
        loads_spec(text)
    assert "(line 6)" in info.value.issues[0].problem
    text = (
        "name: mnist\nimage: x\nresources:\n  requests:\n    nvidia.com/gpu: 1\n"
        "replicas: {master: 1}\n"
    )
    with pytest.raises(SpecError) as info:
        loads_spec(text)
    (issue,) = info.value.issues
    assert issue.path == "resources.requests"
    assert "(line 4)" in issue.problem


def test_malformed_yaml_names_the_line() -> None:
    with pytest.raises(SpecError) as info:
        loads_spec("name: mnist\nreplicas: [master\n")
    (issue,) = info.value.issues
    assert issue.path == "(yaml)"
    assert "line 3" in issue.problem


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(SpecError) as info:
        loads_spec("name: a\nimage: x\nreplicas: {master: 1}\nname: b\n")
    (issue,) = info.value.issues
    assert "duplicate key 'name'" in issue.problem
    assert "line 4" in issue.problem
    assert "line 1" in issue.problem


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n"])
def test_documents_that_are_not_mappings(text: str) -> None:
    with pytest.raises(SpecError) as info:
        loads_spec(text)
    assert info.value.issues[0].path == "(document)"


def test_several_documents_are_refused() -> None:
    with pytest.raises(SpecError) as info:
        loads_spec("name: a\n---\nname: b\n")
    assert info.value.issues[0].path == "(yaml)"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "missing.yaml")
    assert info.value.issues[0].path == "(file)"


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_round_trip(example: Path) -> None:
    spec = load_spec(example)
    text = dump_spec(spec)
    assert loads_spec(text) == spec
    assert text.startswith("apiVersion: kubedl-prefect.io/v1alpha1\nkind: TrainingJob\n")


def test_dump_uses_the_count_shorthand_and_leaves_defaults_out() -> None:
    data = spec_to_data(
        parse_spec(
            minimal(replicas={"master": 1, "worker": {"count": 2, "restartPolicy": "Never"}})
        )
    )
    assert data["replicas"] == {"master": 1, "worker": {"count": 2, "restartPolicy": "Never"}}
    assert "cleanPodPolicy" not in data
    assert list(data)[:4] == ["apiVersion", "kind", "name", "framework"]


@pytest.mark.parametrize(
    "text",
    [
        "smile \U0001f600",
        "a\x85b",
        "a\u2028b",
        "a\u2029b",
        "é ☃ \t tab",
        "two\nlines\n",
        "'quoted'",
    ],
)
def test_dumped_strings_read_back_as_they_were(text: str) -> None:
    # libyaml's emitter escapes what PyYAML's wrote raw or folded (the spec.io docstring).
    data = {"value": text, "list": [text, {"nested": text}], text: "as a key"}
    assert yaml.safe_load(dump_yaml(data)) == data
    assert list(yaml.safe_load_all(dump_manifests([data, data]))) == [data, data]


def test_dumped_text_escapes_what_a_reader_could_misread() -> None:
    assert dump_yaml({"smile": "\U0001f600", "nel": "a\x85b"}) == (
        'smile: "\\U0001F600"\nnel: "a\\Nb"\n'
    )
