"""Property tests: accepted specs render to manifests the real CRDs accept; nothing else escapes.

1. Any spec the model accepts renders, for each dialect, either to a manifest that passes the
   operator's CRD schema (strict, offline) or to a SpecError naming only operator rules.
2. Arbitrary data, arbitrary mutations of valid data, and arbitrary text never raise anything
   but SpecError.
3. A spec dumped to YAML loads back equal.
"""

from __future__ import annotations

import copy
import os
import string
from typing import Any

from conftest import CrdErrors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spec_strategies import attempt, valid_spec_data

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    Dialect,
    dump_spec,
    loads_spec,
    parse_spec,
    render,
    spec_hash,
)

# SPEC_PROPERTY_EXAMPLES=2000 for a deeper search than the quick default.
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("SPEC_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Operator-rule issues a valid spec may still get for one dialect.
DIALECT_PATHS = {"replicas.master", "elastic", "nprocPerNode"}

# --- properties ----------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(data=valid_spec_data())
def test_accepted_specs_pass_the_crd_schemas(data: dict[str, Any], crd_errors: CrdErrors) -> None:
    spec = parse_spec(data)
    for dialect in Dialect:
        manifest, error = attempt(lambda d=dialect: render(spec, d))
        if error is not None:
            if dialect is not Dialect.TRAINER:  # Trainer refuses much: test_trainer covers it
                assert {issue.path for issue in error.issues} <= DIALECT_PATHS
            continue
        assert crd_errors(dialect, spec.framework, manifest) == []


@PROPERTY_SETTINGS
@given(data=valid_spec_data())
def test_dump_and_load_round_trip(data: dict[str, Any]) -> None:
    spec = parse_spec(data)
    again = loads_spec(dump_spec(spec))
    assert again == spec
    assert spec_hash(again) == spec_hash(spec)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


def well_formed(error: SpecError | None) -> bool:
    return error is None or (
        bool(error.issues)
        and all(issue.path and issue.problem and issue.fix for issue in error.issues)
    )


def outcome_is_spec_or_spec_error(data: Any) -> None:
    spec, error = attempt(lambda: parse_spec(data))
    assert well_formed(error)
    if spec is None:
        return
    for dialect in Dialect:
        _, error = attempt(lambda d=dialect: render(spec, d))
        assert well_formed(error)


@PROPERTY_SETTINGS
@given(data=json_values)
def test_arbitrary_data_raises_only_spec_error(data: Any) -> None:
    outcome_is_spec_or_spec_error(data)


FIELD_NAMES = [
    "name",
    "framework",
    "replicas",
    "image",
    "resources",
    "gpus",
    "requests",
    "limits",
    "env",
    "count",
    "restartPolicy",
    "elastic",
    "minReplicas",
    "maxReplicas",
    "gang",
    "minAvailable",
    "volumes",
    "checkpoint",
    "location",
    "pvc",
    "mountPath",
    "podTemplate",
    "nodeSelector",
    "tolerations",
    "affinity",
    "labels",
    "master",
    "worker",
    "launcher",
    "nvidia.com/gpu",
    "cpu",
    "memory",
    "nprocPerNode",
    "slotsPerWorker",
    "network",
]


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    data = copy.deepcopy(draw(valid_spec_data()))
    for _ in range(draw(st.integers(1, 3))):
        target: Any = data
        for _ in range(draw(st.integers(0, 4))):
            if isinstance(target, dict) and target:
                nxt = target[draw(st.sampled_from(sorted(target, key=str)))]
            elif isinstance(target, list) and target:
                nxt = target[draw(st.integers(0, len(target) - 1))]
            else:
                break
            if not isinstance(nxt, dict | list):
                break
            target = nxt
        value = draw(json_values)
        if isinstance(target, dict):
            key = draw(
                st.one_of(st.sampled_from(FIELD_NAMES), st.text(string.ascii_letters, max_size=6))
            )
            target[key] = value
        elif isinstance(target, list) and target:
            target[draw(st.integers(0, len(target) - 1))] = value
    return data


@PROPERTY_SETTINGS
@given(data=mutated())
def test_mutated_specs_raise_only_spec_error(data: Any) -> None:
    outcome_is_spec_or_spec_error(data)


@PROPERTY_SETTINGS
@given(
    text=st.one_of(
        st.text(max_size=80),
        st.builds(lambda d: dump_spec(parse_spec(d)), valid_spec_data()).map(
            lambda t: t[: len(t) // 2]
        ),
    )
)
def test_arbitrary_text_raises_only_spec_error(text: str) -> None:
    _, error = attempt(lambda: loads_spec(text))
    assert well_formed(error)
