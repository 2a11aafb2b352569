"""Every kind in every dialect, rendered by us, run to Succeeded by the real operators.

The manifests come from the spec renderer (not written by hand as in test_operators.py): this is
the check that what we render is what each operator really reads, up to the job's end. KubeDL
v0.5.0 once crashed (nil pointer, ``apis/training/v1alpha1/common.go``) on the MPIJob we
rendered, so the test also fails when any operator process died or was restarted meanwhile.
Pods are run by kwok's stages, driven by the ``testbed.kubedl-prefect.io/run-duration``
annotation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from kubedl_prefect.errors import SpecError
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.spec import Dialect, Framework, TrainingJobSpec, loads_spec, validate

pytestmark = pytest.mark.integration

STAGE = "testbed.kubedl-prefect.io"

#: The replicas of a small job of each kind (the roles each operator needs).
REPLICAS = {
    Framework.PYTORCH: "  master: 1\n  worker: 1\n",
    Framework.TENSORFLOW: "  ps: 1\n  worker: 2\n",
    # Workers outlive the launcher, as sshd does: the job ends when the launcher does.
    Framework.MPI: (
        "  launcher: 1\n"
        "  worker:\n"
        "    count: 2\n"
        "    podTemplate:\n"
        "      metadata:\n"
        f'        annotations: {{"{STAGE}/run-duration": "120s"}}\n'
    ),
    Framework.XGBOOST: "  master: 1\n  worker: 1\n",
}


#: The replicas of a small TrainJob: Trainer runs every node from one template, and an MPI
#: launcher's success ends the JobSet (it deletes the nodes' Job), so no role outlives another.
TRAINER_REPLICAS = {
    Framework.PYTORCH: "  master: 1\n  worker: 1\n",
    Framework.MPI: "  launcher: 1\n  worker: 2\n",
    Framework.XGBOOST: "  master: 1\n  worker: 1\n",
}

#: The runtime the test bed installs with Volcano gang scheduling enforced (docs/testbed.md).
VOLCANO_RUNTIME = "torch-distributed-volcano-scheduler"


def small_spec(framework: Framework, dialect: Dialect = Dialect.KUBEFLOW) -> TrainingJobSpec:
    """A small gang-scheduled job of ``framework`` whose pods succeed after 2 s.

    For ``trainer``, gang scheduling and retries are the runtime's: a PyTorch job names the
    test bed's Volcano-scheduled runtime, the others start from Trainer's default runtimes.
    """
    if dialect == Dialect.TRAINER:
        runtime = (
            f"runtime: {{name: {VOLCANO_RUNTIME}}}\n" if framework == Framework.PYTORCH else ""
        )
        return loads_spec(
            f"""
name: every-{framework.value}
framework: {framework.value}
image: registry.example/train:1.0
command: [python, train.py]
resources: {{cpu: 1, memory: 1Gi}}
annotations: {{"{STAGE}/run-duration": "2s"}}
{runtime}replicas:
{TRAINER_REPLICAS[framework]}"""
        )
    return loads_spec(
        f"""
name: every-{framework.value}
framework: {framework.value}
image: registry.example/train:1.0
command: [python, train.py]
resources: {{cpu: 1, memory: 1Gi}}
annotations: {{"{STAGE}/run-duration": "2s"}}
backoffLimit: 1
gang: {{scheduler: volcano}}
replicas:
{REPLICAS[framework]}"""
    )


@pytest.mark.parametrize("dialect", list(Dialect), ids=[d.value for d in Dialect])
@pytest.mark.parametrize("framework", list(Framework), ids=[f.value for f in Framework])
async def test_every_kind_runs_to_success(
    framework: Framework,
    dialect: Dialect,
    namespace: str,
    admin_kubeconfig: Path,
    unchanged_operators: None,
) -> None:
    if dialect == Dialect.TRAINER and framework == Framework.TENSORFLOW:
        # Trainer v2 has no TensorFlow runtime: refused before anything reaches the cluster.
        with pytest.raises(SpecError, match="TensorFlow"):
            validate(small_spec(framework), dialect)
        return
    backend = KubernetesBackend(
        namespace=namespace, dialect=dialect, kubeconfig=str(admin_kubeconfig)
    )
    try:
        ref = await backend.submit(
            small_spec(framework, dialect), key=f"every-{framework.value}", attempt=1
        )
        outcome = await backend.wait_completed(ref)
    finally:
        await backend.close()
    assert outcome.succeeded, outcome


def crash_looping_worker(framework: Framework) -> TrainingJobSpec:
    """A job whose worker exits 1 every second under ``OnFailure``, with ``backoffLimit: 1``."""
    fail = f'"{STAGE}/run-duration": "1s", "{STAGE}/exit-code": "1", "{STAGE}/fail-reason": "Error"'
    return loads_spec(
        f"""
name: backoff-{framework.value}
framework: {framework.value}
image: registry.example/train:1.0
command: [python, train.py]
resources: {{cpu: 1, memory: 1Gi}}
annotations: {{"{STAGE}/run-duration": "120s"}}
backoffLimit: 1
cleanPodPolicy: None
replicas:
  master: 1
  worker:
    count: 1
    restartPolicy: OnFailure
    podTemplate:
      metadata:
        annotations: {{{fail}}}
"""
    )


async def test_kubedl_reads_no_run_policy_of_an_xgboostjob(
    namespace: str, admin_kubeconfig: Path, unchanged_operators: None
) -> None:
    """Pins a KubeDL v0.5.0 defect (docs/operators.md): an XGBoostJob's run policy is ignored.

    The same crash-looping worker fails a PyTorchJob at its backoffLimit; the XGBoostJob, whose
    run policy KubeDL decodes from a key its CRD prunes, is still running after that.
    """
    backend = KubernetesBackend(
        namespace=namespace, dialect=Dialect.KUBEDL, kubeconfig=str(admin_kubeconfig)
    )
    try:
        xgboost = await backend.submit(
            crash_looping_worker(Framework.XGBOOST), key="backoff-xgb", attempt=1
        )
        pytorch = await backend.submit(
            crash_looping_worker(Framework.PYTORCH), key="backoff-pt", attempt=1
        )
        failed = await backend.wait_completed(pytorch)
        assert not failed.succeeded, failed
        assert "backoff limit" in str(failed), failed
    finally:
        await backend.close()
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(admin_kubeconfig), client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        await asyncio.sleep(3)  # more restarts than failed the PyTorchJob
        job = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "training.kubedl.io", "v1alpha1", namespace, "xgboostjobs", xgboost.name
        )
        worker = await client.CoreV1Api(api).read_namespaced_pod(
            f"{xgboost.name}-worker-0", namespace
        )
    assert worker.status.container_statuses[0].restart_count >= 2, worker.status
    assert job["spec"]["backoffLimit"] == 1  # stored as rendered...
    conditions = [c["type"] for c in job.get("status", {}).get("conditions", [])]
    assert "Failed" not in conditions, job["status"]  # ...but not applied
    assert job["status"]["replicaStatuses"]["Worker"].get("active") == 1
