"""The test bed's training operators, through the real API server: KubeDL and Kubeflow PyTorchJobs
gang-scheduled by the real Volcano scheduler, run by kwok.

Manifests are written by hand here (not by the spec renderer): these tests pin what the operators
themselves do. Pod behaviour comes from the kwok stages, driven by pod-template annotations.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch

pytestmark = pytest.mark.integration

STAGE = "testbed.kubedl-prefect.io"
GANG_JOB_LABEL = "kubedl.io/gang-job-name"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Operator:
    """How one operator spells a PyTorchJob."""

    name: str
    group: str
    version: str
    container: str = "pytorch"
    plural: str = "pytorchjobs"

    def pytorchjob(
        self,
        name: str,
        *,
        gpus: int = 1,
        workers: int = 2,
        worker_annotations: dict[str, str] | None = None,
        worker_restart: str = "OnFailure",
        backoff_limit: int = 3,
    ) -> Obj:
        def replica(count: int, restart: str, annotations: dict[str, str]) -> Obj:
            return {
                "replicas": count,
                "restartPolicy": restart,
                "template": {
                    "metadata": {"annotations": {f"{STAGE}/run-duration": "3s", **annotations}},
                    "spec": {
                        "containers": [
                            {
                                "name": self.container,
                                "image": "registry.example/mnist:1.0",
                                "command": ["python", "train.py"],
                                # Requests too: KubeDL sums requests (not limits) into the
                                # PodGroup's minResources.
                                "resources": {
                                    "requests": {"nvidia.com/gpu": gpus},
                                    "limits": {"nvidia.com/gpu": gpus},
                                },
                            }
                        ]
                    },
                },
            }

        replicas = {
            "Master": replica(1, "OnFailure", {}),
            "Worker": replica(workers, worker_restart, worker_annotations or {}),
        }
        run_policy: Obj = {"backoffLimit": backoff_limit, "cleanPodPolicy": "None"}
        spec: Obj = {"pytorchReplicaSpecs": replicas}
        if self.name == "kubedl":
            spec.update(run_policy)  # KubeDL inlines the run policy under spec
        else:
            spec["runPolicy"] = run_policy
        return {
            "apiVersion": f"{self.group}/{self.version}",
            "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": spec,
        }


KUBEDL = Operator("kubedl", "training.kubedl.io", "v1alpha1")
KUBEFLOW = Operator("kubeflow", "kubeflow.org", "v1")
OPERATORS = [pytest.param(KUBEDL, id="kubedl"), pytest.param(KUBEFLOW, id="kubeflow")]


class Cluster:
    """The few calls these tests make, with list-then-watch waits."""

    def __init__(self, api: client.ApiClient, configuration: client.Configuration, namespace: str):
        self.api = api
        self.configuration = configuration
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    async def create_job(self, operator: Operator, manifest: Obj) -> Obj:
        created: Obj = await self.custom.create_namespaced_custom_object(
            operator.group, operator.version, self.namespace, operator.plural, manifest
        )
        return created

    async def wait_job(
        self, operator: Operator, name: str, done: Callable[[Obj], bool], within: float
    ) -> Obj:
        return await self._wait(
            (operator.group, operator.version, self.namespace, operator.plural),
            f"metadata.name={name}",
            done,
            within,
        )

    async def wait_podgroup(self, name: str, done: Callable[[Obj], bool], within: float) -> Obj:
        return await self._wait(
            ("scheduling.volcano.sh", "v1beta1", self.namespace, "podgroups"),
            f"metadata.name={name}",
            done,
            within,
        )

    async def wait_event(
        self, kind: str, name: str, done: Callable[[Obj], bool], within: float
    ) -> Obj:
        """An ``events.k8s.io/v1`` Event about ``kind``/``name`` for which ``done`` holds."""

        def match(event: Obj) -> bool:
            regarding = event.get("regarding") or {}
            return regarding.get("kind") == kind and regarding.get("name") == name and done(event)

        return await self._wait(
            ("events.k8s.io", "v1", self.namespace, "events"),
            None,
            match,
            within,
        )

    async def _wait(
        self,
        args: tuple[str, ...],
        selector: str | None,
        done: Callable[[Obj], bool],
        within: float,
    ) -> Obj:
        last: Obj | None = None
        selection = {"field_selector": selector} if selector else {}
        deadline = time.monotonic() + within
        try:
            async with asyncio.timeout(within):
                listed = await self.custom.list_namespaced_custom_object(*args, **selection)
                for item in listed["items"]:
                    last = item
                    if done(item):
                        return item
                version = listed["metadata"]["resourceVersion"]
                while True:
                    remaining = max(1, int(deadline - time.monotonic()))
                    # A connection pool of its own per stream, closed with it: a stream left
                    # half-read must not go back to the pool the other calls use.
                    async with client.ApiClient(self.configuration) as watch_api:
                        watcher = client.CustomObjectsApi(watch_api)
                        stream = watch.Watch().stream(
                            watcher.list_namespaced_custom_object,
                            *args,
                            **selection,
                            resource_version=version,
                            timeout_seconds=remaining,
                            allow_watch_bookmarks=True,
                        )
                        async with stream:
                            async for event in stream:
                                if event["type"] == "ERROR":
                                    raise AssertionError(f"watch failed: {event['raw_object']}")
                                item = event["object"]
                                version = item["metadata"]["resourceVersion"]
                                if event["type"] in ("ADDED", "MODIFIED"):
                                    last = item
                                    if done(item):
                                        return item
        except TimeoutError:
            pass
        raise AssertionError(f"{args[-1]} {selector} not as expected after {within}s; last: {last}")

    async def pods(self, job: str, label: str) -> list[Any]:
        listed = await self.core.list_namespaced_pod(self.namespace, label_selector=label)
        return [p for p in listed.items if job in p.metadata.name]


@asynccontextmanager
async def connect(kubeconfig: Path, namespace: str) -> AsyncIterator[Cluster]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield Cluster(api, configuration, namespace)
    # Closing a session starts the TLS shutdown of its connections; let it finish before
    # asyncio.run() closes the loop, or their sockets are reported unclosed.
    await asyncio.sleep(0.25)


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def finished(obj: Obj) -> bool:
    return condition(obj, "Succeeded") is not None or condition(obj, "Failed") is not None


def pod_label(operator: Operator, job: str) -> str:
    if operator is KUBEDL:
        return f"group-name=training.kubedl.io,job-name={job}"
    return f"training.kubeflow.org/job-name={job}"


@pytest.mark.parametrize("operator", OPERATORS)
def test_gang_scheduled_pytorchjob_succeeds(
    operator: Operator, admin_kubeconfig: Path, namespace: str
) -> None:
    async def scenario() -> None:
        async with connect(admin_kubeconfig, namespace) as cluster:
            await cluster.create_job(operator, operator.pytorchjob("mnist"))
            # One gang for the whole job: Master + 2 Workers, with their GPUs as min resources.
            group = await cluster.wait_podgroup("mnist", lambda pg: "spec" in pg, within=30)
            assert group["spec"]["minMember"] == 3
            assert group["spec"]["minResources"]["nvidia.com/gpu"] == "3"
            if operator is KUBEDL:
                assert group["metadata"]["labels"][GANG_JOB_LABEL] == "mnist"
            job = await cluster.wait_job(operator, "mnist", finished, within=90)
            assert condition(job, "Succeeded") is not None, job["status"]
            assert condition(job, "Running") is None  # conditions move on, Running goes False
            pods = await cluster.pods("mnist", pod_label(operator, "mnist"))
            assert sorted(p.metadata.name for p in pods) == [
                "mnist-master-0",
                "mnist-worker-0",
                "mnist-worker-1",
            ]
            for pod in pods:
                # Placed by Volcano (kube-scheduler ignores pods of another scheduler), in the gang.
                assert pod.spec.scheduler_name == "volcano"
                assert pod.spec.node_name, pod.metadata.name
                assert pod.metadata.annotations[GROUP_NAME_ANNOTATION] == "mnist"
            # The job succeeds with its Master (workers may still be finishing).
            assert job["status"]["replicaStatuses"]["Master"].get("succeeded") == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("operator", OPERATORS)
def test_failing_worker_fails_the_job_after_its_backoff_limit(
    operator: Operator, admin_kubeconfig: Path, namespace: str
) -> None:
    # Workers exit 1 after a second; under OnFailure they restart in place, and each restart
    # counts against the backoff limit. cleanPodPolicy stays None: KubeDL v0.5.0 never records
    # the failure when it also has to delete the pods (docs/operators.md).
    failing = {f"{STAGE}/run-duration": "1s", f"{STAGE}/exit-code": "1"}
    manifest = operator.pytorchjob("broken", worker_annotations=failing, backoff_limit=2)

    async def scenario() -> None:
        async with connect(admin_kubeconfig, namespace) as cluster:
            await cluster.create_job(operator, manifest)
            job = await cluster.wait_job(operator, "broken", finished, within=90)
            failed = condition(job, "Failed")
            assert failed is not None, job["status"]
            assert "backoff limit" in failed["message"]
            assert condition(job, "Succeeded") is None

    asyncio.run(scenario())


@pytest.mark.parametrize("operator", OPERATORS)
def test_job_asking_for_more_gpus_than_exist_stays_pending(
    operator: Operator, admin_kubeconfig: Path, namespace: str
) -> None:
    # 3 replicas x 8 GPUs = 24 GPUs; the test bed has 2 nodes x 8.
    manifest = operator.pytorchjob("too-big", gpus=8)

    def says_gpus_are_short(event: Obj) -> bool:
        return event.get("reason") == "Unschedulable" and "insufficient nvidia.com/gpu" in str(
            event.get("note")
        )

    async def scenario() -> None:
        async with connect(admin_kubeconfig, namespace) as cluster:
            await cluster.create_job(operator, manifest)
            group = await cluster.wait_podgroup("too-big", lambda pg: "spec" in pg, within=30)
            assert group["spec"]["minResources"]["nvidia.com/gpu"] == "24"
            # Volcano's enqueue step refuses the gang, and says why on the PodGroup.
            event = await cluster.wait_event("PodGroup", "too-big", says_gpus_are_short, 30)
            assert event["note"] == "queue resource quota insufficient: insufficient nvidia.com/gpu"
            # Scheduling sessions run every 500 ms: several later, nothing was admitted.
            await asyncio.sleep(3)
            group = await cluster.wait_podgroup("too-big", lambda pg: True, within=5)
            assert group["status"]["phase"] == "Pending"
            unschedulable = condition(group, "Unschedulable")
            if operator is KUBEDL:
                # KubeDL creates the pods at once: the gang plugin marks them not schedulable.
                assert unschedulable is not None
                assert unschedulable["reason"] == "NotEnoughResources"
            else:
                # Kubeflow creates no pod before the PodGroup is Inqueue: no tasks, no condition.
                assert unschedulable is None
            job = await cluster.wait_job(operator, "too-big", lambda j: True, within=5)
            assert condition(job, "Running") is None
            assert not finished(job)
            pods = await cluster.pods("too-big", pod_label(operator, "too-big"))
            assert len(pods) == (3 if operator is KUBEDL else 0)
            for pod in pods:
                assert not pod.spec.node_name, pod.metadata.name

    asyncio.run(scenario())
