"""The registry side of the model chain: its block, events, summary, and its tasks in real flows.

The pure parts are checked on their own; the tasks run inside Prefect flows against a real Prefect
server (``prefect_test_harness``) and a real MLflow tracking server (``mlflow_server``), with the
training job's part played here: rank 0 logs the model into the job's run with the environment
the handoff gives the job, and the training task's result is made by hand. What the flow runs
leave in Prefect (events) is read back through the Prefect API.
"""

from __future__ import annotations

import asyncio
import doctest
import gc
import inspect
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from mlflow import MlflowClient
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter
from pydantic import SecretStr, ValidationError

from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.prefect import artifacts, model_blocks, registry_tasks
from kubedl_prefect.prefect.artifacts import registration_markdown
from kubedl_prefect.prefect.events import model_version_event, training_job_related
from kubedl_prefect.prefect.model_blocks import MlflowRegistry
from kubedl_prefect.prefect.results import TrainingResult
from kubedl_prefect.registry import GatePolicy, RegisteredVersion
from kubedl_prefect.registry import events as registry_events
from kubedl_prefect.registry.events import ModelVersionEvent
from kubedl_prefect.registry.gate import GateDecision
from kubedl_prefect.registry.mlflow_registry import ModelRegistry
from kubedl_prefect.spec import loads_spec, spec_hash
from kubedl_prefect.spec.handoff import (
    PASSWORD_ENV,
    TOKEN_ENV,
    USERNAME_ENV,
    Handoff,
    with_handoff,
)
from tests.support.mlflow_server import MlflowServer
from tests.support.prefect_reads import link_artifacts
from tests.support.training import job_environment, train_and_log

pytestmark = pytest.mark.filterwarnings(
    # Prefect 3.9.1 leaks one HTTP connection per async flow run (results.py,
    # _read_server_default_result_storage_block_id never closes its sync client).
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    "ignore:unclosed <socket.socket:ResourceWarning",
)

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


SPEC = loads_spec(
    "{name: fraud, framework: pytorch, image: ghcr.io/example/fraud:1.0, "
    "replicas: {master: 1, worker: 1}}"
)
PASSWORD = "pa55-w0rd-never-shown"


def training_result(key: str, *, phase: str = "Succeeded") -> TrainingResult:
    ref = JobRef(
        backend="kubernetes",
        cluster="https://127.0.0.1:6443",
        dialect="kubedl",
        namespace="ml",
        name=f"fraud-{key}-a1",
        uid=f"uid-{key}",
        api_version="training.kubedl.io/v1alpha1",
        kind="PyTorchJob",
        key=key,
        attempt=1,
        spec_hash=spec_hash(SPEC),
    )
    return TrainingResult(spec_name=SPEC.name, key=key, phase=phase, ref=ref.to_dict())


# -- pure parts ------------------------------------------------------------------------------


def test_every_async_registry_task_has_a_sync_twin_with_the_same_signature() -> None:
    found = 0
    for name, value in vars(registry_tasks).items():
        if not (name.startswith("a") and inspect.iscoroutinefunction(getattr(value, "fn", None))):
            continue
        twin = getattr(registry_tasks, name[1:])
        assert not inspect.iscoroutinefunction(twin.fn), name
        assert inspect.signature(twin.fn) == inspect.signature(value.fn), name
        assert twin.name == value.name
        assert twin.retries == value.retries == 2
        found += 1
    assert found == 4


def test_a_training_result_stands_for_the_outcome_registration_reads() -> None:
    succeeded = registry_tasks.job_outcome(training_result("k1"))
    assert succeeded.succeeded
    assert succeeded.ref.uid == "uid-k1"
    failed = registry_tasks.job_outcome(training_result("k2", phase="JobCancelledError"))
    assert not failed.succeeded
    assert failed.status.reason == "JobCancelledError"


def test_the_registry_block_validates_its_credentials_and_hides_them() -> None:
    with pytest.raises(ValidationError, match="both username and password"):
        MlflowRegistry(tracking_uri="http://m", username="ci")
    with pytest.raises(ValidationError, match="not both"):
        MlflowRegistry(tracking_uri="http://m", token=SecretStr("t"), username="ci")
    with pytest.raises(ValidationError, match="need pod_credentials_secret"):
        MlflowRegistry(tracking_uri="http://m", pod_token_key="token")
    block = MlflowRegistry(
        tracking_uri="http://m",
        username="ci",
        password=SecretStr(PASSWORD),
        pod_credentials_secret="mlflow-auth",
        pod_username_key="user",
        pod_password_key="password",
    )
    assert PASSWORD not in repr(block)
    assert PASSWORD not in str(block.model_dump())
    assert PASSWORD not in block.model_dump_json()
    credentials = block.pod_credentials()
    assert credentials is not None
    env = credentials.env()
    assert {name: (v.secret_key_ref.name, v.secret_key_ref.key) for name, v in env.items()} == {
        USERNAME_ENV: ("mlflow-auth", "user"),
        PASSWORD_ENV: ("mlflow-auth", "password"),
    }
    assert MlflowRegistry(tracking_uri="http://m").pod_credentials() is None


@pytest.mark.parametrize("field", ["tracking_uri", "registry_uri", "pod_tracking_uri"])
def test_the_registry_block_refuses_credentials_in_its_uris(field: str) -> None:
    fields = {"tracking_uri": "http://m", field: f"https://ci:{PASSWORD}@mlflow.example:5000"}
    with pytest.raises(ValidationError) as caught:
        MlflowRegistry(**fields)  # type: ignore[arg-type]
    text = str(caught.value)
    assert PASSWORD not in text
    assert f"{field} holds user info" in text
    assert "password (kept secret)" in text
    assert "MLFLOW_TRACKING_USERNAME" in text


def test_the_registry_block_hands_its_credentials_to_mlflow_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (USERNAME_ENV, PASSWORD_ENV, TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    block = MlflowRegistry(
        tracking_uri="http://mlflow.ml:5000",
        pod_tracking_uri="http://mlflow.ml.svc:5000",
        username="ci",
        password=SecretStr(PASSWORD),
        artifact_destination="s3://ml-artifacts",
        storage_rewrites={"file:///srv/": "pvc://models/"},
        ready_timeout_s=12.0,
    )
    registry = block.registry()
    assert isinstance(registry, ModelRegistry)
    assert os.environ[USERNAME_ENV] == "ci"
    assert os.environ[PASSWORD_ENV] == PASSWORD
    assert TOKEN_ENV not in os.environ
    assert (registry.tracking_uri, registry.pod_tracking_uri) == (
        "http://mlflow.ml:5000",
        "http://mlflow.ml.svc:5000",
    )
    assert registry.artifact_destination == "s3://ml-artifacts"
    assert registry.storage_rewrites == {"file:///srv/": "pvc://models/"}
    assert registry.ready_timeout_s == 12.0
    assert PASSWORD not in repr(registry)
    assert MlflowRegistry(tracking_uri="http://m").export_credentials() == []


def test_the_model_blocks_are_documented_block_types() -> None:
    # Registration itself (kubedl_prefect.prefect.collection) is tested in test_collection.py.
    for block in (model_blocks.MlflowRegistry, model_blocks.KServeServing):
        assert block.get_block_type_slug().startswith("kubedl-")
        assert "kubernetes" not in str(block._logo_url).lower()  # its project's, not Kubernetes'
        assert block.__doc__ is not None
        assert "Example:" in block.__doc__
        for name, field in block.model_fields.items():
            assert field.title, name


@pytest.mark.parametrize(
    "name",
    [
        registry_events.REGISTERED,
        registry_events.READY,
        registry_events.PROMOTED,
        registry_events.REJECTED,
        registry_events.ALIAS_RESTORED,
    ],
)
def test_a_registry_record_is_emitted_as_it_is(name: str) -> None:
    record = ModelVersionEvent(name, "fraud", "3", {"source": "models:/m-ab"})
    related = training_job_related("uid-job", "fraud-x-a1")
    spec = model_version_event(record, related)
    assert spec.event == name
    assert spec.id == uuid.UUID(record.id)
    assert spec.resource == {
        "prefect.resource.id": "kubedl.model-version.fraud.3",
        "prefect.resource.name": "fraud v3",
        "kubedl.model-name": "fraud",
        "kubedl.model-version": "3",
    }
    assert spec.payload == {"source": "models:/m-ab"}
    assert spec.related == related


def test_the_registration_summary_has_the_lineage_and_both_values() -> None:
    version = RegisteredVersion(
        "fraud",
        "3",
        "models:/m-ab",
        "run-1",
        "m-ab",
        "READY",
        {
            "kubedl-prefect.io/job-namespace": "ml",
            "kubedl-prefect.io/job-name": "fraud-x-a2",
            "kubedl-prefect.io/job-uid": "uid-2",
            "kubedl-prefect.io/attempt": "2",
            "kubedl-prefect.io/image": "ghcr.io/example/fraud:1.0",
            "kubedl-prefect.io/metric.accuracy": "0.93",
        },
        created=False,
    )
    decision = GateDecision(
        "fraud", "champion", "3", "2", "accuracy", 0.93, 0.9, True, "accuracy 0.93 improves"
    )
    text = registration_markdown(version, decision)
    assert text.startswith("# Model `fraud` version 3: promoted")
    assert "found: an earlier try of this step had made it" in text
    assert "| training job | `ml/fraud-x-a2` (uid `uid-2`, attempt 2) |" in text
    assert "| metrics | accuracy 0.93 |" in text
    assert "| 0.93 (version 3) | 0.9 (version 2) | promoted | accuracy 0.93 improves |" in text
    first = GateDecision("fraud", "champion", "1", None, "accuracy", 0.8, None, True, "first")
    assert "| 0.8 (version 1) | — (no champion) | promoted | first |" in registration_markdown(
        version, first
    )
    assert registration_markdown(version).startswith("# Model `fraud` version 3: registered")


@pytest.mark.parametrize("module", [artifacts, model_blocks, registry_tasks])
def test_the_examples_in_the_docstrings_hold(module: object) -> None:
    result = doctest.testmod(module, raise_on_error=False)  # type: ignore[arg-type]
    assert result.failed == 0
    assert result.attempted > 0


# -- the tasks in flows, against real servers -------------------------------------------------


@pytest.fixture(autouse=True)
def collect_prefects_leaked_connections() -> Iterator[None]:
    yield
    gc.collect()


async def model_events(flow_run_id: UUID, want: set[str], timeout_s: float = 30) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        async with get_client() as client:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(prefix=["kubedl.model-version."]),
                    related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
                ),
                limit=50,
            )
        if want <= {e.event for e in page.events} or time.monotonic() > deadline:
            return list(page.events)
        await asyncio.sleep(0.5)


def test_links_go_only_to_http_servers() -> None:
    assert artifacts.mlflow_run_link("https://mlflow.example.com/", "r 1") == (
        "https://mlflow.example.com/#/runs/r%201"
    )
    assert artifacts.mlflow_run_link("https://mlflow.example.com", None) is None
    for server in ("file:///tmp/mlruns", "databricks", "javascript:alert(1)", "https://u:p@m"):
        assert artifacts.model_version_link(server, "fraud", "3") is None
        assert artifacts.web_link(server) is None
    assert artifacts.web_link("http://fraud.serving.example.com") == (
        "http://fraud.serving.example.com"
    )


def log_the_model(handoff: Handoff, accuracy: float) -> None:
    """Rank 0 of the job: log metrics and the model into the run of the handoff."""
    train_and_log(job_environment(with_handoff(SPEC, handoff)), accuracy=accuracy)


async def test_the_sync_tasks_register_once_gate_and_resolve_in_a_flow(
    prefect_server: dict[str, str], mlflow_server: MlflowServer
) -> None:
    model = f"fraud-{uuid.uuid4().hex[:8]}"
    block = MlflowRegistry(
        tracking_uri=mlflow_server.url,
        artifact_destination=mlflow_server.artifact_destination,
        experiment=model,
    )
    result = training_result("nightly-1")

    @flow
    def chain() -> tuple[RegisteredVersion, RegisteredVersion, GateDecision, str, str]:
        handoff = registry_tasks.start_model_run(block, SPEC, "nightly-1")
        again = registry_tasks.start_model_run(block, SPEC, "nightly-1")
        assert again.run_id == handoff.run_id  # a retried step finds its run
        log_the_model(handoff, accuracy=0.8)
        first = registry_tasks.register_model(block, handoff, result, SPEC, model)
        retried = registry_tasks.register_model(block, handoff, result, SPEC, model)
        decision = registry_tasks.gate_model_version(block, first, GatePolicy("accuracy"))
        resolved = registry_tasks.resolve_model_version(block, first)
        by_alias = registry_tasks.resolve_model_version(block, f"models:/{model}@champion")
        return first, retried, decision, resolved.storage_uri, by_alias.storage_uri

    state = await asyncio.to_thread(chain, return_state=True)
    assert state.is_completed(), state.message
    first, retried, decision, storage, by_alias = await state.result()
    assert first.created
    assert not retried.created
    assert retried.version == first.version
    assert first.status == "READY"
    assert first.tags["kubedl-prefect.io/job-uid"] == "uid-nightly-1"
    assert first.tags["kubedl-prefect.io/flow-run"] == str(state.state_details.flow_run_id)
    assert first.tags["kubedl-prefect.io/metric.accuracy"] == "0.8"
    assert decision.promoted
    assert storage == by_alias
    assert storage.startswith(mlflow_server.artifact_destination)
    assert storage.endswith(f"/models/{first.model_id}/artifacts")
    client = MlflowClient(mlflow_server.url)
    assert client.get_run(str(first.run_id)).info.status == "FINISHED"
    assert len(client.search_model_versions(f"name = '{model}'")) == 1

    flow_run_id = state.state_details.flow_run_id
    assert flow_run_id is not None
    wanted = {
        registry_events.REGISTERED,
        registry_events.READY,
        registry_events.PROMOTED,
    }
    found = await model_events(flow_run_id, wanted)
    assert wanted <= {e.event for e in found}, sorted(e.event for e in found)
    registered = [e for e in found if e.event == registry_events.REGISTERED]
    assert sorted(e.payload["created"] for e in registered) == ["false", "true"]
    links = await link_artifacts(flow_run_id)
    assert links[f"{model}-mlflow-run"] == f"{mlflow_server.url}/#/runs/{first.run_id}"
    assert links[f"{model}-model-version"] == (
        f"{mlflow_server.url}/#/models/{model}/versions/{first.version}"
    )
    for event in found:
        assert event.resource.id == f"kubedl.model-version.{model}.{first.version}"
        roles = {r.role: r.id for r in event.related}
        assert roles["training-job"] == "kubedl.training-job.uid-nightly-1"
        assert roles["flow-run"] == f"prefect.flow-run.{flow_run_id}"
        assert "task-run" in roles


async def test_the_async_tasks_keep_a_worse_candidate_out(
    prefect_server: dict[str, str], mlflow_server: MlflowServer
) -> None:
    model = f"fraud-{uuid.uuid4().hex[:8]}"
    block = MlflowRegistry(
        tracking_uri=mlflow_server.url, artifact_destination=mlflow_server.artifact_destination
    )
    policy = GatePolicy("loss", higher_is_better=False, min_improvement=0.05)

    @flow
    async def chain() -> list[GateDecision]:
        decisions = []
        for key, accuracy in (("a", 0.8), ("b", 0.82)):
            handoff = await registry_tasks.astart_model_run(block, SPEC, key, experiment=model)
            await asyncio.to_thread(log_the_model, handoff, accuracy)
            version = await registry_tasks.aregister_model(
                block, handoff, training_result(key), SPEC, model
            )
            decisions.append(await registry_tasks.agate_model_version(block, version, policy))
        return decisions

    state = await chain(return_state=True)
    assert state.is_completed(), state.message
    first, second = await state.result()
    assert first.promoted
    assert not second.promoted
    assert second.champion_version == first.candidate_version
    assert second.reason.startswith("loss 0.18 improves on the champion (0.2) by 0.02")
    champion = MlflowClient(mlflow_server.url).get_model_version_by_alias(model, "champion")
    assert champion.version == first.candidate_version
    flow_run_id = state.state_details.flow_run_id
    assert flow_run_id is not None
    found = await model_events(flow_run_id, {registry_events.REJECTED})
    rejected = [e for e in found if e.event == registry_events.REJECTED]
    assert [e.resource.id for e in rejected] == [
        f"kubedl.model-version.{model}.{second.candidate_version}"
    ]
    assert rejected[0].payload["kubedl-prefect.io/gate.champion-version"] == first.candidate_version


async def test_a_failed_job_has_no_model_to_register(
    prefect_server: dict[str, str], mlflow_server: MlflowServer
) -> None:
    block = MlflowRegistry(tracking_uri=mlflow_server.url, experiment="fraud-failed")

    @flow
    def chain() -> RegisteredVersion:
        handoff = registry_tasks.start_model_run(block, SPEC, "failed-1")
        failed = training_result("failed-1", phase="Failed")
        return registry_tasks.register_model(block, handoff, failed, SPEC, "fraud-failed")

    state = await asyncio.to_thread(chain, return_state=True)
    assert state.is_failed()
    assert "did not succeed" in str(state.message)
    async with get_client() as client:
        runs = await client.read_task_runs()
    register_runs = [r for r in runs if r.flow_run_id == state.state_details.flow_run_id]
    # Not retryable: one try of register-model.
    assert [r.state.name for r in register_runs if r.name.startswith("register-model")] == [
        "Failed"
    ]
