"""A plain ``pip install kubedl-prefect`` pulls neither the test bed nor torch.

What it pulls is read from the lock (``uv.lock``): the packages a plain install resolves to are
the closure of the project's core dependencies, each package's extras followed where a
requirement names them. What it contains is read from the wheels, built here as ``uv build``
builds them (hatchling): the test bed is the distribution kubedl-prefect-testbed
(``packages/kubedl-prefect-testbed``), which only the extra ``testbed`` installs.
"""

from __future__ import annotations

import tomllib
import zipfile
from collections import defaultdict
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from hatchling.builders.wheel import WheelBuilder

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "packages" / "kubedl-prefect-testbed"


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
    assert "kubedl-prefect-testbed" not in plain
    extras = project["optional-dependencies"]
    assert sorted(extras) == ["local-serving", "testbed", "torch"]
    assert "torch" in _closure(packages, extras["torch"])
    # The extra `testbed` is the test bed's distribution, which brings the test bed's own
    # dependency (cryptography, its PKI; Prefect also requires it today).
    assert {r["name"] for r in extras["testbed"]} == {"kubedl-prefect-testbed"}
    (testbed,) = packages["kubedl-prefect-testbed"]
    assert testbed["source"] == {"editable": "packages/kubedl-prefect-testbed"}
    assert {r["name"] for r in testbed["dependencies"]} == {"cryptography", "kubedl-prefect"}
    assert "torch" not in _closure(packages, extras["testbed"])


def _wheel(root: Path, into: Path) -> zipfile.ZipFile:
    """The standard wheel of the project at ``root``, built into ``into`` as ``uv build`` does."""
    (built,) = WheelBuilder(str(root)).build(directory=str(into), versions=["standard"])
    return zipfile.ZipFile(built)


def _requires(wheel: zipfile.ZipFile) -> list[str]:
    (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    return HeaderParser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist") or []


def test_the_wheel_leaves_the_test_bed_to_its_own_distribution(tmp_path: Path) -> None:
    main = _wheel(ROOT, tmp_path)
    testbed = _wheel(TESTBED, tmp_path)
    in_main = set(main.namelist())
    in_testbed = {name for name in testbed.namelist() if ".dist-info/" not in name}
    assert "kubedl_prefect/__init__.py" in in_main
    assert "kubedl_prefect/cli/commands.py" in in_main
    assert not {name for name in in_main if name.startswith("kubedl_prefect/testbed")}
    # The test bed's wheel: exactly the package's files, data included, and nothing else.
    tree = ROOT / "kubedl_prefect" / "testbed"
    files = {
        f"kubedl_prefect/testbed/{path.relative_to(tree).as_posix()}"
        for path in tree.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert in_testbed == files
    assert {
        "kubedl_prefect/testbed/__init__.py",
        "kubedl_prefect/testbed/cli.py",
        "kubedl_prefect/testbed/stages/pod.yaml",
        "kubedl_prefect/testbed/go/kube/go.mod",
        "kubedl_prefect/testbed/nodeagent/shims/nslookup",
    } <= in_testbed
    # What pip reads: the plain install requires neither; the extra requires the test bed's
    # distribution at the same version, which requires this one and its PKI's library.
    requires = _requires(main)
    assert "kubedl-prefect-testbed==0.1.0; extra == 'testbed'" in requires
    assert not [
        r
        for r in requires
        if r.startswith(("torch", "kubedl-prefect-testbed")) and "extra ==" not in r
    ]
    assert sorted(_requires(testbed)) == ["cryptography>=42", "kubedl-prefect==0.1.0"]
