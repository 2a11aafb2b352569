"""The main job (``make demo``: ``scripts/demo``) stays green and says what it cannot render."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec import Dialect, dump_manifests, load_spec, render, validate
from kubedl_prefect.spec.demo import ExampleReport, Rendering, check_example, main, run_demo

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
ELASTIC = Path("examples/pytorch-elastic.yaml")


def expected_refusals() -> dict[tuple[str, Dialect], SpecError]:
    """Which example each operator refuses, computed from the library itself."""
    refused = {}
    for path in EXAMPLES:
        for dialect in Dialect:
            try:
                validate(load_spec(path), dialect, source=f"examples/{path.name}")
            except SpecError as exc:
                refused[(f"examples/{path.name}", dialect)] = exc
    return refused


def test_scripts_demo_runs_green_and_reports_what_it_cannot_render() -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv is not on PATH: run `make install` (scripts/install)"
    done = subprocess.run(
        [str(REPO / "scripts" / "demo"), "--specs-only"],  # the spec check alone
        cwd=REPO / "tests",  # the script finds the repository itself
        env={**os.environ, "UV_NO_SYNC": "1"},  # the environment under test, as it is
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    refusals = expected_refusals()
    assert ("examples/pytorch-elastic.yaml", Dialect.KUBEDL) in refusals
    for path in EXAMPLES:
        name = f"examples/{path.name}"
        spec = load_spec(path)
        assert f"== {name}: valid {spec.framework.value} job {spec.name!r}" in out
        for dialect in Dialect:
            refusal = refusals.get((name, dialect))
            if refusal is None:
                manifest = dump_manifests([render(spec, dialect)])
                assert f"-- {dialect.value}\n{manifest}" in out
            else:
                # The refusal is named with its dialect and the spec error's own message.
                header = f"-- {dialect.value}: NOT RENDERABLE"
                assert header in out
                section = out[out.index(f"== {name}") :]
                section = section[section.index(header) :]
                for line in str(refusal).splitlines():
                    assert line.strip() in section
                assert f"not renderable for {dialect.value}: {name}" in out
    rendered = len(EXAMPLES) * len(Dialect) - len(refusals)
    summary = f"== summary: {len(EXAMPLES)} of {len(EXAMPLES)} specs valid, {rendered} of "
    assert summary in out
    assert "FAILED" not in out


def test_elastic_example_is_refused_by_kubedl_only() -> None:
    report = check_example(REPO / ELASTIC)
    assert report.ok
    by_dialect = {r.dialect: r for r in report.renderings}
    kubedl, kubeflow = by_dialect[Dialect.KUBEDL], by_dialect[Dialect.KUBEFLOW]
    assert kubedl.manifest is None
    assert kubedl.refusal is not None
    assert "elastic" in [issue.path for issue in kubedl.refusal.issues]
    assert kubeflow.refusal is None
    assert kubeflow.manifest is not None
    assert yaml.safe_load(kubeflow.manifest)["spec"]["elasticPolicy"]["maxReplicas"] == 4


def test_an_invalid_spec_fails_the_demo(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nimage: busybox\nreplicas: {master: 1}\nimagePullPolicyy: Always\n")
    out = io.StringIO()
    assert run_demo([REPO / "examples" / "xgboost-iris.yaml", broken], out) == 1
    text = out.getvalue()
    assert f"== {broken}: INVALID" in text
    assert "did you mean `imagePullPolicy`?" in text
    assert f"FAILED: {broken}: invalid" in text
    assert "1 of 2 specs valid" in text


def test_a_spec_no_operator_can_run_is_not_ok() -> None:
    refusal = SpecError([SpecIssue("x", "refused", "fix it")])
    report = ExampleReport(
        Path("x.yaml"),
        load_spec(REPO / "examples" / "xgboost-iris.yaml"),
        None,
        tuple(Rendering(dialect, None, refusal) for dialect in Dialect),
    )
    assert not report.ok


def test_no_spec_is_a_failure() -> None:
    out = io.StringIO()
    assert run_demo([], out) == 1
    assert "FAILED: no spec given" in out.getvalue()


def test_main_defaults_to_the_examples(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"== examples/{path.name}: valid" in out for path in EXAMPLES)
