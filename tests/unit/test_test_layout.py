"""The test tree itself: pytest can collect every test module of it.

Test folders have no ``__init__.py`` (pytest's default "prepend" import mode), so two test modules
with one basename in different folders stop collection of the whole run with "import file
mismatch" — it happened twice (``test_trainer.py``, ``test_kueue.py``) before this test.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own() -> None:
    folders: defaultdict[str, list[str]] = defaultdict(list)
    for module in sorted(TESTS.rglob("test_*.py")):
        folders[module.name].append(str(module.parent.relative_to(TESTS)))
    assert len(folders) > 100  # the walk found the tree
    clashes = {name: where for name, where in folders.items() if len(where) > 1}
    assert clashes == {}, f"rename one of each: {clashes}"
