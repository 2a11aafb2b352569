"""The registration module: what the prefect.collections entry point and `block register -m` name.

Each check runs in a fresh interpreter, so that no block module was imported before (in this
test process, other tests have imported them all).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COLLECTION = "kubedl_prefect.prefect.collection"
SLUGS = {
    "kubedl-kubernetes-cluster": "KubernetesCluster",
    "kubedl-local-cluster": "LocalCluster",
    "kubedl-training-job": "TrainingJob",
    "kubedl-mlflow-registry": "MlflowRegistry",
    "kubedl-kserve-serving": "KServeServing",
}
BLOCK_MODULES = ["kubedl_prefect.prefect.blocks", "kubedl_prefect.prefect.model_blocks"]

# Runs in the fresh interpreter: the registry of block types before and after the imports.
CHECK = """
import importlib, inspect, json, sys
from prefect.blocks.core import Block
from prefect.utilities.dispatch import get_registry_for_type

def ours():
    return sorted(s for s in (get_registry_for_type(Block) or {}) if s.startswith("kubedl-"))

before = ours()
for name in sys.argv[1:]:
    importlib.import_module(name)
after = ours()
module = sys.modules[sys.argv[-1]]
members = sorted(
    n for n, v in inspect.getmembers(module) if v is not None and Block.is_block_class(v)
)
classes = {s: Block.get_block_class_from_key(s).__name__ for s in after}
print(json.dumps({"before": before, "after": after, "members": members, "classes": classes}))
"""


def _fresh(*modules: str) -> dict[str, object]:
    import json

    done = subprocess.run(
        [sys.executable, "-c", CHECK, *modules],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_importing_the_collection_registers_every_block_type() -> None:
    result = _fresh(COLLECTION)
    # Nothing of ours is registered by importing Prefect: the import below does it all.
    assert result["before"] == []
    assert result["after"] == sorted(SLUGS)
    assert result["classes"] == SLUGS
    # `prefect block register -m` registers the block classes among the module's names.
    assert result["members"] == sorted(SLUGS.values())


@pytest.mark.parametrize("module", BLOCK_MODULES)
def test_each_block_module_imports_alone_first(module: str) -> None:
    result = _fresh(module, COLLECTION)
    assert result["after"] == sorted(SLUGS)


def test_the_entry_point_names_the_collection() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["prefect.collections"] == {"kubedl_prefect": COLLECTION}
