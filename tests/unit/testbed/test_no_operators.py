"""``testbed up --no-operators`` needs no operator module: none of theirs is built or installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.testbed import cluster, content
from kubedl_prefect.testbed import operators as training_operators
from kubedl_prefect.testbed.build import GoBinary
from kubedl_prefect.testbed.components import Ports
from kubedl_prefect.testbed.controlplane import APISERVER, CONTROL_PLANE, CONTROL_PLANE_BINARIES
from kubedl_prefect.testbed.testbed import Testbed
from kubedl_prefect.testbed.upstream import KWOK, GoModule

KWOK_LOGS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "logs.kwok.x-k8s.io"},
    "spec": {"group": "kwok.x-k8s.io", "versions": [{"name": "v1alpha1"}]},
}


@pytest.fixture
def only_kwok(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """A module cache that holds kwok's module alone: asking for another one fails the test.

    Returns the module paths asked for.
    """
    asked: list[str] = []

    def module_dir(module: GoModule) -> Path:
        asked.append(module.path)
        if module != KWOK:
            pytest.fail(f"{module.path} was asked for without the operators")
        folder = tmp_path / "kwok" / "kustomize" / "crd" / "bases"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kwok.x-k8s.io_logs.yaml").write_text(yaml.safe_dump(KWOK_LOGS_CRD))
        return tmp_path / "kwok"

    monkeypatch.setattr(content, "module_dir", module_dir)
    return asked


def _binary_modules(binaries: list[GoBinary]) -> set[str]:
    return {str(b.module.path if isinstance(b.module, GoModule) else b.module) for b in binaries}


def test_without_operators_only_the_control_plane_is_built_and_run(cache: Path) -> None:
    bed = Testbed("bare", ports=Ports(29950), operators=False)
    assert bed.binaries() == list(CONTROL_PLANE_BINARIES)
    assert bed.components() == list(CONTROL_PLANE)
    assert not _binary_modules(bed.binaries()) & _binary_modules(
        training_operators.OPERATOR_BINARIES
    )


def test_without_operators_only_kwoks_crds_are_installed(
    cache: Path, only_kwok: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Any]] = []

    def call(layout: object, operation: Callable[..., Any], argument: Any) -> list[str]:
        calls.append((operation.__name__, argument))
        return ["logs.kwok.x-k8s.io"]

    monkeypatch.setattr(cluster, "call", call)
    bed = Testbed("bare", ports=Ports(29950), operators=False)
    assert [source.module for source in bed.crd_sources()] == [KWOK]
    bed._install_crds(seeded=False)
    bed._install_crds(seeded=True)
    assert calls == [
        ("apply_crds", [KWOK_LOGS_CRD]),
        ("wait_crds_established", ["logs.kwok.x-k8s.io"]),
    ]
    key = bed._seed_key({APISERVER.binary: Path("/bin") / APISERVER.binary})
    assert len(key) == 64
    assert set(only_kwok) == {KWOK.path}


def test_with_operators_every_crd_is_installed(cache: Path) -> None:
    bed = Testbed("full", ports=Ports(29960))
    assert bed.crd_sources() == content.CRD_SOURCES
    operator_modules = {source.module for source in content.CRD_SOURCES} - {KWOK}
    assert operator_modules  # the operators' CRDs come from their own modules
    assert set(training_operators.OPERATOR_BINARIES) <= set(bed.binaries())
