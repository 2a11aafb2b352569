"""The main job of ``make demo``: check every example spec and render it for both operators.

``python -m kubedl_prefect.spec.demo [SPEC...]`` (``scripts/demo`` passes ``examples/*.yaml``)
prints, for each spec, whether it is valid and the custom resource of each dialect, then a summary.
A spec that one operator cannot run (``examples/pytorch-elastic.yaml``: KubeDL has no elastic
policy) is not hidden: the report names the dialect and gives the spec error's message.

Exit code 0 when every spec is valid and renders for at least one dialect; 1 otherwise (a spec
that is invalid, unreadable, or fits no operator).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec.io import dump_manifests, load_spec
from kubedl_prefect.spec.model import TrainingJobSpec
from kubedl_prefect.spec.renderers import render
from kubedl_prefect.spec.types import Dialect
from kubedl_prefect.spec.validation import validate


@dataclass(frozen=True)
class Rendering:
    """One spec rendered for one dialect, or the reason it cannot be.

    Args:
        dialect: The operator.
        manifest: The custom resource as YAML, when the spec fits the operator.
        refusal: Why the operator cannot run the spec, when it does not fit.
    """

    dialect: Dialect
    manifest: str | None
    refusal: SpecError | None


@dataclass(frozen=True)
class ExampleReport:
    """What the demo found for one spec file.

    Args:
        path: The spec file.
        spec: The parsed spec, when the file holds a valid one.
        error: Why the file holds no valid spec (unreadable, malformed or invalid).
        renderings: One per dialect, for a valid spec.
    """

    path: Path
    spec: TrainingJobSpec | None
    error: SpecError | None
    renderings: tuple[Rendering, ...]

    @property
    def ok(self) -> bool:
        """Whether the spec is valid and at least one operator can run it."""
        return self.spec is not None and any(r.manifest is not None for r in self.renderings)


def check_example(path: Path) -> ExampleReport:
    """Validate the spec at ``path`` and render it for every dialect."""
    try:
        spec = load_spec(path)
    except SpecError as exc:
        return ExampleReport(path, None, exc, ())
    renderings = []
    for dialect in Dialect:
        try:
            validate(spec, dialect, source=str(path))
            manifest = dump_manifests([render(spec, dialect)])
        except SpecError as exc:
            renderings.append(Rendering(dialect, None, exc))
        else:
            renderings.append(Rendering(dialect, manifest, None))
    return ExampleReport(path, spec, None, tuple(renderings))


def run_demo(paths: Sequence[Path], out: TextIO) -> int:
    """Check every spec in ``paths``, write the report to ``out``, and return the exit code."""
    reports = [check_example(path) for path in paths]
    for report in reports:
        _write_report(report, out)
    return _write_summary(reports, out)


def _write_report(report: ExampleReport, out: TextIO) -> None:
    if report.spec is None:
        out.write(f"== {report.path}: INVALID\n{_indent(str(report.error))}\n")
        return
    spec = report.spec
    roles = ", ".join(
        f"{role.value}: {role_spec.count}" for role, role_spec in spec.replicas.items()
    )
    if spec.elastic is not None:
        roles += f"; elastic: {spec.elastic.min_replicas} to {spec.elastic.max_replicas} workers"
    out.write(f"== {report.path}: valid {spec.framework.value} job {spec.name!r} ({roles})\n")
    for rendering in report.renderings:
        if rendering.manifest is not None:
            out.write(f"-- {rendering.dialect.value}\n{rendering.manifest}")
        else:
            out.write(
                f"-- {rendering.dialect.value}: NOT RENDERABLE, the operator cannot run this "
                f"spec:\n{_indent(str(rendering.refusal))}\n"
            )


def _write_summary(reports: Sequence[ExampleReport], out: TextIO) -> int:
    rendered = sum(r.manifest is not None for report in reports for r in report.renderings)
    total = len(reports) * len(Dialect)
    valid = sum(report.spec is not None for report in reports)
    out.write(
        f"== summary: {valid} of {len(reports)} specs valid, {rendered} of {total} renderings\n"
    )
    for report in reports:
        for rendering in report.renderings:
            if rendering.refusal is not None:
                issues = rendering.refusal.issues
                fields = ", ".join(issue.path for issue in issues)
                count = f"{len(issues)} problem{'s' if len(issues) != 1 else ''}"
                out.write(
                    f"   not renderable for {rendering.dialect.value}: {report.path} "
                    f"({count}, above: {fields})\n"
                )
    failed = [report for report in reports if not report.ok]
    for report in failed:
        why = "invalid" if report.spec is None else "fits no operator"
        out.write(f"   FAILED: {report.path}: {why}\n")
    if not reports:
        out.write("   FAILED: no spec given\n")
        return 1
    return 1 if failed else 0


def _indent(text: str) -> str:
    return "\n".join(f"   {line}" for line in text.splitlines())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m kubedl_prefect.spec.demo [SPEC...]``, default examples/*.yaml."""
    args = list(sys.argv[1:] if argv is None else argv)
    paths = [Path(arg) for arg in args] or sorted(Path("examples").glob("*.yaml"))
    return run_demo(paths, sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
