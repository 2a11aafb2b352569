"""Imported upstream manifests run to Succeeded on the test bed, through the lifecycle.

``test_import_roundtrip.py`` shows that ``import`` then ``render`` gives the job the operator
would have got from the original; this runs that job: each manifest of the suite that the test
bed can run is imported, submitted with :class:`KubernetesBackend` in its own dialect, and
followed to the end (kwok runs every container for 3 s, then exits 0). The test bed cannot run
jobs whose pods mount claims it has no storage for, nor MPI jobs (their launcher execs into the
workers, which kwok's containers cannot take); :func:`runs_here` names those.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubedl_prefect.lifecycle.backend import WaitTimeouts
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.spec import Framework, TrainingJobSpec
from kubedl_prefect.spec.porting import ImportedSpec, import_manifests

pytestmark = pytest.mark.integration

MANIFESTS = Path(__file__).resolve().parents[1] / "unit" / "spec" / "manifests"
SUITE = sorted([*MANIFESTS.glob("kubeflow/*.yaml"), *MANIFESTS.glob("kubedl/*.yaml")])


def runs_here(spec: TrainingJobSpec) -> bool:
    """Whether the test bed can run this job: no MPI, no PersistentVolumeClaims."""
    if spec.framework == Framework.MPI:
        return False
    volumes = [*(spec.volumes or [])]
    for role in spec.replicas.values():
        volumes += [*(getattr(role, "volumes", None) or [])]
    return not any(volume.pvc for volume in volumes)


IMPORTED = [
    (path, imported)
    for path in SUITE
    for imported in import_manifests(path.read_text(encoding="utf-8"), source=str(path))
]
RUNNABLE = [(path, imported) for path, imported in IMPORTED if runs_here(imported.spec)]


def test_most_of_the_suite_runs_here() -> None:
    assert len(RUNNABLE) >= len(IMPORTED) // 2
    assert {i.dialect.value for _, i in RUNNABLE} == {"kubedl", "kubeflow"}


@pytest.mark.parametrize(
    ("path", "imported"), RUNNABLE, ids=[f"{p.parent.name}/{p.stem}" for p, _ in RUNNABLE]
)
async def test_an_imported_upstream_job_runs_to_success(
    path: Path, imported: ImportedSpec, namespace: str, admin_kubeconfig: Path
) -> None:
    backend = KubernetesBackend(
        namespace=namespace,
        dialect=imported.dialect,
        kubeconfig=str(admin_kubeconfig),
    )
    try:
        ref = await backend.submit(imported.spec, key=path.stem)
        outcome = await backend.wait_completed(
            ref, timeouts=WaitTimeouts(admission_s=90, startup_s=90, completion_s=120)
        )
    finally:
        await backend.close()
    assert outcome.succeeded, (outcome.status, outcome.diagnosis)
