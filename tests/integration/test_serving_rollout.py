"""Applying, awaiting and rolling back InferenceServices against the real test bed.

The API server validates every manifest against KServe's full InferenceService CRD (the test bed
installs it). There is no KServe controller yet: the test bed's kwok stages report a service
Ready about a second after each change of its spec, or not ready (reason ``ModelLoadFailed``,
``RevisionFailed``) when it is annotated ``testbed.kubedl-prefect.io/never-ready``. Every test
runs as a ServiceAccount with deploy/rbac.yaml's rules plus the InferenceService rule
docs/serving.md gives.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import InferenceServiceNotReadyError, ServingError
from kubedl_prefect.kube.credentials import KubeconfigFile, connect
from kubedl_prefect.kube.resources import INFERENCE_SERVICES, KubeObject
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.serving import (
    InferenceServiceDeployer,
    InferenceServiceEvent,
    InferenceServiceSpec,
    ModelLink,
    SyncInferenceServiceDeployer,
)
from kubedl_prefect.serving.deploy import ANNOTATION_APPLIED, ANNOTATION_PREVIOUS, FIELD_MANAGER

pytestmark = pytest.mark.integration

RBAC = Path(__file__).parents[2] / "deploy" / "rbac.yaml"
NEVER_READY = {"testbed.kubedl-prefect.io/never-ready": "true"}
SERVING_RULE = {
    "apiGroups": ["serving.kserve.io"],
    "resources": ["inferenceservices"],
    "verbs": ["get", "list", "watch", "create", "patch", "delete"],
}


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
        "runtime": "kserve-mlserver",
        "min_replicas": 1,
        "max_replicas": 2,
        "link": ModelLink("fraud", version, "ml", f"fraud-x7k2-a{version}", f"uid-{version}"),
    }
    settings.update(changes)
    return InferenceServiceSpec(**settings)


async def live(deployer: InferenceServiceDeployer, name: str = "fraud") -> KubeObject | None:
    return await deployer.get(name)


async def test_a_new_service_is_applied_and_becomes_ready(
    deployer: InferenceServiceDeployer, namespace: str
) -> None:
    seen: list[InferenceServiceEvent] = []
    outcome = await deployer.deploy(service("1"), timeout_s=60, on_event=seen.append)

    assert outcome.readiness.reason == "Ready"
    assert outcome.url == f"http://fraud-{namespace}.example.com"
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
    assert ANNOTATION_PREVIOUS not in metadata["annotations"]
    managers = {entry["manager"] for entry in metadata["managedFields"]}
    assert FIELD_MANAGER in managers
    assert any(
        e["manager"] == FIELD_MANAGER and e["operation"] == "Apply"
        for e in metadata["managedFields"]
    )


async def test_deploying_the_same_spec_again_changes_nothing(
    deployer: InferenceServiceDeployer,
) -> None:
    first = await deployer.deploy(service("1"), timeout_s=60)
    again = await deployer.deploy(service("1"), timeout_s=10)
    assert not again.changed
    assert again.generation == first.generation
    assert again.uid == first.uid


async def test_a_new_version_replaces_the_old_and_remembers_it(
    deployer: InferenceServiceDeployer,
) -> None:
    await deployer.deploy(service("1"), timeout_s=60)
    outcome = await deployer.deploy(service("2"), timeout_s=60)
    assert outcome.changed
    obj = await live(deployer)
    assert obj is not None
    assert obj["spec"]["predictor"]["model"]["storageUri"].endswith("/m-2/artifacts")
    previous = json.loads(obj["metadata"]["annotations"][ANNOTATION_PREVIOUS])
    assert previous["spec"]["predictor"]["model"]["storageUri"].endswith("/m-1/artifacts")


async def test_a_version_that_never_becomes_ready_is_rolled_back_with_the_reason(
    deployer: InferenceServiceDeployer,
) -> None:
    await deployer.deploy(service("1"), timeout_s=60)
    restored: list[str] = []
    seen: list[InferenceServiceEvent] = []

    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(
            service("2", annotations=NEVER_READY),
            timeout_s=60,
            on_event=seen.append,
            on_rollback=lambda: restored.append("alias"),
        )

    error = caught.value
    assert error.rolled_back
    assert not error.timed_out
    assert error.reason == "ModelLoadFailed"
    assert "the previous spec was restored and is Ready again" in error.message
    assert "compatibility" in (error.hint or "")
    assert restored == ["alias"]
    assert [e.event.rsplit(".", 1)[1] for e in seen] == ["applied", "not-ready", "rolled-back"]
    obj = await live(deployer)
    assert obj is not None
    assert obj["spec"]["predictor"]["model"]["storageUri"].endswith("/m-1/artifacts")
    annotations = obj["metadata"]["annotations"]
    assert "testbed.kubedl-prefect.io/never-ready" not in annotations
    assert annotations["kubedl-prefect.io/model-uri"] == "models:/fraud/1"
    assert ANNOTATION_PREVIOUS not in annotations
    assert json.loads(annotations[ANNOTATION_APPLIED])["spec"] == obj["spec"]
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions["Ready"] == "True"


async def test_a_timeout_rolls_back_too(deployer: InferenceServiceDeployer) -> None:
    await deployer.deploy(service("1"), timeout_s=60)
    slow = service("2", annotations={"testbed.kubedl-prefect.io/ready-delay": "120s"})
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(slow, timeout_s=3)
    assert caught.value.timed_out
    assert caught.value.rolled_back
    assert caught.value.reason == "Reconciling"
    obj = await live(deployer)
    assert obj is not None
    assert obj["spec"]["predictor"]["model"]["storageUri"].endswith("/m-1/artifacts")


async def test_a_first_deployment_that_fails_leaves_nothing_behind(
    deployer: InferenceServiceDeployer,
) -> None:
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await deployer.deploy(service("1", annotations=NEVER_READY), timeout_s=60)
    assert caught.value.rolled_back
    assert "the new service was deleted" in caught.value.message
    for _ in range(50):
        if await live(deployer) is None:
            break
        await asyncio.sleep(0.1)
    assert await live(deployer) is None


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
