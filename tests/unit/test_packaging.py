"""A plain ``pip install kubedl-prefect`` pulls neither torch nor the extras' own dependencies.

Read from the lock (``uv.lock``): the packages a plain install resolves to are the closure of
the project's core dependencies, each package's extras followed where a requirement names them.
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _lock() -> dict[str, list[dict[str, Any]]]:
    """The lock's packages by name (a name may be locked at several versions, per marker)."""
    data = tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))
    packages: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for package in data["package"]:
        packages[package["name"]].append(package)
    return packages


def _closure(
    packages: dict[str, list[dict[str, Any]]], requirements: list[dict[str, Any]]
) -> set[str]:
    """Names of every package ``requirements`` pull in, transitively."""
    seen: set[tuple[str, str | None]] = set()  # (package, None) or (package, one of its extras)
    todo = [(r["name"], extra) for r in requirements for extra in (None, *r.get("extra", ()))]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for package in packages[name]:
            if extra is None:
                found = package.get("dependencies", [])
            else:
                found = package.get("optional-dependencies", {}).get(extra, [])
            todo += [(r["name"], e) for r in found for e in (None, *r.get("extra", ()))]
    return {name for name, _ in seen}


def test_a_plain_install_pulls_no_extra() -> None:
    packages = _lock()
    (project,) = packages["kubedl-prefect"]
    plain = _closure(packages, project["dependencies"])
    assert {"prefect", "pydantic", "kubernetes-asyncio", "mlflow-skinny", "psutil"} <= plain
    assert "torch" not in plain
    assert not {name for name in plain if name.startswith(("nvidia-", "triton"))}
    assert "uv" not in plain  # local serving's
    extras = project["optional-dependencies"]
    assert sorted(extras) == ["local-serving", "testbed", "torch"]
    assert "torch" in _closure(packages, extras["torch"])
    # The test bed's one dependency, cryptography, comes with Prefect itself today: the extra
    # `testbed` adds nothing to a plain install now, and keeps the test bed's if Prefect drops it.
    assert {r["name"] for r in extras["testbed"]} == {"cryptography"}
    assert "cryptography" in _closure(packages, [{"name": "prefect"}])
