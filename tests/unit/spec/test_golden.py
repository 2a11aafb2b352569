"""Golden files: each example rendered for each dialect, byte for byte.

Regenerate after an intended change with
``UPDATE_GOLDEN=1 uv run pytest tests/unit/spec/test_golden.py`` and review the diff
(``git diff tests/golden``) against the CRDs before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spec_helpers import EXAMPLES, GOLDEN

from kubedl_prefect.spec import Dialect, dump_manifests, load_spec, render

UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
CASES = [
    (example, dialect)
    for example in sorted(EXAMPLES.glob("*.yaml"))
    for dialect in Dialect
    if not (example.name == "pytorch-elastic.yaml" and dialect is Dialect.KUBEDL)
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
