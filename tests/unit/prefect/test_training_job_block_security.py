"""The training-job block as untrusted input: its spec file is confined and never quoted unless
it is a spec; its privileged pod settings are refused, or reported when the spec allows them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from kubedl_prefect.errors import KubeDLPrefectError, SpecError
from kubedl_prefect.prefect.blocks import LocalCluster, TrainingJob
from kubedl_prefect.spec import PodSecurityLevel, load_spec

EXAMPLES = Path(__file__).parents[3] / "examples"
SECRET = "s3cr3t-value"
SPEC = {"name": "mnist", "image": "busybox:1.36", "replicas": {"master": 1}}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The flow's working directory, with a spec in it; secrets lie next to it."""
    folder = tmp_path / "project"
    (folder / "specs").mkdir(parents=True)
    (folder / "specs" / "mnist.yaml").write_text((EXAMPLES / "pytorch-mnist.yaml").read_text())
    (tmp_path / "id_rsa").write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n")
    (tmp_path / "kubeconfig.yaml").write_text(f"apiVersion: v1\nkind: Config\ntoken: {SECRET}\n")
    (folder / "kubeconfig.yaml").write_text(f"apiVersion: v1\nkind: Config\ntoken: {SECRET}\n")
    (folder / "evil.yaml").symlink_to(tmp_path / "kubeconfig.yaml")
    monkeypatch.chdir(folder)
    monkeypatch.delenv("KUBEDL_PREFECT_SPEC_ROOT", raising=False)
    monkeypatch.delenv("PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT", raising=False)
    return folder


def read_refused(spec_file: str) -> str:
    job = TrainingJob(spec_file=spec_file, cluster=LocalCluster())
    with pytest.raises(SpecError) as info:
        job.training_spec()
    text = str(info.value)
    assert SECRET not in text
    return text


def test_a_spec_file_in_the_working_directory_is_read(project: Path) -> None:
    job = TrainingJob(spec_file="specs/mnist.yaml", cluster=LocalCluster())
    assert job.training_spec() == load_spec(project / "specs" / "mnist.yaml")


@pytest.mark.parametrize(
    ("spec_file", "words"),
    [
        ("/etc/passwd", "only .yaml, .yml and .json files are read"),
        ("../id_rsa", "only .yaml, .yml and .json files are read"),
        ("../kubeconfig.yaml", "outside the folder spec files are read from"),
        ("evil.yaml", "outside the folder spec files are read from"),
        ("kubeconfig.yaml", "is not a spec document"),
        ("missing.yaml", "is not a file"),
    ],
)
def test_a_block_cannot_read_or_quote_other_files(
    project: Path, spec_file: str, words: str
) -> None:
    assert words in read_refused(spec_file)


def test_privileged_settings_in_a_block_are_refused_without_the_opt_in() -> None:
    privileged = {**SPEC, "podTemplate": {"spec": {"hostPID": True}}}
    with pytest.raises(ValidationError, match="Baseline Pod Security level"):
        TrainingJob(spec=privileged, cluster=LocalCluster())


async def test_the_block_reports_what_the_spec_allows(caplog: pytest.LogCaptureFixture) -> None:
    allowed = {
        **SPEC,
        "podSecurity": "privileged",
        "podTemplate": {"spec": {"hostPID": True, "securityContext": {"runAsUser": 0}}},
    }
    job = TrainingJob(spec=allowed, cluster=LocalCluster())
    warnings = job.pod_security_warnings()
    assert [(w.path, w.level) for w in warnings] == [
        ("podTemplate.spec.hostPID", PodSecurityLevel.BASELINE),
        ("podTemplate.spec.securityContext.runAsUser", PodSecurityLevel.RESTRICTED),
    ]
    with caplog.at_level(logging.WARNING), pytest.raises(KubeDLPrefectError, match="no key"):
        await job.astart()  # outside a flow run and without a key: nothing is submitted
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [line.split(": ")[1] for line in logged] == [w.path for w in warnings]
    assert all(line.startswith("Pod security: ") for line in logged)
