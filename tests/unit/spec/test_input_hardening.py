"""Untrusted input: names with a trailing newline, YAML tags outside JSON, NUL characters, and
Python data without bounds."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from spec_helpers import minimal, paths

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    RoleSpec,
    TrainingJobSpec,
    import_manifest,
    loads_spec,
    parse_spec,
    spec_hash,
)
from kubedl_prefect.spec.naming import is_dns1035_label
from kubedl_prefect.spec.quantity import is_quantity
from kubedl_prefect.spec.reader import MAX_DEPTH, MAX_NODES, is_ambiguous_text, parse_document

SPEC = "name: mnist\nimage: busybox:1.36\nreplicas: {master: 1, worker: 2}\n"


def refused(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value


# --- names with a trailing newline ----------------------------------------------------------

NEWLINE_NAMES = [
    ({"name": "mnist\n"}, "name"),
    ({"replicas": {"master": 1, "worker\n": 2}}, "replicas"),
    ({"labels": {"team\n": "ml"}}, "labels"),
    ({"labels": {"team": "ml\n"}}, "labels.team"),
    ({"annotations": {"example.com/x\n": "y"}}, "annotations"),
    ({"nodeSelector": {"example.com\n/pool": "gpu"}}, "nodeSelector"),
    ({"env": {"LR\n": "1"}}, "env"),
    ({"env": {"KEY": {"secretKeyRef": {"name": "s", "key": "k\n"}}}}, "env.KEY"),
    ({"env": {"KEY": {"secretKeyRef": {"name": "s\n", "key": "k"}}}}, "env.KEY"),
    ({"env": {"POD": {"fieldRef": {"fieldPath": "metadata.name\n"}}}}, "env.POD"),
    ({"serviceAccountName": "trainer\n"}, "serviceAccountName"),
    ({"imagePullSecrets": ["regcred\n"]}, "imagePullSecrets[0]"),
    ({"volumes": [{"name": "data\n", "mountPath": "/d", "pvc": "c"}]}, "volumes[0].name"),
    ({"volumes": [{"name": "data", "mountPath": "/d", "pvc": "c\n"}]}, "volumes[0].pvc"),
    ({"ports": [{"containerPort": 80, "name": "http\n"}]}, "ports[0].name"),
    ({"resources": {"cpu": "1\n"}}, "resources.cpu"),
    ({"resources": {"limits": {"example.com/fpga\n": "1"}}}, "resources.limits"),
]


@pytest.mark.parametrize(("fields", "path"), NEWLINE_NAMES)
def test_a_trailing_newline_is_refused_in_every_name(fields: dict[str, Any], path: str) -> None:
    error = refused(minimal(**fields))
    assert any(p.startswith(path) for p in paths(error)), paths(error)


def test_pattern_helpers_take_the_whole_text() -> None:
    assert is_dns1035_label("mnist")
    assert not is_dns1035_label("mnist\n")
    assert is_quantity("16Gi")
    assert not is_quantity("16Gi\n")
    assert is_ambiguous_text("yes")
    assert not is_ambiguous_text("yes\n")
    with pytest.raises(SpecError, match="DNS-1035"):
        loads_spec(SPEC.replace("name: mnist", 'name: "mnist\\n"'))


# --- YAML tags ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "tag", "words"),
    [
        ("!!set {python, train.py}", "!!set", "a set has no order"),
        ("!!binary cHl0aG9u", "!!binary", "base64"),
        ("!!omap [{a: b}]", "!!omap", "plain mapping"),
        ("[!!timestamp 2024-01-01]", "!!timestamp", "quote"),
        ("[!!python/name:os.system x]", "!!python/name:os.system", "remove the tag"),
        ("[!custom x]", "!custom", "remove the tag"),
    ],
)
def test_tags_outside_json_are_refused_with_line_and_fix(value: str, tag: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        loads_spec(SPEC + f"command: {value}\n")
    (issue,) = info.value.issues
    assert issue.path == "(yaml)"
    assert f"the tag {tag} is not allowed" in issue.problem
    assert "at line 4, column" in issue.problem
    assert words in issue.fix


def test_a_set_would_have_changed_the_hash_between_runs() -> None:
    # What !!set used to give: the order of a set of strings changes with the hash seed.
    ordered = parse_spec(minimal(command=["python", "train.py"]))
    swapped = parse_spec(minimal(command=["train.py", "python"]))
    assert spec_hash(ordered) != spec_hash(swapped)
    error = refused(minimal(command={"python", "train.py"}))
    assert paths(error) == ["command"]
    assert "a set has no order" in error.issues[0].fix


def test_json_tags_are_read_when_the_value_fits_them() -> None:
    _, data = parse_document('a: !!str 12\nb: !!int "3"\nc: !!float 1\nd: !!map {x: !!null ""}\n')
    assert data == {"a": "12", "b": 3, "c": 1.0, "d": {"x": None}}
    for text, words in [
        ('a: !!int "0755"', "YAML 1.1"),
        ('a: !!bool "yes"', "YAML 1.1"),
        ('a: !!int "ten"', "is not an integer"),
        ("a: !!seq {x: 1}", "the tag !!seq is not allowed"),
    ]:
        with pytest.raises(SpecError, match=words):
            parse_document(text)


def test_merge_keys_stay_plain_json_mappings() -> None:
    text = SPEC + "x-defaults: &d {cpu: 2}\n"
    spec_text = text.replace(
        "x-defaults: &d {cpu: 2}\n", "resources: {<<: {cpu: 2}, memory: 1Gi}\n"
    )
    spec = loads_spec(spec_text)
    assert spec.resources is not None
    assert (spec.resources.cpu, spec.resources.memory) == (
        "2",
        "1Gi",
    )


# --- NUL characters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        'command: [python, "train.py\\0"]',
        'args: ["--lr\\x00"]',
        'env: {LR: "1\\0"}',
        'env: {"L\\0R": "1"}',
        'workingDir: "/work\\0"',
    ],
)
def test_a_nul_escape_is_refused_with_its_line_and_column(line: str) -> None:
    with pytest.raises(SpecError) as info:
        loads_spec(SPEC + line + "\n")
    (issue,) = info.value.issues
    assert "NUL character" in issue.problem
    column = line.index('"') + 1  # where the quoted scalar starts
    assert f"at line 4, column {column}" in issue.problem


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"command": ["python", "train\x00.py"]}, "command[1]"),
        ({"args": ["\x00"]}, "args[0]"),
        ({"env": {"LR": "1\x00"}}, "env.LR"),
        ({"env": {"L\x00R": "1"}}, "env['L\\x00R']"),
        ({"workingDir": "/work\x00"}, "workingDir"),
        ({"name": "mnist\x00"}, "name"),
        ({"image": "busybox\x00"}, "image"),
        (
            {"replicas": {"master": 1, "worker": {"count": 2, "command": ["a\x00"]}}},
            "replicas.worker.command[0]",
        ),
        ({"command": ["\ud800"]}, "command[0]"),
    ],
)
def test_nul_in_python_data_is_refused_with_the_field_path(
    fields: dict[str, Any], path: str
) -> None:
    error = refused(minimal(**fields))
    assert paths(error) == [path]
    assert "NUL character" in error.issues[0].problem or "surrogate" in error.issues[0].problem


def test_nul_in_a_model_built_directly_is_refused_too() -> None:
    role = RoleSpec.model_construct(count=1, command=["a\x00"])
    error = refused(minimal(replicas={"master": role}))
    assert paths(error) == ["replicas.master.command[0]"]


# --- Python data without bounds -------------------------------------------------------------


def shared_dict(levels: int) -> dict[str, Any]:
    """A dict whose two keys are the same dict, ``levels`` deep: ``2 ** levels`` leaves."""
    node: dict[str, Any] = {"leaf": "x"}
    for _ in range(levels):
        node = {"a": node, "b": node}
    return node


def test_a_shared_reference_bomb_is_refused_at_once() -> None:
    data = minimal(podTemplate={"spec": {"bomb": shared_dict(40)}})
    error = refused(data)  # 2**40 leaves: only a count that stops at the limit returns at all
    (issue,) = error.issues
    assert f"more than {MAX_NODES:,} nodes" in issue.problem
    assert "counted each time it is reached" in issue.problem
    assert issue.path.startswith("podTemplate.spec.bomb.")
    with pytest.raises(ValidationError, match="nodes"):
        TrainingJobSpec.model_validate(data)
    with pytest.raises(ValidationError, match="nodes"):
        RoleSpec(pod_template={"spec": {"bomb": shared_dict(40)}})


def test_a_manifest_given_as_python_data_is_bounded_too() -> None:
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "bomb"},
        "spec": shared_dict(40),
    }
    with pytest.raises(SpecError, match=f"the manifest has more than {MAX_NODES:,} nodes"):
        import_manifest(manifest)


def test_python_data_has_the_yaml_depth_limit() -> None:
    looped: dict[str, Any] = {}
    looped["again"] = looped
    error = refused(minimal(podTemplate={"spec": {"loop": looped}}))
    assert f"deeper than {MAX_DEPTH} levels" in error.issues[0].problem
    deep: Any = "x"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert "deeper" in refused(minimal(podTemplate={"spec": {"deep": deep}})).issues[0].problem


def test_data_within_the_limits_is_fine() -> None:
    small = shared_dict(10)  # 2**10 leaves, shared: within the limit when expanded
    spec = parse_spec(minimal(podTemplate={"spec": {"x-shared": small}}))
    assert spec.pod_template is not None
