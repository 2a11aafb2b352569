"""The test bed itself, through its real API server: components, nodes, kwok stages, CRDs, RBAC,
the KServe controller, pod logs, and restarts of its components.

Pods and InferenceServices are driven by the test bed's kwok stages through annotations
(``testbed.kubedl-prefect.io/...``); the client is ``kubernetes_asyncio`` loaded from the
kubeconfig the fixtures hand out, as a user of the sandbox would. The restart tests come last:
they break every connection to the session's test bed for a few seconds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import content, kserve
from kubedl_prefect.testbed.nodeagent.component import AGENT
from kubedl_prefect.testbed.podlogs import PodLog
from kubedl_prefect.testbed.testbed import CONTROL_PLANE_AFTER_CRDS, Testbed
from tests.integration.test_serving_rollout import short_namespace

pytestmark = [
    pytest.mark.integration,
    # These tests bound every request with asyncio.timeout; one cancelled while its TLS handshake
    # is under way (seen on a loaded 2-core CI machine) leaves its socket to the garbage collector
    # (CPython asyncio), which reports it in whichever test runs then. Collected after each test.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
        "ignore:Exception ignored in. <function _SelectorTransport.__del__"
        ":pytest.PytestUnraisableExceptionWarning",
        "ignore:unclosed <socket.socket:ResourceWarning",
        "ignore:unclosed transport:ResourceWarning",
    ),
]

Obj = dict[str, Any]


@pytest.fixture(autouse=True)
def collect_cancelled_connections() -> Iterator[None]:
    """Collect sockets of cancelled requests while this module's filter holds (see above)."""
    yield
    gc.collect()


@asynccontextmanager
async def connect(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration, persist_config=False
    )
    async with client.ApiClient(configuration=configuration) as api:
        yield api


async def wait_for(
    list_call: Callable[..., Any],
    *args: Any,
    name: str,
    predicate: Callable[[Any], bool],
    timeout_s: float = 30.0,
) -> Any:
    """List, then watch from the list's resourceVersion, until the object satisfies predicate."""
    last: Any = None
    selector = f"metadata.name={name}"
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                listed = await list_call(*args, field_selector=selector)
                items = listed["items"] if isinstance(listed, dict) else listed.items
                for item in items:
                    last = item
                    if predicate(item):
                        return item
                version = (
                    listed["metadata"]["resourceVersion"]
                    if isinstance(listed, dict)
                    else listed.metadata.resource_version
                )
                async with watch.Watch() as stream:
                    async for event in stream.stream(
                        list_call,
                        *args,
                        field_selector=selector,
                        resource_version=version,
                        timeout_seconds=int(timeout_s) + 5,
                    ):
                        last = event["object"]
                        if event["type"] != "DELETED" and predicate(last):
                            return last
    except TimeoutError:
        pytest.fail(f"{name} did not reach the expected state in {timeout_s}s; last seen: {last}")


def pod_manifest(
    name: str,
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    restart_policy: str = "Never",
    gpus: int = 0,
    containers: tuple[str, ...] = ("main",),
) -> Obj:
    resources = {"resources": {"limits": {content.GPU_RESOURCE: str(gpus)}}} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [
                {"name": c, "image": f"registry.example/{c}:1", **resources} for c in containers
            ],
        },
    }


def phase_is(*phases: str) -> Callable[[Any], bool]:
    return lambda pod: pod.status.phase in phases


async def run_pod(
    kubeconfig: Path, namespace: str, manifest: Obj, until: Callable[[Any], bool]
) -> Any:
    async with connect(kubeconfig) as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(namespace, manifest)
        return await wait_for(
            core.list_namespaced_pod, namespace, name=manifest["metadata"]["name"], predicate=until
        )


# -- the test bed ------------------------------------------------------------------------------


def test_every_component_is_up_and_healthy(testbed: Testbed) -> None:
    state = testbed.status()
    assert state.up, state
    # The process node's agent runs only once a test started it (start_process_node), last.
    names = [c.name for c in state.components if c.name != AGENT.name]
    assert names[: 1 + len(CONTROL_PLANE_AFTER_CRDS)] == [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ]
    assert all(c.pid and c.running and c.healthy for c in state.components)
    assert names[-7:] == [
        "volcano-scheduler",
        "kubedl-operator",
        "training-operator",
        "kserve-controller",
        "jobset-controller",
        "trainer-controller",
        "kueue-controller",
    ]
    assert state.rss_bytes > 0


def test_up_again_is_quick_and_keeps_the_processes(testbed: Testbed) -> None:
    before = {c.name: c.pid for c in testbed.status().components}
    started = time.monotonic()
    kubeconfig = Testbed(testbed.name).up()
    assert time.monotonic() - started < 10
    assert kubeconfig == testbed.kubeconfig
    assert {c.name: c.pid for c in testbed.status().components} == before


def _listening_addresses(pid: int) -> set[str]:
    """Local ``ip:port`` of the TCP sockets ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                if table == "tcp":
                    ip = ".".join(str(int(address[i - 2 : i], 16)) for i in (8, 6, 4, 2))
                else:
                    ip = "v6:" + address
                found.add(f"{ip}:{int(port, 16)}")
    return found


def test_every_component_listens_on_loopback_only(testbed: Testbed) -> None:
    # Every process of the test bed, operators included (KubeDL's --metrics-addr, the Kubeflow
    # and KServe webhook servers bind every interface unless the build patches them).
    seen = {}
    for component in testbed.status().components:
        assert component.pid is not None, component
        seen[component.name] = _listening_addresses(component.pid)
    # Each one listens somewhere; the process node's agent (running once a process test started
    # it) only while a Service of its pods has a forwarder, and then on loopback too.
    assert all(addresses for name, addresses in seen.items() if name != AGENT.name), seen
    for name, addresses in seen.items():
        assert all(a.startswith("127.0.0.1:") for a in addresses), (name, addresses)
    ports = testbed.layout.ports
    assert f"127.0.0.1:{ports.apiserver}" in seen["kube-apiserver"]
    assert f"127.0.0.1:{ports.etcd_client}" in seen["kube-apiserver"]
    # KServe's webhook server: its host is patched in at build time.
    webhook = ports.offset(kserve.PORT_OFFSETS["kserve-webhook"])
    assert f"127.0.0.1:{webhook}" in seen["kserve-controller"]


async def test_nodes_offer_gpus_and_are_ready(admin_kubeconfig: Path, testbed: Testbed) -> None:
    async with connect(admin_kubeconfig) as api:
        nodes = await client.CoreV1Api(api).list_node(label_selector=f"{content.NODE_LABEL}=true")
    state = testbed.status()
    assert len(nodes.items) == state.nodes >= 1
    for node in nodes.items:
        assert node.status.allocatable[content.GPU_RESOURCE] == str(state.gpus_per_node)
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready
        assert ready[0].status == "True"
        assert not node.spec.taints


async def test_admin_kubeconfig_talks_tls_to_loopback(admin_kubeconfig: Path) -> None:
    async with connect(admin_kubeconfig) as api:
        assert api.configuration.host.startswith("https://127.0.0.1:")
        version = await client.VersionApi(api).get_code()
        review = await client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
    assert version.git_version == "v1.34.4"
    assert "system:masters" in review.status.user_info.groups


# -- pods through the kwok stages --------------------------------------------------------------


async def test_pod_with_run_duration_ends_succeeded(admin_kubeconfig: Path, namespace: str) -> None:
    manifest = pod_manifest("ok", annotations={content.RUN_DURATION: "1s"}, gpus=1)
    pod = await run_pod(admin_kubeconfig, namespace, manifest, phase_is("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    assert pod.spec.node_name.startswith(content.NODE_PREFIX)
    assert pod.spec.containers[0].resources.limits == {content.GPU_RESOURCE: "1"}
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0
    assert terminated.reason == "Completed"


async def test_pod_without_annotations_runs_a_few_seconds_then_succeeds(
    admin_kubeconfig: Path, namespace: str
) -> None:
    async with connect(admin_kubeconfig) as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(namespace, pod_manifest("plain"))
        running = await wait_for(
            core.list_namespaced_pod, namespace, name="plain", predicate=phase_is("Running")
        )
        done = await wait_for(
            core.list_namespaced_pod,
            namespace,
            name="plain",
            predicate=phase_is("Succeeded", "Failed"),
        )
    assert done.status.phase == "Succeeded"
    started = running.status.container_statuses[0].state.running.started_at
    finished = done.status.container_statuses[0].state.terminated.finished_at
    assert 2 <= (finished - started).total_seconds() <= 10


async def test_pod_with_exit_code_ends_failed_with_that_code_and_reason(
    admin_kubeconfig: Path, namespace: str
) -> None:
    annotations = {
        content.RUN_DURATION: "1s",
        content.EXIT_CODE: "3",
        content.FAIL_REASON: "OOMKilled",
    }
    manifest = pod_manifest("crash", annotations=annotations)
    pod = await run_pod(admin_kubeconfig, namespace, manifest, phase_is("Succeeded", "Failed"))
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 3
    assert terminated.reason == "OOMKilled"


async def test_failing_container_under_on_failure_restarts_in_place(
    admin_kubeconfig: Path, namespace: str
) -> None:
    annotations = {content.RUN_DURATION: "1s", content.EXIT_CODE: "1"}
    manifest = pod_manifest("flaky", annotations=annotations, restart_policy="OnFailure")

    def restarted(pod: Any) -> bool:
        statuses = pod.status.container_statuses or []
        return bool(statuses) and statuses[0].restart_count >= 1

    pod = await run_pod(admin_kubeconfig, namespace, manifest, restarted)
    assert pod.status.phase == "Running"
    status = pod.status.container_statuses[0]
    assert status.last_state.terminated.exit_code == 1
    assert status.state.running is not None


async def test_pod_marked_for_eviction_is_evicted(admin_kubeconfig: Path, namespace: str) -> None:
    annotations = {content.RUN_DURATION: "1s", content.EVICT: "true"}
    manifest = pod_manifest("evictee", annotations=annotations)
    pod = await run_pod(admin_kubeconfig, namespace, manifest, phase_is("Succeeded", "Failed"))
    assert pod.status.phase == "Failed"
    assert pod.status.reason == "Evicted"
    disruption = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert disruption
    assert disruption[0].status == "True"


async def test_pod_asking_more_gpus_than_any_node_has_stays_pending(
    admin_kubeconfig: Path, namespace: str, testbed: Testbed
) -> None:
    too_many = testbed.status().gpus_per_node + 1
    manifest = pod_manifest("greedy", gpus=too_many)

    def unschedulable(pod: Any) -> bool:
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in pod.status.conditions or []
        )

    pod = await run_pod(admin_kubeconfig, namespace, manifest, unschedulable)
    condition = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert f"Insufficient {content.GPU_RESOURCE}" in condition.message
    await asyncio.sleep(2)
    async with connect(admin_kubeconfig) as api:
        later = await client.CoreV1Api(api).read_namespaced_pod("greedy", namespace)
    assert later.status.phase == "Pending"
    assert later.spec.node_name is None


# -- InferenceServices through the real KServe controller ---------------------------------------

ISVC = ("serving.kserve.io", "v1beta1", "inferenceservices")


def isvc_manifest(name: str, model_format: str = "mlflow") -> Obj:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": model_format},
                    "protocolVersion": "v2",
                    "storageUri": "s3://models/mnist/1",
                }
            }
        },
    }


def condition(obj: Obj, kind: str) -> str | None:
    for entry in obj.get("status", {}).get("conditions", []):
        if entry["type"] == kind:
            return str(entry["status"])
    return None


def test_the_kserve_controller_runs_supervised(testbed: Testbed) -> None:
    (entry,) = [c for c in testbed.status().components if c.name == "kserve-controller"]
    assert entry.running
    assert entry.healthy
    log = entry.log.read_text()
    assert "Starting workers" in log
    assert '"controller":"inferenceservice"' in log


@pytest.fixture
def isvc_namespace(testbed: Testbed) -> Iterator[str]:
    # KServe's predictor host name <name>-predictor-<namespace> must fit 63 characters.
    yield from short_namespace(testbed)


async def test_kserve_reconciles_an_inference_service_into_pods_kwok_runs(
    admin_kubeconfig: Path, isvc_namespace: str
) -> None:
    namespace = isvc_namespace
    group, version, plural = ISVC
    async with connect(admin_kubeconfig) as api:
        custom = client.CustomObjectsApi(api)
        await custom.create_namespaced_custom_object(
            group, version, namespace, plural, isvc_manifest("mnist")
        )
        ready = await wait_for(
            custom.list_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name="mnist",
            predicate=lambda o: condition(o, "Ready") == "True",
            timeout_s=90,
        )
        deployment = await client.AppsV1Api(api).read_namespaced_deployment(
            "mnist-predictor", namespace
        )
        pods = await client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector="serving.kserve.io/inferenceservice=mnist"
        )
    status = ready["status"]
    for kind in ("PredictorReady", "IngressReady"):
        assert condition(ready, kind) == "True"
    assert status["url"] == f"http://mnist-{namespace}.example.com"
    assert status["address"]["url"] == f"http://mnist-predictor.{namespace}.svc.cluster.local"
    assert status["clusterServingRuntimeName"] == "kserve-mlserver"
    assert status["deploymentMode"] == "Standard"
    assert status["modelStatus"]["states"]["activeModelState"] == "Loaded"
    assert deployment.status.available_replicas == 1
    (pod,) = pods.items
    assert pod.spec.node_name.startswith(content.NODE_PREFIX)
    assert pod.status.phase == "Running"
    assert pod.spec.containers[0].image == "docker.io/seldonio/mlserver:1.7.1"


async def test_a_format_no_runtime_supports_is_reported_as_kserve_reports_it(
    admin_kubeconfig: Path, isvc_namespace: str
) -> None:
    namespace = isvc_namespace
    group, version, plural = ISVC
    async with connect(admin_kubeconfig) as api:
        custom = client.CustomObjectsApi(api)
        await custom.create_namespaced_custom_object(
            group, version, namespace, plural, isvc_manifest("broken", "keras")
        )

        def failed(obj: Obj) -> bool:
            failure = obj.get("status", {}).get("modelStatus", {}).get("lastFailureInfo", {})
            return failure.get("reason") == "NoSupportingRuntime"

        await wait_for(
            custom.list_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name="broken",
            predicate=failed,
            timeout_s=60,
        )
        await asyncio.sleep(3)  # nothing else marks it Ready (no kwok stage for them)
        later = await custom.get_namespaced_custom_object(
            group, version, namespace, plural, "broken"
        )
        deployments = await client.AppsV1Api(api).list_namespaced_deployment(namespace)
    model = later["status"]["modelStatus"]
    assert model["transitionStatus"] == "InvalidSpec"
    assert model["states"]["targetModelState"] == "FailedToLoad"
    assert condition(later, "Ready") == "Unknown"
    assert "url" not in later["status"]
    assert "clusterServingRuntimeName" not in later["status"]
    assert not deployments.items


# -- CRD schemas and RBAC ----------------------------------------------------------------------

INVALID_OBJECTS = [
    pytest.param(
        ("training.kubedl.io", "v1alpha1", "pytorchjobs"),
        {
            "apiVersion": "training.kubedl.io/v1alpha1",
            "kind": "PyTorchJob",
            "metadata": {"name": "bad"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": "one", "template": {}}}},
        },
        "replicas",
        id="kubedl-pytorchjob",
    ),
    pytest.param(
        ("kubeflow.org", "v1", "pytorchjobs"),
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "bad"},
            "spec": {"runPolicy": {"backoffLimit": 1}},
        },
        "pytorchReplicaSpecs",
        id="kubeflow-pytorchjob-missing-required",
    ),
    pytest.param(
        ("scheduling.volcano.sh", "v1beta1", "podgroups"),
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "bad"},
            "spec": {"minMember": "all"},
        },
        "minMember",
        id="volcano-podgroup",
    ),
    pytest.param(
        ISVC,
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": "bad"},
            "spec": {"predictor": {"minReplicas": "lots"}},
        },
        "minReplicas",
        id="kserve-inferenceservice",
    ),
]


@pytest.mark.parametrize(("resource", "manifest", "field"), INVALID_OBJECTS)
async def test_object_violating_its_crd_schema_is_rejected_with_422(
    admin_kubeconfig: Path,
    namespace: str,
    resource: tuple[str, str, str],
    manifest: Obj,
    field: str,
) -> None:
    group, version, plural = resource
    async with connect(admin_kubeconfig) as api:
        custom = client.CustomObjectsApi(api)
        with pytest.raises(ApiException) as caught:
            await custom.create_namespaced_custom_object(
                group, version, namespace, plural, manifest
            )
    body = caught.value.body
    text = body.decode() if isinstance(body, bytes) else str(body)
    if plural == "inferenceservices":
        # KServe's defaulter (registered, as on a cluster) decodes the object before the
        # schema is checked, and refuses it first.
        assert caught.value.status == 400
        assert "inferenceservice.kserve-webhook-server.defaulter" in text
    else:
        assert caught.value.status == 422
    assert field in text


async def test_service_account_kubeconfig_is_limited_to_its_role(
    namespace: str,
    service_account_kubeconfig: Callable[..., Path],
    admin_kubeconfig: Path,
) -> None:
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    kubeconfig = service_account_kubeconfig(namespace, rules, "reader")
    async with connect(kubeconfig) as api:
        core = client.CoreV1Api(api)
        listed = await core.list_namespaced_pod(namespace)
        assert listed.items == []
        with pytest.raises(ApiException) as create:
            await core.create_namespaced_pod(namespace, pod_manifest("nope"))
        with pytest.raises(ApiException) as elsewhere:
            await core.list_namespaced_pod("default")
        review = await client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
    assert create.value.status == 403
    assert elsewhere.value.status == 403
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:reader"


# -- pods that cannot start, eviction on one attempt -------------------------------------------


def waiting(pod: Any) -> bool:
    statuses = pod.status.container_statuses or []
    return bool(statuses) and all(s.state.waiting is not None for s in statuses)


async def test_pod_with_waiting_reason_is_scheduled_but_never_runs(
    admin_kubeconfig: Path, namespace: str
) -> None:
    message = 'Failed to pull image "registry.example/main:1": not found'
    annotations = {
        content.WAITING_REASON: "ErrImagePull",
        content.WAITING_MESSAGE: message,
        content.RUN_DURATION: "1s",  # would have ended it by now, had it run
    }
    manifest = pod_manifest("unpullable", annotations=annotations, containers=("main", "side"))
    pod = await run_pod(admin_kubeconfig, namespace, manifest, waiting)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name.startswith(content.NODE_PREFIX)
    assert pod.status.pod_ip
    for status in pod.status.container_statuses:
        assert status.state.waiting.reason == "ErrImagePull"
        assert status.state.waiting.message == message
        assert not status.ready
        assert status.state.running is None
        assert status.state.terminated is None
    ready = next(c for c in pod.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ContainersNotReady")
    await asyncio.sleep(4)  # longer than run-duration and the default 3s
    async with connect(admin_kubeconfig) as api:
        core = client.CoreV1Api(api)
        later = await core.read_namespaced_pod("unpullable", namespace)
        events = await core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=unpullable"
        )
    assert later.status.phase == "Pending"
    assert [s.state.waiting.reason for s in later.status.container_statuses] == ["ErrImagePull"] * 2
    assert later.status.container_statuses[0].restart_count == 0
    assert any(e.type == "Warning" and e.reason == "Failed" for e in events.items)


async def test_waiting_reason_without_message_gets_one(
    admin_kubeconfig: Path, namespace: str
) -> None:
    annotations = {content.WAITING_REASON: "CreateContainerConfigError"}
    pod = await run_pod(
        admin_kubeconfig, namespace, pod_manifest("misconfigured", annotations=annotations), waiting
    )
    state = pod.status.container_statuses[0].state.waiting
    assert state.reason == "CreateContainerConfigError"
    assert "CreateContainerConfigError" in state.message


async def test_evict_on_attempt_evicts_only_the_pods_of_that_attempt(
    admin_kubeconfig: Path, namespace: str
) -> None:
    attempt = content.ATTEMPT_LABEL
    common = {content.EVICT_ON_ATTEMPT: "1", content.RUN_DURATION: "1s"}
    pods = {
        "first": pod_manifest("first", annotations=common, labels={attempt: "1"}),
        "second": pod_manifest("second", annotations=common, labels={attempt: "2"}),
        "unlabelled": pod_manifest("unlabelled", annotations=common),
        "second-crash": pod_manifest(
            "second-crash", annotations={**common, content.EXIT_CODE: "3"}, labels={attempt: "2"}
        ),
    }
    done = await asyncio.gather(
        *(
            run_pod(admin_kubeconfig, namespace, m, phase_is("Succeeded", "Failed"))
            for m in pods.values()
        )
    )
    outcome = {p.metadata.name: p for p in done}
    first = outcome["first"]
    assert (first.status.phase, first.status.reason) == ("Failed", "Evicted")
    assert any(c.type == "DisruptionTarget" for c in first.status.conditions)
    for name in ("second", "unlabelled"):
        pod = outcome[name]
        assert (pod.status.phase, pod.status.reason) == ("Succeeded", None), name
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    crash = outcome["second-crash"]
    assert (crash.status.phase, crash.status.reason) == ("Failed", None)
    assert crash.status.container_statuses[0].state.terminated.exit_code == 3
    assert not any(c.type == "DisruptionTarget" for c in crash.status.conditions)


# -- container logs through the API server (served by kwok) ------------------------------------


async def open_log(api: client.ApiClient, namespace: str, pod: str, **query: str) -> Any:
    """``GET .../pods/<pod>/log?<query>`` as a raw aiohttp response (a stream when following)."""
    response = await api.call_api(
        "/api/v1/namespaces/{namespace}/pods/{name}/log",
        "GET",
        path_params={"namespace": namespace, "name": pod},
        query_params=list(query.items()),
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    assert response.status == 200, await response.text()
    return response


async def follow_again(
    api: client.ApiClient, namespace: str, pod: str, *, lines: int, within_s: float = 60.0
) -> list[str]:
    """Follow a pod's log anew and return its first ``lines`` lines, retrying as a follower does.

    Right after kwok restarts, the API server's proxy to it can fail or stall until kwok serves
    its nodes again; each try is bounded, so a stall is retried instead of hanging the test.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            async with asyncio.timeout(15):
                stream = await open_log(api, namespace, pod, container="main", follow="true")
                try:
                    return [await next_line(stream) for _ in range(lines)]
                finally:
                    stream.close()
        except (TimeoutError, aiohttp.ClientError, client.ApiException, AssertionError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def next_line(response: Any, timeout_s: float = 10.0) -> str:
    async with asyncio.timeout(timeout_s):
        line: bytes = await response.content.readline()
    return line.decode()


async def running_pod(kubeconfig: Path, namespace: str, name: str) -> Any:
    annotations = {content.RUN_DURATION: "300s"}
    return await run_pod(
        kubeconfig, namespace, pod_manifest(name, annotations=annotations), phase_is("Running")
    )


async def test_pod_log_is_read_and_followed_through_the_api_server(
    admin_kubeconfig: Path, namespace: str, testbed: Testbed
) -> None:
    log = testbed.pod_log(namespace, "talker", "main")  # before the pod exists
    log.write("hello from talker", "second line")
    await running_pod(admin_kubeconfig, namespace, "talker")
    async with connect(admin_kubeconfig) as api:
        whole = await open_log(api, namespace, "talker", container="main")
        assert await whole.text() == "hello from talker\nsecond line\n"
        stream = await open_log(
            api, namespace, "talker", container="main", follow="true", timestamps="true"
        )
        try:
            stamp, _, text = (await next_line(stream)).partition(" ")
            assert text == "hello from talker\n"
            written = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            assert abs(dt.datetime.now(dt.UTC) - written) < dt.timedelta(minutes=1)
            assert (await next_line(stream)).endswith(" second line\n")
            log.write("appended later", stream="stderr")
            assert (await next_line(stream)).endswith(" appended later\n")
        finally:
            stream.close()
    assert testbed.pod_log(namespace, "talker", "main") == log  # the same log, lines kept
    assert "appended later" in log.text()


async def test_pod_log_since_time_leaves_out_older_lines(
    admin_kubeconfig: Path, namespace: str, testbed: Testbed
) -> None:
    log = testbed.pod_log(namespace, "chronicle", "main")
    now = dt.datetime.now(dt.UTC)
    log.write("an hour ago", at=now - dt.timedelta(hours=1))
    log.write("a minute ago", at=now - dt.timedelta(minutes=1))
    log.write("just now")
    await running_pod(admin_kubeconfig, namespace, "chronicle")
    since = (now - dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    async with connect(admin_kubeconfig) as api:
        recent = await open_log(api, namespace, "chronicle", container="main", sinceTime=since)
        assert await recent.text() == "a minute ago\njust now\n"
        last = await open_log(api, namespace, "chronicle", container="main", tailLines="1")
        assert await last.text() == "just now\n"


async def test_containers_without_a_log_print_nothing(
    admin_kubeconfig: Path, namespace: str, pod_log: Callable[..., PodLog]
) -> None:
    pod_log(namespace, "pair").write("only main speaks")
    manifest = pod_manifest("pair", annotations={content.RUN_DURATION: "300s"})
    manifest["spec"]["containers"].append({"name": "sidecar", "image": "registry.example/s:1"})
    await run_pod(admin_kubeconfig, namespace, manifest, phase_is("Running"))
    await running_pod(admin_kubeconfig, namespace, "silent")
    async with connect(admin_kubeconfig) as api:
        main = await open_log(api, namespace, "pair", container="main")
        sidecar = await open_log(api, namespace, "pair", container="sidecar")
        silent = await open_log(api, namespace, "silent", container="main")
        assert await main.text() == "only main speaks\n"
        assert await sidecar.text() == ""
        assert await silent.text() == ""


# -- restarts (last: they break every connection to the test bed for a while) ------------------


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.exclusive  # stops or restarts a shared component
async def test_restarting_kwok_breaks_followed_logs_which_can_be_followed_again(
    admin_kubeconfig: Path, namespace: str, testbed: Testbed
) -> None:
    log = testbed.pod_log(namespace, "resilient", "main")
    log.write("before the restart")
    await running_pod(admin_kubeconfig, namespace, "resilient")
    async with connect(admin_kubeconfig) as api:
        stream = await open_log(api, namespace, "resilient", container="main", follow="true")
        try:
            assert await next_line(stream) == "before the restart\n"
            downtime = await asyncio.to_thread(testbed.restart, "kwok")
            broken = False
            try:
                async with asyncio.timeout(20):
                    broken = await stream.content.readline() == b""  # end of stream
            except aiohttp.ClientPayloadError:
                broken = True
            assert broken
        finally:
            stream.close()
        log.write("after the restart")
        assert await follow_again(api, namespace, "resilient", lines=2) == [
            "before the restart\n",
            "after the restart\n",
        ]
        # kwok took its nodes over at once: a new pod runs without waiting for old leases.
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(
            namespace, pod_manifest("next", annotations={content.RUN_DURATION: "1s"})
        )
        done = await wait_for(
            core.list_namespaced_pod,
            namespace,
            name="next",
            predicate=phase_is("Succeeded", "Failed"),
            timeout_s=20,
        )
    assert done.status.phase == "Succeeded"
    assert 0 < downtime < 30
    assert testbed.status().up


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.exclusive  # stops or restarts a shared component
async def test_restarting_the_api_server_keeps_objects_and_old_watches_resume_or_get_410(
    admin_kubeconfig: Path, namespace: str, testbed: Testbed
) -> None:
    async with connect(admin_kubeconfig) as api:
        core = client.CoreV1Api(api)
        body: Any = {"metadata": {"name": "survivor"}, "data": {"state": "before"}}
        await core.create_namespaced_config_map(namespace, body)
        listed = await core.list_namespaced_config_map(namespace)
        old_version = listed.metadata.resource_version
    before = {c.name: c.pid for c in testbed.status().components}
    downtime = await asyncio.to_thread(testbed.restart, "kube-apiserver")
    assert 0 < downtime < 60
    state = testbed.status()
    assert state.up
    after = {c.name: c.pid for c in state.components}
    assert after.keys() == before.keys()
    # The API server crashed; what talks to it was restarted too (see Testbed.restart).
    assert all(after[name] != before[name] for name in before), (before, after)
    async with connect(admin_kubeconfig) as api:
        core = client.CoreV1Api(api)
        kept = await core.read_namespaced_config_map("survivor", namespace)
        assert kept.data == {"state": "before"}
        await core.patch_namespaced_config_map("survivor", namespace, {"data": {"state": "after"}})
        seen: list[str] = []
        refused: int | None = None
        try:
            async with asyncio.timeout(30), watch.Watch() as stream:
                async for event in stream.stream(
                    core.list_namespaced_config_map,
                    namespace,
                    field_selector="metadata.name=survivor",
                    resource_version=old_version,
                    timeout_seconds=20,
                ):
                    seen.append(event["object"].data.get("state", ""))
                    if seen[-1] == "after":
                        break
        except ApiException as exc:
            refused = exc.status
        assert refused == 410 or (refused is None and seen[-1:] == ["after"]), (refused, seen)
        # The rest of the test bed works at once: a pod is scheduled and run by kwok.
        await core.create_namespaced_pod(
            namespace, pod_manifest("afterwards", annotations={content.RUN_DURATION: "1s"})
        )
        done = await wait_for(
            core.list_namespaced_pod,
            namespace,
            name="afterwards",
            predicate=phase_is("Succeeded", "Failed"),
            timeout_s=20,
        )
    assert done.status.phase == "Succeeded"


# -- the operators' supervisor (these crash and stop shared operators: they come last) ---------


def _operator(testbed: Testbed, name: str) -> Any:
    return next(c for c in testbed.status().components if c.name == name)


def _wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s}s"
        time.sleep(0.2)


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.exclusive  # stops or restarts a shared component
def test_a_crashed_operator_is_restarted_and_its_crash_shown(testbed: Testbed) -> None:
    before = _operator(testbed, "kubedl-operator")
    assert before.running
    assert before.pid is not None
    os.kill(before.pid, signal.SIGKILL)  # a crash (the supervisor, not we, starts it again)

    def restarted() -> bool:
        now = _operator(testbed, "kubedl-operator")
        return bool(now.running and now.healthy and now.pid != before.pid)

    _wait_until(restarted, 30, "restarted")
    after = _operator(testbed, "kubedl-operator")
    assert after.restarts == before.restarts + 1
    assert after.last_crash is not None
    assert after.last_crash.at >= time.time() - 60


@pytest.mark.long  # a restart or preemption scenario, 30-40 s: long phase (default-phase budget)
@pytest.mark.exclusive  # stops or restarts a shared component
def test_a_stopped_operator_stays_stopped_until_started(testbed: Testbed) -> None:
    before = _operator(testbed, "training-operator")
    assert before.running
    testbed.stop("training-operator")
    try:
        time.sleep(4)  # longer than the supervisor's first back-off
        held = _operator(testbed, "training-operator")
        assert not held.running
        assert held.held
        assert held.restarts == before.restarts
        assert not testbed.status().up
        # up() on a test bed whose operator is held keeps the rest as it is.
        others = {c.name: c.pid for c in testbed.status().components if c.running}
        Testbed(testbed.name).up()
        assert {c.name: c.pid for c in testbed.status().components if c.running} == others
    finally:
        testbed.start("training-operator")
    started = _operator(testbed, "training-operator")
    assert started.running
    assert started.healthy
    assert not started.held
    assert started.restarts == before.restarts
    with pytest.raises(TestbedError, match="cannot be stopped"):
        testbed.stop("kube-apiserver")
