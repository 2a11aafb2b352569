"""The ``train-and-serve`` flow against real Prefect and MLflow servers and the test bed.

The session's Prefect test server and MLflow tracking server (tests/support: ``prefect_server``,
``mlflow_server``: SQLite, loopback); every test gets
a fresh namespace and runs as a ServiceAccount with deploy/rbac.yaml's rules plus the
InferenceService rule of docs/serving.md. The training pods run no code on the test bed (kwok):
the test plays rank 0 before the flow runs, logging the model into the logical job's MLflow run
(found again by the flow through its key) with the environment the handoff puts into the job.
Only Ready is asserted of a served InferenceService, never what made it so (the test bed's
KServe controller, or a kwok stage); the rollout that fails is one KServe refuses
(``NoSupportingRuntime``: a model format no runtime serves, as tests/integration/
test_serving_rollout.py uses). What the flow runs leave in Prefect (events, artifacts) is read
back through the Prefect API.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.client.schemas.objects import State
from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

from flows.train_and_serve import TrainAndServeResult, service_name, train_and_serve
from kubedl_prefect.kube.credentials import KubeconfigFile
from kubedl_prefect.prefect import KServeServing, KubernetesCluster, MlflowRegistry
from kubedl_prefect.registry import ModelRegistry
from kubedl_prefect.registry.lineage import (
    TAG_FLOW_RUN,
    TAG_JOB_NAME,
    TAG_JOB_UID,
    TAG_NAMESPACE,
    TAG_SPEC_HASH,
)
from kubedl_prefect.serving import InferenceServiceDeployer
from kubedl_prefect.spec import TrainingJobSpec, loads_spec, spec_to_data
from kubedl_prefect.spec.handoff import with_handoff
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.test_serving_rollout import UNSUPPORTED, serving_rules, short_namespace
from tests.support.mlflow_server import MlflowServer
from tests.support.training import job_environment, train_and_log

pytestmark = [
    pytest.mark.integration,
    # Prefect 3.9.1 leaks one HTTP connection per async flow run: results.py
    # _read_server_default_result_storage_block_id() never closes the sync client it makes.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
        "ignore:unclosed <socket.socket:ResourceWarning",
    ),
]


STAGE = "testbed.kubedl-prefect.io"


@pytest.fixture(autouse=True)
def collect_prefects_leaked_connections() -> Iterator[None]:
    """Collect the connections Prefect leaks (see ``pytestmark``) while this test's filter holds."""
    yield
    gc.collect()


@pytest.fixture
def namespace(testbed: Testbed) -> Iterator[str]:
    """A namespace with a short name: KServe's ``<service>-predictor-<namespace>`` is a label."""
    yield from short_namespace(testbed)


@pytest.fixture
def kubeconfig(namespace: str, service_account_kubeconfig: Callable[..., Path]) -> Path:
    """A ServiceAccount allowed what training and serving need, and nothing more."""
    return service_account_kubeconfig(namespace, serving_rules(), "kubedl-prefect-chain")


def job_spec() -> TrainingJobSpec:
    return loads_spec(
        f"""
name: fraud
framework: pytorch
image: registry.example/fraud:1.0
command: [python, train.py]
annotations: {{"{STAGE}/run-duration": "2s"}}
replicas:
  master: 1
  worker: 1
"""
    )


class Chain:
    """Blocks saved on the Prefect server, and rank 0's part of each training run."""

    def __init__(self, server: MlflowServer, kubeconfig: Path, namespace: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.model = f"fraud-{suffix}"
        self.experiment = f"fraud-{suffix}"
        self.spec = job_spec()
        self.cluster = f"chain-cluster-{suffix}"
        self.registry = f"chain-mlflow-{suffix}"
        self.blocks = [
            (KubernetesCluster(kubeconfig_path=str(kubeconfig), namespace=namespace), self.cluster),
            (
                MlflowRegistry(
                    tracking_uri=server.url, artifact_destination=server.artifact_destination
                ),
                self.registry,
            ),
        ]
        self.mlflow = ModelRegistry(server.url, artifact_destination=server.artifact_destination)
        self.client = MlflowClient(server.url)

    async def save_blocks(self) -> None:
        for block, name in self.blocks:
            await block.asave(name)

    def log_model(self, key: str, accuracy: float) -> str:
        """What the job's rank 0 does: log metrics and the model into the logical job's run."""
        handoff = self.mlflow.start_run(self.spec, key=key, experiment=self.experiment)
        train_and_log(job_environment(with_handoff(self.spec, handoff)), accuracy=accuracy)
        return handoff.run_id

    async def run(self, key: str) -> tuple[TrainAndServeResult, UUID]:
        state = await self.state(key)
        assert state.is_completed(), state.message
        result = await state.result()
        assert isinstance(result, TrainAndServeResult)
        flow_run_id = state.state_details.flow_run_id
        assert flow_run_id is not None
        return result, flow_run_id

    async def state(self, key: str, **parameters: Any) -> State[Any]:
        return await asyncio.to_thread(
            train_and_serve,
            spec=spec_to_data(self.spec),
            cluster=self.cluster,
            key=key,
            model_name=self.model,
            registry=self.registry,
            experiment=self.experiment,
            metric="accuracy",
            min_improvement=0.01,
            serve="kserve",
            return_state=True,
            **parameters,
        )

    async def live(self) -> dict[str, Any] | None:
        deployer = InferenceServiceDeployer(
            namespace=self.namespace, credentials=KubeconfigFile(str(self.kubeconfig))
        )
        try:
            return await deployer.get(service_name(self.model))
        finally:
            await deployer.close()


@pytest.fixture
async def chain(
    prefect_server: dict[str, str], mlflow_server: MlflowServer, kubeconfig: Path, namespace: str
) -> Chain:
    """A fresh model and experiment, with its cluster and registry blocks saved on the server."""
    made = Chain(mlflow_server, kubeconfig, namespace)
    await made.save_blocks()
    return made


async def chain_events(flow_run_id: UUID, *, want: set[str], timeout_s: float = 30) -> list[Any]:
    """The model-version and inference-service events related to the flow run."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with get_client() as client:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(
                        prefix=["kubedl.model-version.", "kubedl.inference-service."]
                    ),
                    related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
                ),
                limit=50,
            )
        if want <= {e.event for e in page.events} or time.monotonic() > deadline:
            return list(page.events)
        await asyncio.sleep(1.0)


async def markdown_artifacts(flow_run_id: UUID) -> dict[str, list[str]]:
    """Every markdown artifact of the flow run, by key (a key written twice has two)."""
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    found: dict[str, list[str]] = {}
    for artifact in artifacts:
        if artifact.type == "markdown" and artifact.key:
            found.setdefault(artifact.key, []).append(str(artifact.data))
    return found


async def test_the_first_model_is_registered_promoted_and_served(chain: Chain) -> None:
    namespace, name = chain.namespace, service_name(chain.model)

    # Registered with its lineage, promoted (there is no champion yet), applied, Ready.
    run_id = chain.log_model("nightly-1", accuracy=0.80)
    first, flow_run_id = await chain.run("nightly-1")
    assert first.training.phase == "Succeeded"
    ref = first.training.job_ref
    assert ref.namespace == namespace
    assert first.version.run_id == run_id
    tags = first.version.tags
    assert tags[TAG_JOB_UID] == ref.uid
    assert tags[TAG_JOB_NAME] == ref.name
    assert tags[TAG_NAMESPACE] == namespace
    assert tags[TAG_SPEC_HASH] == ref.spec_hash
    assert tags[TAG_FLOW_RUN] == str(flow_run_id)
    assert first.version.status == "READY"
    assert first.decision.promoted
    assert first.decision.candidate_value == 0.80
    assert first.decision.champion_version is None
    assert chain.client.get_model_version_by_alias(chain.model, "champion").version == (
        first.version.version
    )
    assert first.manifest["spec"]["predictor"]["model"]["storageUri"] == first.resolved.storage_uri
    served = first.serving
    assert served is not None
    assert (served.namespace, served.name) == (namespace, name)
    assert served.readiness.state == "ready"
    live = await chain.live()
    assert live is not None
    assert live["spec"]["predictor"]["model"]["storageUri"] == first.resolved.storage_uri
    assert live["metadata"]["labels"]["kubedl-prefect.io/model-version"] == first.version.version
    assert live["metadata"]["annotations"]["kubedl-prefect.io/training-job-uid"] == ref.uid
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in live["status"]["conditions"])

    wanted = {
        "kubedl.model-version.registered",
        "kubedl.model-version.ready",
        "kubedl.model-version.promoted",
        "kubedl.inference-service.applied",
        "kubedl.inference-service.ready",
    }
    events = {e.event: e for e in await chain_events(flow_run_id, want=wanted)}
    assert wanted <= set(events), sorted(events)
    version_id = f"kubedl.model-version.{chain.model}.{first.version.version}"
    job_id = f"kubedl.training-job.{ref.uid}"
    promoted = events["kubedl.model-version.promoted"]
    assert promoted.resource.id == version_id
    assert promoted.payload["kubedl-prefect.io/gate.candidate-value"] == "0.8"
    assert {r.id for r in promoted.related} >= {job_id, f"prefect.flow-run.{flow_run_id}"}
    assert "task-run" in {r.role for r in promoted.related}
    assert events["kubedl.model-version.registered"].payload["created"] == "true"
    ready = events["kubedl.inference-service.ready"]
    assert ready.resource.id == f"kubedl.inference-service.{namespace}.{name}"
    assert ready.resource["kubedl.uid"] == served.uid
    assert {r.id for r in ready.related} >= {version_id, job_id}
    assert events["kubedl.inference-service.applied"].payload["storageUri"] == (
        first.resolved.storage_uri
    )

    artifacts = await markdown_artifacts(flow_run_id)
    # register-model writes the registration, gate-model-version adds the decision to it.
    gated = [t for t in artifacts[f"{chain.model}-registration"] if "## Gate" in t]
    assert len(gated) == 1, artifacts
    assert f"version {first.version.version}: promoted" in gated[0]
    assert ref.name in gated[0]
    assert ref.uid in gated[0]
    assert "| 0.8 (version" in gated[0]
    (serving,) = artifacts[f"{name}-serving"]
    assert ": Ready" in serving
    assert first.resolved.storage_uri in serving


async def served_first(chain: Chain) -> TrainAndServeResult:
    """The first model (accuracy 0.8), promoted and served: where the other tests start."""
    chain.log_model("nightly-1", accuracy=0.80)
    first, _ = await chain.run("nightly-1")
    assert first.decision.promoted
    assert first.serving is not None
    return first


async def test_a_worse_model_is_kept_out_and_nothing_is_applied(chain: Chain) -> None:
    name = service_name(chain.model)
    first = await served_first(chain)
    live = await chain.live()
    assert live is not None
    generation = live["metadata"]["generation"]
    chain.log_model("nightly-2", accuracy=0.75)
    second, second_run_id = await chain.run("nightly-2")
    assert second.version.version != first.version.version
    assert not second.decision.promoted
    assert second.decision.champion_version == first.version.version
    assert (second.decision.candidate_value, second.decision.champion_value) == (0.75, 0.80)
    assert second.serving is None
    assert not second.served
    assert second.manifest["metadata"]["name"] == name  # rendered for the flow run to show
    live = await chain.live()
    assert live is not None
    assert live["metadata"]["generation"] == generation
    assert live["metadata"]["labels"]["kubedl-prefect.io/model-version"] == first.version.version
    assert chain.client.get_model_version_by_alias(chain.model, "champion").version == (
        first.version.version
    )
    events = {
        e.event: e
        for e in await chain_events(second_run_id, want={"kubedl.model-version.rejected"})
    }
    assert "kubedl.model-version.rejected" in events, sorted(events)
    assert not [e for e in events if e.startswith("kubedl.inference-service.")]
    rejected = events["kubedl.model-version.rejected"]
    assert rejected.resource.id == f"kubedl.model-version.{chain.model}.{second.version.version}"
    assert rejected.payload["kubedl-prefect.io/gate.decision"] == "rejected"
    (gated_second,) = [
        t
        for t in (await markdown_artifacts(second_run_id))[f"{chain.model}-registration"]
        if "## Gate" in t
    ]
    assert "not promoted" in gated_second
    assert "| 0.75 (version" in gated_second
    assert "| 0.8 (version" in gated_second


async def test_a_failed_rollout_rolls_back_the_spec_and_the_alias(chain: Chain) -> None:
    # A better model whose service KServe refuses: the flow fails, spec and alias come back.
    namespace, name = chain.namespace, service_name(chain.model)
    first = await served_first(chain)
    job_id = f"kubedl.training-job.{first.training.job_ref.uid}"
    chain.log_model("nightly-3", accuracy=0.95)
    failing = f"chain-serving-{uuid.uuid4().hex[:8]}"
    await KServeServing(
        cluster=KubernetesCluster(kubeconfig_path=str(chain.kubeconfig), namespace=namespace),
        model_format=UNSUPPORTED["model_format"],
        ready_timeout_s=120,
    ).asave(failing)
    state = await chain.state("nightly-3", serving=failing)
    assert state.is_failed()
    assert "NoSupportingRuntime" in str(state.message)
    third_run_id = state.state_details.flow_run_id
    assert third_run_id is not None
    assert chain.client.get_model_version_by_alias(chain.model, "champion").version == (
        first.version.version
    )
    live = await chain.live()
    assert live is not None
    assert live["spec"]["predictor"]["model"]["storageUri"] == first.resolved.storage_uri
    assert live["metadata"]["labels"]["kubedl-prefect.io/model-version"] == first.version.version
    wanted = {
        "kubedl.model-version.promoted",
        "kubedl.inference-service.applied",
        "kubedl.inference-service.not-ready",
        "kubedl.inference-service.rolled-back",
        "kubedl.model-version.alias-restored",
    }
    events = {e.event: e for e in await chain_events(third_run_id, want=wanted)}
    assert wanted <= set(events), sorted(events)
    assert events["kubedl.inference-service.not-ready"].payload["reason"] == "NoSupportingRuntime"
    assert events["kubedl.inference-service.rolled-back"].payload["restored"] == "true"
    restored = events["kubedl.model-version.alias-restored"]
    assert restored.payload["restoredVersion"] == first.version.version
    assert job_id not in {r.id for r in restored.related}  # the third job made this version
    (rolled,) = (await markdown_artifacts(third_run_id))[f"{name}-serving"]
    assert ": rolled back" in rolled
    assert "NoSupportingRuntime" in rolled
