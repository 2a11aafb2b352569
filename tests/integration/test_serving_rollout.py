"""Applying, awaiting and rolling back InferenceServices against the real test bed.

The API server validates every manifest against KServe's full InferenceService CRD, and the real
KServe controller (v0.20, Standard mode) reconciles it: it picks a serving runtime, makes the
predictor's Deployment, whose pods kwok runs on the simulated nodes, and reports Ready once that
Deployment is available. A model format no runtime supports is reported as KServe reports it
(``NoSupportingRuntime``); a predictor asking for more GPUs than any node has stays pending.
Every test runs as a ServiceAccount with deploy/rbac.yaml's rules plus the InferenceService rule
docs/serving.md gives.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import InferenceServiceNotReadyError, NotFoundError, ServingError
from kubedl_prefect.kube.credentials import KubeconfigFile, connect
from kubedl_prefect.kube.resources import (
    CONFIG_MAPS,
    INFERENCE_SERVICES,
    PODS,
    KubeObject,
    ResourceKind,
)
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.serving import (
    Canary,
    InferenceServiceDeployer,
    InferenceServiceEvent,
    InferenceServiceSpec,
    ModelLink,
    ServingResources,
    SyncInferenceServiceDeployer,
)
from kubedl_prefect.serving.deploy import FIELD_MANAGER
from kubedl_prefect.serving.record import (
    LEGACY_ANNOTATION_APPLIED,
    LEGACY_ANNOTATION_PREVIOUS,
    record_name,
)
from kubedl_prefect.testbed.testbed import Testbed
from tests.support.polling import until

pytestmark = pytest.mark.integration

DEPLOYMENTS = ResourceKind("apps", "v1", "Deployment", "deployments")

RBAC = Path(__file__).parents[2] / "deploy" / "rbac.yaml"
#: A model format no runtime of the test bed supports: KServe finds no runtime for it.
UNSUPPORTED: dict[str, Any] = {"model_format": "keras"}
#: A predictor no node can hold (each node has 8 GPUs): its pods stay Pending.
UNSCHEDULABLE: dict[str, Any] = {"resources": ServingResources(gpus=64)}
#: What KServe's defaulter (v0.20) leaves in a model that names no resources: not its
#: ConfigMap's default resources (``ModelSpec.Default`` does nothing; only the old
#: framework predictors get them), but the zero ``ResourceRequirements`` of its Go type, which
#: its answer (a JSON patch from the object it decoded and encoded again) writes as ``{}``.
KSERVE_NO_RESOURCES: dict[str, Any] = {}
SERVING_RULE = {
    "apiGroups": ["serving.kserve.io"],
    "resources": ["inferenceservices"],
    "verbs": ["get", "list", "watch", "create", "patch", "delete"],
}


def short_namespace(testbed: Testbed) -> Iterator[str]:
    """A fresh namespace with a short name, deleted (in the background) afterwards.

    KServe makes the predictor's host name ``<name>-predictor-<namespace>`` and refuses one
    longer than a DNS label (63); the shared fixture's names run up to 49 characters.
    """
    name = f"s-{uuid.uuid4().hex[:10]}"
    testbed.create_namespace(name, labels={"kubedl-prefect.io/test": "true"})
    yield name
    testbed.delete_namespace(name)


@pytest.fixture
def namespace(testbed: Testbed) -> Iterator[str]:
    yield from short_namespace(testbed)


def serving_rules() -> list[dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    role = next(d for d in documents if d["kind"] == "Role")
    return [*role["rules"], SERVING_RULE]


@pytest.fixture
def serving_kubeconfig(namespace: str, service_account_kubeconfig: Callable[..., Path]) -> Path:
    return service_account_kubeconfig(namespace, serving_rules(), "kubedl-prefect-serving")


@pytest.fixture
async def deployer(namespace: str, serving_kubeconfig: Path) -> AsyncIterator[Any]:
    made = InferenceServiceDeployer(
        namespace=namespace, credentials=KubeconfigFile(str(serving_kubeconfig))
    )
    yield made
    await made.close()


def service(version: str, **changes: Any) -> InferenceServiceSpec:
    settings: dict[str, Any] = {
        "name": "fraud",
        "storage_uri": f"s3://ml-artifacts/3/models/m-{version}/artifacts",
        "min_replicas": 1,
        "max_replicas": 2,
        "link": ModelLink("fraud", version, "ml", f"fraud-x7k2-a{version}", f"uid-{version}"),
    }
    settings.update(changes)
    return InferenceServiceSpec(**settings)


async def live(deployer: InferenceServiceDeployer, name: str = "fraud") -> KubeObject | None:
    return await deployer.get(name)


async def read_as_admin(
    admin_kubeconfig: Path, kind: ResourceKind, namespace: str, name: str
) -> KubeObject | None:
    async def read() -> KubeObject | None:
        async with await connect(KubeconfigFile(str(admin_kubeconfig))) as client:
            try:
                return await client.get(kind, namespace, name)
            except NotFoundError:
                return None

    return await KubeRuntime.get().run(read())


async def serving_record(admin_kubeconfig: Path, namespace: str) -> dict[str, Any]:
    """The data of the service's record (the ConfigMap the deployer writes beside it)."""
    found = await read_as_admin(admin_kubeconfig, CONFIG_MAPS, namespace, record_name("fraud"))
    assert found is not None
    return dict(found["data"])


async def test_a_new_service_is_applied_and_becomes_ready(
    deployer: InferenceServiceDeployer, admin_kubeconfig: Path, namespace: str
) -> None:
    seen: list[InferenceServiceEvent] = []
    outcome = await deployer.deploy(service("1"), timeout_s=60, on_event=seen.append)

    assert outcome.readiness.reason == "Ready"
    assert outcome.url == f"http://fraud-{namespace}.example.com"
    assert outcome.runtime == "kserve-mlserver"  # chosen by KServe: the spec names none
    assert outcome.readiness.runtime == "kserve-mlserver"
    assert outcome.changed
    assert outcome.storage_uri == "s3://ml-artifacts/3/models/m-1/artifacts"
    assert [e.event for e in seen] == [
        "kubedl.inference-service.applied",
        "kubedl.inference-service.ready",
    ]
    assert seen[0].uid == outcome.uid
    assert len({e.id for e in seen}) == 2
    obj = await live(deployer)
    assert obj is not None
    model = obj["spec"]["predictor"]["model"]
    assert model["storageUri"] == "s3://ml-artifacts/3/models/m-1/artifacts"
    assert model["modelFormat"] == {"name": "mlflow"}
    assert model["protocolVersion"] == "v2"
    metadata = obj["metadata"]
    assert metadata["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert metadata["labels"]["kubedl-prefect.io/model-version"] == "1"
    # What a rollback restores is in the record, not in the annotations KServe copies into
    # the predictor's pod template; nothing served before.
    assert LEGACY_ANNOTATION_APPLIED not in metadata["annotations"]
    assert LEGACY_ANNOTATION_PREVIOUS not in metadata["annotations"]
    record = await serving_record(admin_kubeconfig, namespace)
    assert (
        json.loads(record["applied"])["spec"]["predictor"]["model"]["storageUri"]
        == (model["storageUri"])
    )
    assert "previous" not in record
    managers = {entry["manager"] for entry in metadata["managedFields"]}
    assert FIELD_MANAGER in managers
    assert any(
        e["manager"] == FIELD_MANAGER and e["operation"] == "Apply"
        for e in metadata["managedFields"]
    )
    status = obj["status"]
    assert status["clusterServingRuntimeName"] == "kserve-mlserver"
    assert status["modelStatus"]["states"]["targetModelState"] == "Loaded"
    assert status["deploymentMode"] == "Standard"


async def test_the_controller_runs_the_predictor_as_a_deployment_on_the_kwok_nodes(
    deployer: InferenceServiceDeployer, admin_kubeconfig: Path, namespace: str
) -> None:
    await deployer.deploy(service("1"), timeout_s=60)

    async def read() -> tuple[KubeObject, list[KubeObject]]:
        async with await connect(KubeconfigFile(str(admin_kubeconfig))) as client:
            deployment = await client.get(DEPLOYMENTS, namespace, "fraud-predictor")
            pods = await client.list(
                PODS, namespace, label_selector="serving.kserve.io/inferenceservice=fraud"
            )
            return deployment, pods.items

    deployment, pods = await KubeRuntime.get().run(read())
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert container["image"] == "docker.io/seldonio/mlserver:1.7.1"  # kserve-mlserver's
    annotations = template["metadata"]["annotations"]
    source = "internal.serving.kserve.io/storage-initializer-sourceuri"
    assert annotations[source] == "s3://ml-artifacts/3/models/m-1/artifacts"
    # KServe's template has no storage initializer: its pod mutator (registered, as on a
    # cluster) injects it into each pod, with the source URI of that annotation.
    assert not template["spec"].get("initContainers")
    assert pods
    for pod in pods:
        (init,) = pod["spec"]["initContainers"]
        assert init["name"] == "storage-initializer"
        assert init["args"] == ["s3://ml-artifacts/3/models/m-1/artifacts", "/mnt/models"]
        mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert mounts["kserve-provision-location"] == "/mnt/models"
    assert {p["spec"]["nodeName"] for p in pods} <= {"kwok-node-0", "kwok-node-1"}
    assert all(p["metadata"]["labels"]["kubedl-prefect.io/model-version"] == "1" for p in pods)


async def test_deploying_the_same_spec_again_changes_nothing(
    deployer: InferenceServiceDeployer,
) -> None:
    first = await deployer.deploy(service("1"), timeout_s=60)
    again = await deployer.deploy(service("1"), timeout_s=10)
    assert not again.changed
    assert again.generation == first.generation
    assert again.uid == first.uid


async def test_a_canary_coming_and_going_leaves_the_stable_predictor_alone(
    deployer: InferenceServiceDeployer, admin_kubeconfig: Path, namespace: str
) -> None:
    # KServe makes the stable predictor's Deployment from the service's annotations and its
    # spec.predictor; a rollback record kept in the annotations changed its pod template when a
    # canary came or went, and its pods were replaced in the middle of the canary.
    await deployer.deploy(service("1"), timeout_s=60)
    stable = await read_as_admin(admin_kubeconfig, DEPLOYMENTS, namespace, "fraud-predictor")
    assert stable is not None

    with_canary = service(
        "1", canary=Canary("s3://ml-artifacts/3/models/m-2/artifacts", traffic_percent=20)
    )
    await deployer.deploy(with_canary, timeout_s=60)
    canary = await read_as_admin(admin_kubeconfig, DEPLOYMENTS, namespace, "fraud-canary-predictor")
    assert canary is not None  # KServe made the canary's own Deployment
    during = await read_as_admin(admin_kubeconfig, DEPLOYMENTS, namespace, "fraud-predictor")
    await deployer.deploy(service("1"), timeout_s=60)
    after = await read_as_admin(admin_kubeconfig, DEPLOYMENTS, namespace, "fraud-predictor")

    for seen in (during, after):
        assert seen is not None
        assert seen["metadata"]["uid"] == stable["metadata"]["uid"]
        assert seen["metadata"]["generation"] == stable["metadata"]["generation"]
        assert seen["spec"]["template"] == stable["spec"]["template"]
    record = await serving_record(admin_kubeconfig, namespace)
    applied = json.loads(record["applied"])
    assert not applied["spec"].get("canary")
    assert json.loads(record["previous"])["spec"]["canary"]


async def test_a_new_version_replaces_the_old_and_remembers_it(
    deployer: InferenceServiceDeployer, admin_kubeconfig: Path, namespace: str
) -> None:
    await deployer.deploy(service("1"), timeout_s=60)
    outcome = await deployer.deploy(service("2"), timeout_s=60)
    assert outcome.changed
    obj = await live(deployer)
    assert obj is not None
    assert obj["spec"]["predictor"]["model"]["storageUri"].endswith("/m-2/artifacts")
    previous = json.loads((await serving_record(admin_kubeconfig, namespace))["previous"])
    assert previous["spec"]["predictor"]["model"]["storageUri"].endswith("/m-1/artifacts")


async def test_a_version_no_runtime_supports_is_rolled_back_with_kserves_reason(
    deployer: InferenceServiceDeployer, admin_kubeconfig: Path, namespace: str
) -> None:
    await deployer.deploy(service("1"), timeout_s=60)
    restored: list[str] = []
    seen: list[InferenceServiceEvent] = []

    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(
            service("2", **UNSUPPORTED),
            timeout_s=60,
            on_event=seen.append,
            on_rollback=lambda: restored.append("alias"),
        )

    error = caught.value
    assert error.rolled_back
    assert not error.timed_out
    assert error.reason == "NoSupportingRuntime"
    assert "No runtime found to support specified framework/version" in error.message
    assert "the previous spec was restored and is Ready again" in error.message
    assert "no ServingRuntime supports" in (error.hint or "")
    assert restored == ["alias"]
    assert [e.event.rsplit(".", 1)[1] for e in seen] == ["applied", "not-ready", "rolled-back"]
    obj = await live(deployer)
    assert obj is not None
    model = obj["spec"]["predictor"]["model"]
    assert model["storageUri"].endswith("/m-1/artifacts")
    assert model["modelFormat"] == {"name": "mlflow"}
    annotations = obj["metadata"]["annotations"]
    assert annotations["kubedl-prefect.io/model-uri"] == "models:/fraud/1"
    record = await serving_record(admin_kubeconfig, namespace)
    assert "previous" not in record  # restored: nothing served before it
    # What we applied, but for what KServe's own defaulter (registered, as on a cluster)
    # writes into a model that names no resources (empty ones) and the container's empty name.
    spec = copy.deepcopy(obj["spec"])
    model = spec["predictor"]["model"]
    assert model.pop("resources") == KSERVE_NO_RESOURCES
    assert model.pop("name", "") == ""
    assert json.loads(record["applied"])["spec"] == spec
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert obj["status"]["clusterServingRuntimeName"] == "kserve-mlserver"


async def test_a_rollout_that_never_completes_times_out_and_rolls_back(
    deployer: InferenceServiceDeployer,
) -> None:
    # KServe keeps Ready True from the old pods while the new ones cannot be scheduled: the
    # rollout check sees that the current predictor has no Ready pod.
    await deployer.deploy(service("1"), timeout_s=60)
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(service("2", **UNSCHEDULABLE), timeout_s=15)
    assert caught.value.timed_out
    assert caught.value.rolled_back
    assert caught.value.reason == "RollingOut"
    assert "Unschedulable" in caught.value.message
    assert "old ones kept serving" in (caught.value.hint or "")
    assert "the previous spec was restored and is Ready again" in caught.value.message
    obj = await live(deployer)
    assert obj is not None
    assert obj["spec"]["predictor"]["model"]["storageUri"].endswith("/m-1/artifacts")
    # The restored spec names no resources (no GPUs): KServe's defaulter leaves them empty.
    assert obj["spec"]["predictor"]["model"]["resources"] == KSERVE_NO_RESOURCES


async def test_a_first_deployment_that_fails_leaves_nothing_behind(
    deployer: InferenceServiceDeployer, admin_kubeconfig: Path, namespace: str
) -> None:
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(service("1", **UNSUPPORTED), timeout_s=60)
    assert caught.value.rolled_back
    assert caught.value.reason == "NoSupportingRuntime"
    assert "the new service was deleted" in caught.value.message
    for _ in range(50):
        if await live(deployer) is None:
            break
        await asyncio.sleep(0.1)
    assert await live(deployer) is None

    async def record_gone() -> bool:  # the garbage collector deletes it with its owner
        name = record_name("fraud")
        return await read_as_admin(admin_kubeconfig, CONFIG_MAPS, namespace, name) is None

    await until("the record deleted with its service", record_gone, within_s=30, every_s=0.2)


async def test_a_service_that_is_not_ours_is_left_alone(
    deployer: InferenceServiceDeployer, admin_kubeconfig: Path, namespace: str
) -> None:
    manifest = deployer.manifest(service("1"))
    del manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"]

    async def create() -> None:
        async with await connect(KubeconfigFile(str(admin_kubeconfig))) as client:
            await client.create(INFERENCE_SERVICES, namespace, manifest)

    await KubeRuntime.get().run(create())
    with pytest.raises(ServingError, match="not managed by kubedl-prefect"):
        await deployer.deploy(service("2"), timeout_s=10)
    with pytest.raises(ServingError, match="not managed by kubedl-prefect"):
        await deployer.delete("fraud")
    obj = await live(deployer)
    assert obj is not None
    assert obj["spec"]["predictor"]["model"]["storageUri"].endswith("/m-1/artifacts")


def test_sync_code_deploys_through_the_same_implementation(
    namespace: str, serving_kubeconfig: Path
) -> None:
    deployer = SyncInferenceServiceDeployer(
        InferenceServiceDeployer(
            namespace=namespace, credentials=KubeconfigFile(str(serving_kubeconfig))
        )
    )
    try:
        outcome = deployer.deploy(service("1"), timeout_s=60)
        assert outcome.readiness.reason == "Ready"
        assert deployer.status("fraud").reason == "Ready"
        deployer.delete("fraud")
        deployer.delete("fraud")  # gone already: nothing to do
    finally:
        deployer.close()
