"""Golden files: each example rendered for each dialect, byte for byte.

Regenerate after an intended change with
``UPDATE_GOLDEN=1 uv run pytest tests/unit/spec/test_golden.py`` and review the diff
(``git diff tests/golden``) against the CRDs before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spec_helpers import EXAMPLES, GOLDEN, TRAINER_SPECS, refused

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import Dialect, dump_manifests, load_spec, render

UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
EXAMPLE_SPECS = sorted(EXAMPLES.glob("*.yaml"))
CASES = [
    *(
        (example, dialect)
        for example in EXAMPLE_SPECS
        for dialect in Dialect
        if not refused(example, dialect.value)
    ),
    *((spec, Dialect.TRAINER) for spec in sorted(TRAINER_SPECS.glob("*.yaml"))),
]
REFUSALS = [
    (example, dialect)
    for example in EXAMPLE_SPECS
    for dialect in Dialect
    if refused(example, dialect.value)
]


@pytest.mark.parametrize(
    ("example", "dialect"), CASES, ids=[f"{e.stem}-{d.value}" for e, d in CASES]
)
def test_render_matches_golden(example: Path, dialect: Dialect) -> None:
    rendered = dump_manifests([render(load_spec(example), dialect)])
    golden = GOLDEN / dialect.value / example.name
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered, encoding="utf-8")
    assert golden.is_file(), f"{golden} is missing: run with UPDATE_GOLDEN=1 and review it"
    assert rendered == golden.read_text(encoding="utf-8")


def test_no_stale_goldens() -> None:
    expected = {GOLDEN / d.value / e.name for e, d in CASES}
    present = set(GOLDEN.glob("*/*.yaml"))
    assert present == expected


@pytest.mark.parametrize(
    ("example", "dialect"), REFUSALS, ids=[f"{e.stem}-{d.value}" for e, d in REFUSALS]
)
def test_refused_combinations_are_refused(example: Path, dialect: Dialect) -> None:
    with pytest.raises(SpecError):
        render(load_spec(example), dialect)
