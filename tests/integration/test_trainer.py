"""Kubeflow Trainer v2 and JobSet in the test bed: the real controllers, their real webhooks.

TrainJobs are written as a user would (``kubernetes_asyncio`` with the administrator
kubeconfig) against the runtimes the test bed installs from Trainer's release; the JobSets,
Jobs, pods and PodGroups are the controllers' own, the pods run by kwok's stages. What these
tests see is what the ``trainer`` dialect reads on a real cluster.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from kubedl_prefect.testbed import content, trainer
from kubedl_prefect.testbed.testbed import Testbed

pytestmark = [pytest.mark.integration]

Obj = dict[str, Any]

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


@asynccontextmanager
async def connect(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration, persist_config=False
    )
    async with client.ApiClient(configuration=configuration) as api:
        yield api


async def eventually(
    what: str, read: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], timeout_s: float
) -> Any:
    """Poll ``read()`` until ``done`` holds for what it returns; fail with the last value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = await read()
        except ApiException as exc:
            if exc.status != 404:
                raise
            last = None
        if last is not None and done(last):
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached in {timeout_s:.0f}s; last seen: {last}")
        await asyncio.sleep(0.25)


def train_job(
    name: str,
    runtime: str,
    *,
    nodes: int,
    node_runs: str = "4s",
    node_annotations: dict[str, str] | None = None,
    **trainer_fields: Any,
) -> Obj:
    """A TrainJob as a user writes it; the ``node`` pods run ``node_runs`` under kwok.

    kwok's annotations (``run-duration``, ``exit-code``...) reach the pods through a runtime
    patch, as any pod annotation of the ``trainer`` dialect does.
    """
    annotations = {content.RUN_DURATION: node_runs, **(node_annotations or {})}
    pod_template = {"metadata": {"annotations": annotations}}
    node_job = {"name": "node", "template": {"spec": {"template": pod_template}}}
    patch = {
        "manager": "kubedl-prefect.io/tests",
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node_job]}}},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"numNodes": nodes, **trainer_fields},
            "runtimePatches": [patch],
        },
    }


def conditions(obj: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


class Cluster:
    """The few calls these tests make, as the administrator."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.admission = client.AdmissionregistrationV1Api(api)
        self.namespace = namespace

    async def create_train_job(self, manifest: Obj) -> Obj:
        created: Obj = await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "trainjobs", manifest
        )
        return created

    async def get(self, group: str, version: str, plural: str, name: str) -> Obj:
        found: Obj = await self.custom.get_namespaced_custom_object(
            group, version, self.namespace, plural, name
        )
        return found

    async def train_job(self, name: str) -> Obj:
        return await self.get(GROUP, VERSION, "trainjobs", name)

    async def pods(self, job_set: str) -> list[Any]:
        listed = await self.core.list_namespaced_pod(
            self.namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={job_set}"
        )
        return list(listed.items)

    async def complete(self, name: str, timeout_s: float = 60.0) -> Obj:
        found: Obj = await eventually(
            f"TrainJob {name} Complete",
            lambda: self.train_job(name),
            lambda job: conditions(job).get("Complete", {}).get("status") == "True",
            timeout_s,
        )
        return found


@pytest.fixture
async def cluster(admin_kubeconfig: Path, namespace: str) -> AsyncIterator[Cluster]:
    async with connect(admin_kubeconfig) as api:
        yield Cluster(api, namespace)


# -- the controllers ---------------------------------------------------------------------------


def test_trainer_and_jobset_run_supervised_and_healthy(testbed: Testbed) -> None:
    state = testbed.status()
    entries = {c.name: c for c in state.components}
    for name in ("jobset-controller", "trainer-controller"):
        entry = entries[name]
        assert entry.pid, entry
        assert entry.running, entry
        assert entry.healthy, entry
        assert not entry.held
    names = [c.name for c in state.components]
    assert names.index("jobset-controller") < names.index("trainer-controller")
    log = entries["trainer-controller"].log.read_text()
    # The status server of the TrainJobStatus gate runs, on loopback.
    port = testbed.layout.ports.offset(trainer.PORT_OFFSETS["trainer-status-server"])
    assert f'"address":"127.0.0.1:{port}"' in log


async def test_webhooks_are_registered_by_url_on_loopback_with_the_test_bed_ca(
    cluster: Cluster, testbed: Testbed
) -> None:
    validating = await cluster.admission.list_validating_webhook_configuration()
    mutating = await cluster.admission.list_mutating_webhook_configuration()
    configurations: list[Any] = [*validating.items, *mutating.items]
    # Kueue's configurations reuse kubebuilder's webhook names (mjobset.kb.io): not theirs.
    hooks = {
        hook.name: hook
        for item in configurations
        if not item.metadata.name.startswith("kueue-")
        for hook in item.webhooks or []
    }
    ports = testbed.layout.ports
    trainer_url = f"https://127.0.0.1:{ports.offset(trainer.PORT_OFFSETS['trainer-webhook'])}/"
    jobset_url = f"https://127.0.0.1:{ports.offset(trainer.PORT_OFFSETS['jobset-webhook'])}/"
    for name in (
        "validator.trainjob.trainer.kubeflow.org",
        "validator.clustertrainingruntime.trainer.kubeflow.org",
        "validator.trainingruntime.trainer.kubeflow.org",
        "defaulter.trainjob.trainer.kubeflow.org",
    ):
        assert hooks[name].client_config.url.startswith(trainer_url), name
        assert hooks[name].failure_policy == "Fail"
    for name in ("mjobset.kb.io", "vjobset.kb.io", "mpod.kb.io", "vpod.kb.io"):
        assert hooks[name].client_config.url.startswith(jobset_url), name
    # Only pods of a JobSet go through JobSet's pod webhooks (upstream's object selector).
    selector = hooks["mpod.kb.io"].object_selector.match_expressions[0]
    assert (selector.key, selector.operator) == ("jobset.sigs.k8s.io/jobset-name", "Exists")
    ca = testbed.layout.ca_file.read_bytes()
    assert base64.b64decode(hooks["vjobset.kb.io"].client_config.ca_bundle) == ca


async def test_the_release_runtimes_are_installed(cluster: Cluster) -> None:
    listed = await cluster.custom.list_cluster_custom_object(
        GROUP, VERSION, "clustertrainingruntimes"
    )
    runtimes = {r["metadata"]["name"]: r for r in listed["items"]}
    assert {
        "torch-distributed",
        "deepspeed-distributed",
        "mlx-distributed",
        trainer.VOLCANO_RUNTIME,
        trainer.VOLCANO_SCHEDULED_RUNTIME,
    } <= set(runtimes)
    assert "mpi" in runtimes["deepspeed-distributed"]["spec"]["mlPolicy"]
    assert runtimes[trainer.VOLCANO_RUNTIME]["spec"]["podGroupPolicy"] == {"volcano": {}}
    derived = runtimes[trainer.VOLCANO_SCHEDULED_RUNTIME]
    assert derived["metadata"]["labels"][trainer.DERIVED_FROM_LABEL] == trainer.VOLCANO_RUNTIME


# -- TrainJobs ---------------------------------------------------------------------------------


async def test_torch_train_job_runs_through_jobset_job_and_pods_to_complete(
    cluster: Cluster,
) -> None:
    name = "mnist"
    await cluster.create_train_job(
        train_job(
            name,
            "torch-distributed",
            nodes=2,
            image=IMAGE,
            command=["torchrun", "train.py"],
            resourcesPerNode={"limits": {content.GPU_RESOURCE: "1"}},
        )
    )
    job_set = await eventually(
        "JobSet", lambda: cluster.get("jobset.x-k8s.io", "v1alpha2", "jobsets", name), bool, 30
    )
    owner = job_set["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainJob", name, True)
    job = await eventually(
        "Job",
        lambda: cluster.batch.read_namespaced_job(f"{name}-node-0", cluster.namespace),
        bool,
        30,
    )
    assert (job.spec.parallelism, job.spec.completions) == (2, 2)
    running = await eventually(
        "both pods Running",
        lambda: cluster.pods(name),
        lambda pods: len(pods) == 2 and all(p.status.phase == "Running" for p in pods),
        30,
    )
    by_host = {p.spec.hostname: p for p in running}
    assert set(by_host) == {f"{name}-node-0-0", f"{name}-node-0-1"}
    pod = by_host[f"{name}-node-0-0"]
    assert pod.spec.subdomain == name
    assert pod.spec.restart_policy == "OnFailure"  # JobSet's default
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert env["PET_NNODES"].value == "2"
    assert env["PET_MASTER_ADDR"].value == f"{name}-node-0-0.{name}"
    assert env["PET_MASTER_PORT"].value == "29500"
    assert "job-completion-index" in env["PET_NODE_RANK"].value_from.field_ref.field_path
    assert env["KUBEFLOW_TRAINER_SERVER_URL"].value.endswith(
        f"/namespaces/{cluster.namespace}/trainjobs/{name}/status"
    )
    finished = await cluster.complete(name)
    complete = conditions(finished)["Complete"]
    assert complete["reason"] == "AllJobsCompleted"
    assert complete["message"] == "jobset completed successfully"
    assert finished["status"]["jobsStatus"] == [
        {"name": "node", "active": 0, "failed": 0, "ready": 0, "succeeded": 1, "suspended": 0}
    ]
    pods = await cluster.pods(name)
    assert sorted(p.status.phase for p in pods) == ["Succeeded", "Succeeded"]


async def test_mpi_train_job_is_accepted_and_runs_launcher_and_nodes(cluster: Cluster) -> None:
    name = "ds"
    # The nodes serve sshd until the launcher is done: they run longer than it (3 s).
    await cluster.create_train_job(
        train_job(name, "deepspeed-distributed", nodes=2, node_runs="120s")
    )

    def both_running(pods: list[Any]) -> bool:
        label = "jobset.sigs.k8s.io/replicatedjob-name"
        running = {p.metadata.labels[label] for p in pods if p.status.phase == "Running"}
        return running == {"launcher", "node"}

    running = await eventually(
        "launcher and node pods Running", lambda: cluster.pods(name), both_running, 30
    )
    launcher = next(p for p in running if p.spec.hostname.startswith(f"{name}-launcher"))
    env = {e.name: e.value for e in launcher.spec.containers[0].env}
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert not any(key.startswith("PET_") for key in env)
    hostfile = await cluster.core.read_namespaced_config_map(
        f"{name}-mpi-hostfile", cluster.namespace
    )
    assert hostfile.data
    finished = await cluster.complete(name)
    assert conditions(finished)["Complete"]["reason"] == "AllJobsCompleted"
    assert {entry["name"] for entry in finished["status"]["jobsStatus"]} == {"launcher", "node"}

    # The launcher's success completes the JobSet (its successPolicy), which then deletes the
    # Jobs still active: the nodes' Job goes, with its pods.
    async def node_jobs() -> list[Any]:
        listed = await cluster.batch.list_namespaced_job(
            cluster.namespace, label_selector="jobset.sigs.k8s.io/replicatedjob-name=node"
        )
        return [job for job in listed.items if not job.metadata.deletion_timestamp]

    await eventually("the nodes' Job deleted", node_jobs, lambda jobs: not jobs, 30)


async def test_a_reserved_pet_variable_is_refused_by_trainers_own_webhook(
    cluster: Cluster,
) -> None:
    manifest = train_job(
        "badenv", "torch-distributed", nodes=2, env=[{"name": "PET_NNODES", "value": "5"}]
    )
    with pytest.raises(ApiException) as refused:
        await cluster.create_train_job(manifest)
    assert refused.value.status == 403
    status = json.loads(refused.value.body or "")
    assert status["reason"] == "Forbidden"
    message = status["message"]
    assert message.startswith(
        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
    )
    assert "must not have reserved envs, invalid envs configured: [PET_NNODES]" in message


async def test_the_volcano_runtime_makes_a_pod_group_named_like_the_train_job(
    cluster: Cluster,
) -> None:
    name = "gang"
    await cluster.create_train_job(train_job(name, trainer.VOLCANO_RUNTIME, nodes=2))
    group = await eventually(
        "PodGroup",
        lambda: cluster.get("scheduling.volcano.sh", "v1beta1", "podgroups", name),
        bool,
        30,
    )
    assert group["spec"]["minMember"] == 2
    assert group["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    await cluster.complete(name)
    pods = await cluster.pods(name)
    assert {p.metadata.annotations["scheduling.k8s.io/group-name"] for p in pods} == {name}
    # Upstream's runtime leaves the scheduler alone: the default one placed these pods.
    assert {p.spec.scheduler_name for p in pods} == {"default-scheduler"}


async def test_the_volcano_scheduled_runtime_holds_a_gang_that_does_not_fit(
    cluster: Cluster, testbed: Testbed
) -> None:
    fits, too_big = "gang-fits", "gang-too-big"
    gpus = testbed.status().gpus_per_node
    await cluster.create_train_job(
        train_job(
            fits,
            trainer.VOLCANO_SCHEDULED_RUNTIME,
            nodes=2,
            resourcesPerNode={"limits": {content.GPU_RESOURCE: "1"}},
        )
    )
    await cluster.create_train_job(
        train_job(
            too_big,
            trainer.VOLCANO_SCHEDULED_RUNTIME,
            nodes=testbed.status().nodes + 1,
            resourcesPerNode={"limits": {content.GPU_RESOURCE: str(gpus)}},
        )
    )
    await cluster.complete(fits)
    pods = await cluster.pods(fits)
    assert {p.spec.scheduler_name for p in pods} == {"volcano"}
    group = await eventually(
        "the oversize gang held by Volcano",
        lambda: cluster.get("scheduling.volcano.sh", "v1beta1", "podgroups", too_big),
        lambda g: conditions(g).get("Unschedulable", {}).get("status") == "True",
        30,
    )
    assert conditions(group)["Unschedulable"]["reason"] == "NotEnoughResources"
    held = await cluster.pods(too_big)
    assert held
    assert all(p.status.phase == "Pending" and not p.spec.node_name for p in held)
    job = await cluster.train_job(too_big)
    assert "Complete" not in conditions(job)
    assert "Failed" not in conditions(job)


async def test_a_failing_node_fails_the_train_job_with_the_jobsets_reason(
    cluster: Cluster,
) -> None:
    name = "boom"
    await cluster.create_train_job(
        train_job(
            name,
            "torch-distributed",
            nodes=2,
            node_runs="1s",
            node_annotations={content.EXIT_CODE: "3"},
        )
    )
    failed = await eventually(
        f"TrainJob {name} Failed",
        lambda: cluster.train_job(name),
        lambda job: conditions(job).get("Failed", {}).get("status") == "True",
        60,
    )
    condition = conditions(failed)["Failed"]
    assert condition["reason"] == "FailedJobs"
    assert condition["message"] == (
        f"jobset failed due to one or more job failures (first failed job: {name}-node-0)"
    )
    assert "Complete" not in conditions(failed)
    assert failed["status"]["jobsStatus"][0]["failed"] == 1
    # The pods restart in place (OnFailure) until the Job's backoffLimit (6), then the Job
    # controller deletes them: the Job keeps the reason.
    job = await cluster.batch.read_namespaced_job(f"{name}-node-0", cluster.namespace)
    job_failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert job_failed.reason == "BackoffLimitExceeded"


async def test_a_suspended_train_job_is_suspended_not_failed_and_runs_when_resumed(
    cluster: Cluster,
) -> None:
    name = "held"
    manifest = train_job(name, "torch-distributed", nodes=1)
    manifest["spec"]["suspend"] = True
    await cluster.create_train_job(manifest)
    suspended = await eventually(
        "Suspended, with its JobSet's jobs",
        lambda: cluster.train_job(name),
        # The condition may come a moment before jobsStatus, and jobsStatus before its
        # suspended count (both seen on a loaded machine).
        lambda job: (
            conditions(job).get("Suspended", {}).get("status") == "True"
            and [j.get("suspended") for j in job["status"].get("jobsStatus") or []] == [1]
        ),
        30,
    )
    assert conditions(suspended)["Suspended"]["reason"] == "Suspended"
    assert suspended["status"]["jobsStatus"][0]["suspended"] == 1
    assert await cluster.pods(name) == []
    await cluster.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.namespace,
        "trainjobs",
        name,
        [{"op": "replace", "path": "/spec/suspend", "value": False}],
    )
    finished = await cluster.complete(name)
    resumed = conditions(finished)["Suspended"]
    assert (resumed["status"], resumed["reason"]) == ("False", "Resumed")


# -- status and supervision (these stop and crash the shared Trainer: they come last) ----------


def test_testbed_status_reports_both_healthy(testbed: Testbed) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "kubedl_prefect.testbed", "status", "--name", testbed.name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    for name in ("jobset-controller", "trainer-controller"):
        assert re.search(rf"^\s*{name}\s+\d+\s+healthy\s", shown.stdout, re.MULTILINE), name


@pytest.mark.exclusive  # stops or restarts a shared component
async def test_train_jobs_are_refused_while_trainer_is_down_and_run_after_a_crash(
    cluster: Cluster, testbed: Testbed
) -> None:
    testbed.stop("trainer-controller")
    try:
        with pytest.raises(ApiException) as refused:
            await cluster.create_train_job(train_job("while-down", "torch-distributed", nodes=1))
        assert refused.value.status == 500
        message = json.loads(refused.value.body or "")["message"]
        assert 'failed calling webhook "defaulter.trainjob.trainer.kubeflow.org"' in message
    finally:
        testbed.start("trainer-controller")
    before = next(c for c in testbed.status().components if c.name == "trainer-controller")
    assert before.pid is not None
    os.kill(before.pid, signal.SIGKILL)  # a crash: the supervisor starts it again

    async def restarted() -> Any:
        entries = {c.name: c for c in testbed.status().components}
        return entries["trainer-controller"]

    after = await eventually(
        "trainer-controller restarted",
        restarted,
        lambda c: bool(c.running and c.healthy and c.pid != before.pid),
        60,
    )
    assert after.restarts == before.restarts + 1
    await cluster.create_train_job(train_job("after-crash", "torch-distributed", nodes=1))
    await cluster.complete("after-crash")


# -- a runtime that names its replicated Jobs otherwise ----------------------------------------


@asynccontextmanager
async def worker_named_runtime(cluster: Cluster, name: str) -> AsyncIterator[str]:
    """A ClusterTrainingRuntime like ``torch-distributed`` whose trainer Job is ``worker``.

    Trainer finds the trainer Job by its ancestor label, not by name; the pods carry the
    runtime's name in ``jobset.sigs.k8s.io/replicatedjob-name``. Deleted afterwards.
    """
    upstream = await cluster.custom.get_cluster_custom_object(
        GROUP, VERSION, "clustertrainingruntimes", "torch-distributed"
    )
    (node,) = upstream["spec"]["template"]["spec"]["replicatedJobs"]
    runtime = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": upstream["metadata"].get("labels") or {}},
        "spec": {
            **upstream["spec"],
            "template": {"spec": {"replicatedJobs": [{**node, "name": "worker"}]}},
        },
    }
    await cluster.custom.create_cluster_custom_object(
        GROUP, VERSION, "clustertrainingruntimes", runtime
    )
    try:
        yield name
    finally:
        await cluster.custom.delete_cluster_custom_object(
            GROUP, VERSION, "clustertrainingruntimes", name
        )


async def test_a_runtime_naming_its_jobs_otherwise_is_followed_by_its_own_names(
    cluster: Cluster, admin_kubeconfig: Path, testbed: Testbed
) -> None:
    """Submitted through the backend, counted, listed and logged by the runtime's Job names.

    Rendered offline, the runtime patch names Trainer's ``node``; merged by name into a runtime
    without one, it adds a Job without containers, Trainer's JobSet is invalid and the TrainJob
    hangs without a condition (seen with the fit taken out). So the backend reads the runtime
    and names its Jobs.
    """
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
    from kubedl_prefect.spec import job_name, loads_spec

    stage = content.ANNOTATION_PREFIX
    runtime_name = f"workers-{cluster.namespace[-6:]}"
    spec = loads_spec(
        f"""
name: workers
image: registry.example/train:1.0
command: [python, train.py]
resources: {{cpu: 1, memory: 1Gi}}
annotations: {{"{stage}start-delay": "3s", "{stage}run-duration": "3s"}}
runtime: {{name: {runtime_name}}}
replicas:
  worker: 2
"""
    )
    name = job_name(spec.name, "workers", 1)
    lines: list[Any] = []
    written: dict[str, str] = {}

    async def write_logs() -> None:
        # The pods' names end with the Job controller's suffix: write each log as it appears.
        while True:
            for pod in await cluster.pods(name):
                labels = pod.metadata.labels
                if pod.metadata.name not in written:
                    replica = (
                        f"{labels['jobset.sigs.k8s.io/replicatedjob-name']}-"
                        f"{labels['batch.kubernetes.io/job-completion-index']}"
                    )
                    log = await asyncio.to_thread(
                        testbed.pod_log, cluster.namespace, pod.metadata.name, "node"
                    )
                    await asyncio.to_thread(log.write, f"hello from {replica}")
                    written[pod.metadata.name] = replica
            await asyncio.sleep(0.2)

    async with worker_named_runtime(cluster, runtime_name):
        backend = KubernetesBackend(
            namespace=cluster.namespace, dialect="trainer", kubeconfig=str(admin_kubeconfig)
        )
        writer = asyncio.create_task(write_logs())
        try:
            ref = await backend.submit(spec, key="workers", attempt=1)
            logs = asyncio.create_task(backend.follow_logs(ref, lines.append))
            outcome = await asyncio.wait_for(backend.wait_completed(ref), 120)
            await asyncio.wait_for(logs, 60)
            replicas = await backend.replicas(ref)
        finally:
            writer.cancel()
            await backend.close()
        job = await cluster.train_job(name)

    assert outcome.succeeded, outcome
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert [j["name"] for j in patch["replicatedJobs"]] == ["worker"]
    assert json.loads(job["metadata"]["annotations"]["kubedl-prefect.io/runtime-jobs"]) == {
        "worker": {"pods": 2, "trainer": True}
    }
    assert set(outcome.status.replicas) == {"worker"}
    assert outcome.status.replicas["worker"].succeeded == 1  # one Job of two pods
    assert sorted(f"{r.role}-{r.index}" for r in replicas) == ["worker-0", "worker-1"]
    assert sorted(written.values()) == ["worker-0", "worker-1"]
    assert sorted((line.replica, line.text) for line in lines) == [
        ("worker-0", "hello from worker-0"),
        ("worker-1", "hello from worker-1"),
    ]


# -- coscheduling (scheduler-plugins' PodGroup) ----------------------------------------------


@pytest.mark.exclusive  # restarts Trainer, so that it watches the PodGroup CRD it installs
async def test_a_coscheduling_runtime_gets_a_scheduler_plugins_pod_group_that_cancel_removes(
    cluster: Cluster, admin_kubeconfig: Path, testbed: Testbed
) -> None:
    """Trainer's coscheduling plugin makes a ``scheduling.x-k8s.io`` PodGroup; cancel leaves none.

    The test bed runs no coscheduling scheduler plugin: the PodGroup admits nothing, the pods go
    to the default scheduler. What is real is Trainer's side (the PodGroup it writes, the pod
    label) and our cancellation. The CRD is installed here (it stays; harmless to others) and
    Trainer restarted, as its plugin watches PodGroups only when the CRD exists at its start.
    """
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
    from kubedl_prefect.spec import job_name, loads_spec
    from kubedl_prefect.testbed import cluster as testbed_cluster

    crd = trainer.coscheduling_podgroup_crd()
    await asyncio.to_thread(testbed_cluster.call, testbed.layout, testbed_cluster.apply_crds, [crd])
    testbed.stop("trainer-controller")
    testbed.start("trainer-controller")
    upstream = await cluster.custom.get_cluster_custom_object(
        GROUP, VERSION, "clustertrainingruntimes", "torch-distributed"
    )
    runtime_name = f"cosched-{cluster.namespace[-6:]}"
    await cluster.custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "clustertrainingruntimes",
        trainer.coscheduling_runtime(upstream, runtime_name),
    )
    spec = loads_spec(
        f"""
name: cosched
image: registry.example/train:1.0
command: [python, train.py]
resources: {{cpu: 1, memory: 1Gi}}
annotations: {{"{content.RUN_DURATION}": "600s"}}
runtime: {{name: {runtime_name}}}
replicas:
  worker: 2
"""
    )
    name = job_name(spec.name, "cosched", 1)

    async def pod_group() -> Obj:
        found: Obj = await cluster.custom.get_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", cluster.namespace, "podgroups", name
        )
        return found

    backend = KubernetesBackend(
        namespace=cluster.namespace, dialect="trainer", kubeconfig=str(admin_kubeconfig)
    )
    try:
        ref = await backend.submit(spec, key="cosched", attempt=1)
        group = await eventually("the coscheduling PodGroup", pod_group, lambda g: True, 60)
        assert group["spec"]["minMember"] == 2
        assert group["spec"]["scheduleTimeoutSeconds"] == 60
        assert group["metadata"]["ownerReferences"][0]["uid"] == ref.uid
        pods = await eventually(
            "both pods", lambda: cluster.pods(name), lambda found: len(found) == 2, 60
        )
        assert {p.metadata.labels["scheduling.x-k8s.io/pod-group"] for p in pods} == {name}
        await backend.cancel(ref)
    finally:
        await backend.close()
        await cluster.custom.delete_cluster_custom_object(
            GROUP, VERSION, "clustertrainingruntimes", runtime_name
        )
    with pytest.raises(ApiException) as job_gone:
        await cluster.train_job(name)
    assert job_gone.value.status == 404

    async def left() -> list[str]:
        """What is left of the job: its pods, its JobSet, its coscheduling PodGroup."""
        found = [f"Pod/{p.metadata.name}" for p in await cluster.pods(name)]
        for group, version, plural in (
            ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
            ("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
        ):
            try:
                await cluster.get(group, version, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            else:
                found.append(f"{plural}/{name}")
        return found

    # The garbage collector finishes what the foreground delete started: a pod the Job
    # controller made while its Job was going may outlive cancel() by a moment.
    await eventually("nothing left of the job", left, lambda found: not found, 60)


async def test_a_gang_the_runtime_does_not_do_is_refused_at_submission(
    cluster: Cluster, admin_kubeconfig: Path
) -> None:
    """A Volcano queue asked of a coscheduling runtime: refused with the reason, nothing sent."""
    from kubedl_prefect.errors import SpecError
    from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
    from kubedl_prefect.spec import job_name, loads_spec

    upstream = await cluster.custom.get_cluster_custom_object(
        GROUP, VERSION, "clustertrainingruntimes", "torch-distributed"
    )
    runtime_name = f"cosched-q-{cluster.namespace[-6:]}"
    await cluster.custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "clustertrainingruntimes",
        trainer.coscheduling_runtime(upstream, runtime_name),
    )
    spec = loads_spec(
        f"""
name: queued
image: registry.example/train:1.0
command: [python, train.py]
runtime: {{name: {runtime_name}}}
gang: {{queue: research}}
replicas:
  worker: 2
"""
    )
    backend = KubernetesBackend(
        namespace=cluster.namespace, dialect="trainer", kubeconfig=str(admin_kubeconfig)
    )
    try:
        with pytest.raises(SpecError) as refused:
            await backend.submit(spec, key="queued", attempt=1)
    finally:
        await backend.close()
        await cluster.custom.delete_cluster_custom_object(
            GROUP, VERSION, "clustertrainingruntimes", runtime_name
        )
    (issue,) = refused.value.issues
    assert issue.path == "gang.queue"
    assert "coscheduling, which has no queue" in issue.problem
    with pytest.raises(ApiException) as absent:
        await cluster.train_job(job_name(spec.name, "queued", 1))
    assert absent.value.status == 404
