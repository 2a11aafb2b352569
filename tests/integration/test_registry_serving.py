"""From a training job's model to a served version and back: MLflow and the test bed, both real.

A real tracking server (``mlflow_server``: SQLite store, loopback) holds the runs and the
registry; the test bed's real KServe controller (v0.20, Standard mode) serves the
InferenceServices: it picks the runtime, runs the predictor's Deployment on kwok's nodes and
reports Ready, or ``NoSupportingRuntime`` for a format no runtime serves. The training
code of each job runs here as rank 0 would, with the environment the handoff put into the job's
manifest. The chain is composed as the Prefect surface will compose it: register, gate, resolve,
check, deploy with the alias restore as the rollback callback.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from kubedl_prefect.errors import (
    IncompatibleModelError,
    InferenceServiceNotReadyError,
    ModelSourceRefusedError,
)
from kubedl_prefect.kube.credentials import KubeconfigFile
from kubedl_prefect.lifecycle.backend import JobOutcome, JobRef
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.registry import GatePolicy, ModelRegistry, RegisteredVersion
from kubedl_prefect.registry.compat import KSERVE_MLSERVER
from kubedl_prefect.serving import (
    InferenceServiceDeployer,
    InferenceServiceSpec,
    ModelLink,
    ServingOutcome,
)
from kubedl_prefect.spec import TrainingJobSpec, parse_spec
from kubedl_prefect.spec.handoff import RUN_ID_ENV, TRACKING_URI_ENV, with_handoff
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.test_serving_rollout import UNSUPPORTED, serving_rules, short_namespace
from tests.support.mlflow_server import MlflowServer
from tests.support.training import train_and_log

pytestmark = pytest.mark.integration


POLICY = GatePolicy("accuracy", min_improvement=0.01)


@pytest.fixture
def namespace(testbed: Testbed) -> Iterator[str]:
    yield from short_namespace(testbed)


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


@pytest.fixture
def registry(mlflow_server: MlflowServer) -> ModelRegistry:
    return ModelRegistry(mlflow_server.url, artifact_destination=mlflow_server.artifact_destination)


@pytest.fixture
def client(mlflow_server: MlflowServer) -> MlflowClient:
    return MlflowClient(mlflow_server.url)


class Chain:
    """One model's train, register, gate, resolve, check and deploy steps, as a flow runs them."""

    def __init__(
        self, registry: ModelRegistry, deployer: InferenceServiceDeployer, namespace: str
    ) -> None:
        self.registry = registry
        self.deployer = deployer
        self.namespace = namespace
        self.experiment = f"fraud-{uuid.uuid4().hex[:8]}"
        self.model = f"fraud-{uuid.uuid4().hex[:8]}"
        self.spec = parse_spec(
            {
                "name": "fraud",
                "framework": "pytorch",
                "image": "ghcr.io/example/fraud:1.0",
                "replicas": {"master": 1, "worker": 1},
            }
        )

    def train(self, key: str, accuracy: float, *, fmt: str = "pickle") -> RegisteredVersion:
        handoff = self.registry.start_run(self.spec, key=key, experiment=self.experiment)
        job_spec = with_handoff(self.spec, handoff)
        # What the job's pods get, read from the manifest the Kubernetes backend would submit.
        manifest = KubernetesBackend(namespace=self.namespace).manifest(job_spec, key=key)
        env = {
            e["name"]: e["value"]
            for e in manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
                "containers"
            ][0]["env"]
            if "value" in e
        }
        assert env[RUN_ID_ENV] == handoff.run_id
        assert env[TRACKING_URI_ENV] == self.registry.tracking_uri
        train_and_log(env, accuracy=accuracy, serialization_format=fmt)
        return self.registry.register(
            handoff, succeeded(job_spec, key, manifest), self.spec, model_name=self.model
        )

    async def promote_and_serve(
        self, version: RegisteredVersion, **service: Any
    ) -> ServingOutcome | None:
        # The candidate is resolved and checked first: a version that cannot be served is
        # refused before the alias moves or anything is applied.
        resolved = self.registry.resolve(version.model_uri)
        self.registry.check_compatible(resolved, KSERVE_MLSERVER)
        decision = self.registry.evaluate(self.model, version.version, POLICY)
        if not decision.promoted:
            return None
        spec = InferenceServiceSpec(
            name="fraud",
            storage_uri=resolved.storage_uri,
            runtime=KSERVE_MLSERVER.name,
            link=ModelLink(self.model, version.version, self.namespace),
            **service,
        )
        return await self.deployer.deploy(
            spec, timeout_s=60, on_rollback=lambda: self.registry.restore_alias(decision)
        )


def succeeded(spec: TrainingJobSpec, key: str, manifest: dict[str, Any]) -> JobOutcome:
    ref = JobRef(
        backend="kubernetes",
        cluster="https://127.0.0.1",
        dialect="kubedl",
        namespace=manifest["metadata"]["namespace"],
        name=manifest["metadata"]["name"],
        uid=f"uid-{key}",
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        key=key,
        attempt=1,
        spec_hash=manifest["metadata"]["annotations"]["kubedl-prefect.io/spec-hash"],
    )
    return JobOutcome(ref, JobStatus(phase=Phase.SUCCEEDED))


async def test_better_candidates_are_served_worse_ones_never_applied_bad_ones_rolled_back(
    registry: ModelRegistry,
    deployer: InferenceServiceDeployer,
    namespace: str,
    client: MlflowClient,
) -> None:
    chain = Chain(registry, deployer, namespace)

    # 1. The first model: no champion yet, it is promoted and served from its resolved location.
    first = chain.train("nightly-1", 0.80)
    served = await chain.promote_and_serve(first)
    assert served is not None
    live = await deployer.get("fraud")
    assert live is not None
    resolved_first = registry.resolve(first.model_uri)
    assert live["spec"]["predictor"]["model"]["storageUri"] == resolved_first.storage_uri
    assert resolved_first.storage_uri.endswith(f"/models/{first.model_id}/artifacts")
    assert live["metadata"]["labels"]["kubedl-prefect.io/model-version"] == first.version
    assert served.runtime == "kserve-mlserver"
    assert live["status"]["clusterServingRuntimeName"] == "kserve-mlserver"
    assert live["status"]["modelStatus"]["transitionStatus"] == "UpToDate"

    # 2. A better one replaces it.
    second = chain.train("nightly-2", 0.90)
    served = await chain.promote_and_serve(second)
    assert served is not None
    assert served.changed
    assert served.storage_uri == registry.resolve(second.model_uri).storage_uri
    generation = served.generation

    # 3. A worse one is not promoted and nothing is applied.
    third = chain.train("nightly-3", 0.85)
    assert await chain.promote_and_serve(third) is None
    live = await deployer.get("fraud")
    assert live is not None
    assert live["metadata"]["generation"] == generation
    assert client.get_model_version_by_alias(chain.model, "champion").version == second.version
    assert (
        client.get_model_version(chain.model, third.version).tags["kubedl-prefect.io/gate.decision"]
        == "rejected"
    )

    # 4. A better one that never becomes Ready (deployed with a format its runtime does not
    # serve): the previous spec and alias come back, with KServe's reason.
    fourth = chain.train("nightly-4", 0.95)
    with pytest.raises(InferenceServiceNotReadyError) as caught:
        await chain.promote_and_serve(fourth, **UNSUPPORTED)
    assert caught.value.rolled_back
    assert caught.value.reason == "NoSupportingRuntime"
    assert "the registry alias was restored" in caught.value.message
    assert client.get_model_version_by_alias(chain.model, "champion").version == second.version
    live = await deployer.get("fraud")
    assert live is not None
    assert live["spec"]["predictor"]["model"]["storageUri"] == served.storage_uri
    assert live["metadata"]["labels"]["kubedl-prefect.io/model-version"] == second.version


async def test_runs_sources_and_unloadable_formats_are_refused_before_anything_is_applied(
    registry: ModelRegistry,
    deployer: InferenceServiceDeployer,
    namespace: str,
    client: MlflowClient,
) -> None:
    chain = Chain(registry, deployer, namespace)
    skops = chain.train("nightly-1", 0.80, fmt="skops")
    with pytest.raises(IncompatibleModelError, match="skops"):
        await chain.promote_and_serve(skops)
    assert await deployer.get("fraud") is None
    assert not client.get_registered_model(chain.model).aliases

    legacy = f"{chain.model}-legacy"
    client.create_registered_model(legacy)
    version = client.create_model_version(
        legacy, f"runs:/{skops.run_id}/model", run_id=skops.run_id
    )
    with pytest.raises(ModelSourceRefusedError, match="runs:/"):
        registry.resolve(f"models:/{legacy}/{version.version}")
    assert await deployer.get("fraud") is None
