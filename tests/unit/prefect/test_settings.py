"""kubedl-prefect's settings: PREFECT_INTEGRATIONS_KUBEDL_*, and the 0.1 variables deprecated."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubedl_prefect.prefect import settings
from kubedl_prefect.prefect.blocks import LocalCluster, TrainingJob
from kubedl_prefect.prefect.settings import KubeDLSettings

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
VARIABLES = (
    "PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT",
    "PREFECT_INTEGRATIONS_KUBEDL_LOCAL_WORKSPACE",
    "PREFECT_INTEGRATIONS_KUBEDL_LOG_BURST",
    "KUBEDL_PREFECT_SPEC_ROOT",
    "KUBEDL_PREFECT_LOCAL_WORKSPACE",
)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env or prefect.toml of the checkout


def test_the_settings_are_prefect_integration_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert KubeDLSettings().log_burst == 200
    monkeypatch.setenv("PREFECT_INTEGRATIONS_KUBEDL_LOG_BURST", "7")
    monkeypatch.setenv("PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT", "/srv/specs")
    now = KubeDLSettings()
    assert (now.log_burst, now.spec_root) == (7, Path("/srv/specs"))


def test_prefect_toml_sets_them_too(tmp_path: Path) -> None:
    (tmp_path / "prefect.toml").write_text("[integrations.kubedl]\nlog_burst = 9\n")
    assert KubeDLSettings().log_burst == 9


def test_a_block_reads_its_spec_file_from_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "specs"
    root.mkdir()
    (root / "mnist.yaml").write_text((EXAMPLES / "pytorch-mnist.yaml").read_text())
    monkeypatch.setenv("PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT", str(root))
    job = TrainingJob(spec_file="mnist.yaml", cluster=LocalCluster())
    assert job.training_spec().name


def test_the_local_workspace_comes_from_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PREFECT_INTEGRATIONS_KUBEDL_LOCAL_WORKSPACE", str(tmp_path / "ws"))
    assert LocalCluster().namespace == str((tmp_path / "ws").resolve())


@pytest.mark.parametrize(
    ("old", "read"),
    [
        ("KUBEDL_PREFECT_SPEC_ROOT", settings.spec_root),
        ("KUBEDL_PREFECT_LOCAL_WORKSPACE", settings.local_workspace),
    ],
)
def test_the_old_variables_still_work_with_a_deprecation_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, old: str, read: object
) -> None:
    monkeypatch.setenv(old, str(tmp_path / "old"))
    assert callable(read)
    with pytest.warns(DeprecationWarning, match=old):
        assert read() == tmp_path / "old"
    new = old.replace("KUBEDL_PREFECT_", "PREFECT_INTEGRATIONS_KUBEDL_")
    monkeypatch.setenv(new, str(tmp_path / "new"))
    assert read() == tmp_path / "new"  # the new one wins, no warning


def test_only_the_settings_module_reads_the_settings_variables() -> None:
    # Blocks, runs and tasks read settings through KubeDLSettings, never the variables.
    surface = Path(settings.__file__).parent
    names = ("SPEC_ROOT_ENV", "WORKSPACE_ENV", "default_workspace", "spec_root()", '_ROOT"')
    readers = sorted(
        path.name
        for path in surface.rglob("*.py")
        if path.name != "settings.py" and any(name in path.read_text() for name in names)
    )
    assert readers == ["blocks.py"]  # it calls settings.spec_root(), nothing else
    text = (surface / "blocks.py").read_text()
    assert "from kubedl_prefect.prefect.settings import spec_root" in text
    assert "SPEC_ROOT_ENV" not in text
    assert "default_workspace" not in text
