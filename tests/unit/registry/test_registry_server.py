"""The registry against a real MLflow tracking server (started by the ``mlflow_server`` fixture)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from kubedl_prefect.errors import IncompatibleModelError, ModelSourceRefusedError, RegistryError
from kubedl_prefect.lifecycle.backend import JobOutcome, JobRef
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.registry import GatePolicy, ModelRegistry, ModelVersionEvent
from kubedl_prefect.registry.compat import KSERVE_MLSERVER
from kubedl_prefect.registry.gate import (
    TAG_CANDIDATE_VALUE,
    TAG_CHAMPION_VALUE,
    TAG_CHAMPION_VERSION,
    TAG_DECISION,
    TAG_ROLLED_BACK,
)
from kubedl_prefect.registry.lineage import (
    TAG_ATTEMPT,
    TAG_FLOW_RUN,
    TAG_IMAGE,
    TAG_JOB_NAME,
    TAG_JOB_UID,
    TAG_METRIC_PREFIX,
    TAG_NAMESPACE,
    TAG_SPEC_HASH,
)
from kubedl_prefect.spec import TrainingJobSpec, parse_spec, spec_hash
from kubedl_prefect.spec.handoff import Handoff, HandoffMode, with_handoff
from tests.support.mlflow_server import MlflowServer
from tests.support.training import job_environment, train_and_log, train_and_save


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def make_spec(name: str = "mnist") -> TrainingJobSpec:
    return parse_spec(
        {
            "name": name,
            "framework": "pytorch",
            "image": "ghcr.io/example/mnist:1.0",
            "replicas": {"master": 1, "worker": 2},
        }
    )


def succeeded(spec: TrainingJobSpec, key: str, attempt: int = 1) -> JobOutcome:
    ref = JobRef(
        backend="kubernetes",
        cluster="https://127.0.0.1:6443",
        dialect="kubedl",
        namespace="ml",
        name=f"{spec.name}-x7k2-a{attempt}",
        uid=f"uid-{key}-{attempt}",
        api_version="training.kubedl.io/v1alpha1",
        kind="PyTorchJob",
        key=key,
        attempt=attempt,
        spec_hash=spec_hash(spec),
    )
    return JobOutcome(ref, JobStatus(phase=Phase.SUCCEEDED, reason="JobSucceeded"))


@pytest.fixture
def registry(mlflow_server: MlflowServer) -> ModelRegistry:
    return ModelRegistry(mlflow_server.url, artifact_destination=mlflow_server.artifact_destination)


@pytest.fixture
def client(mlflow_server: MlflowServer) -> MlflowClient:
    return MlflowClient(mlflow_server.url)


def train(
    registry: ModelRegistry,
    experiment: str,
    key: str,
    *,
    accuracy: float,
    serialization_format: str = "pickle",
) -> tuple[TrainingJobSpec, Handoff, TrainingJobSpec]:
    """start_run, render the job with the handoff, run 'rank 0' with the job's environment."""
    spec = make_spec()
    handoff = registry.start_run(spec, key=key, experiment=experiment)
    job_spec = with_handoff(spec, handoff)
    train_and_log(
        job_environment(job_spec), accuracy=accuracy, serialization_format=serialization_format
    )
    return spec, handoff, job_spec


def test_a_logical_job_has_one_run_whatever_the_retries(registry: ModelRegistry) -> None:
    experiment = unique("exp")
    spec = make_spec()
    first = registry.start_run(spec, key="nightly-1", experiment=experiment)
    again = registry.start_run(spec, key="nightly-1", experiment=experiment)
    other = registry.start_run(spec, key="nightly-2", experiment=experiment)
    assert first == again
    assert other.run_id != first.run_id
    assert first.experiment_id == other.experiment_id
    assert first.tracking_uri == registry.tracking_uri


def test_registration_carries_lineage_and_a_retry_makes_no_second_version(
    registry: ModelRegistry, client: MlflowClient
) -> None:
    experiment, model = unique("exp"), unique("fraud")
    seen: list[ModelVersionEvent] = []
    registry.on_event = seen.append
    spec, handoff, job_spec = train(registry, experiment, "k1", accuracy=0.9)
    outcome = succeeded(job_spec, "k1", attempt=2)

    version = registry.register(handoff, outcome, spec, model_name=model, flow_run_id="flow-7")
    retried = registry.register(handoff, outcome, spec, model_name=model, flow_run_id="flow-7")

    assert version.created
    assert not retried.created
    assert retried.version == version.version == "1"
    assert version.status == "READY"
    assert [v.version for v in client.search_model_versions(f"name = '{model}'")] == ["1"]
    tags = client.get_model_version(model, "1").tags  # read back through the MLflow API
    assert tags[TAG_NAMESPACE] == "ml"
    assert tags[TAG_JOB_NAME] == outcome.ref.name
    assert tags[TAG_JOB_UID] == outcome.ref.uid
    assert tags[TAG_ATTEMPT] == "2"
    assert tags[TAG_IMAGE] == "ghcr.io/example/mnist:1.0"
    assert tags[TAG_SPEC_HASH] == spec_hash(job_spec)
    assert tags[TAG_FLOW_RUN] == "flow-7"
    assert float(tags[f"{TAG_METRIC_PREFIX}accuracy"]) == 0.9
    assert version.source.startswith("models:/m-")
    assert [e.event for e in seen] == [
        "kubedl.model-version.registered",
        "kubedl.model-version.ready",
    ] * 2
    assert seen[0].payload["created"] == "true"
    assert seen[2].payload["created"] == "false"


def test_a_job_that_logged_no_model_or_failed_is_not_registered(registry: ModelRegistry) -> None:
    experiment = unique("exp")
    spec = make_spec()
    handoff = registry.start_run(spec, key="k", experiment=experiment)
    with pytest.raises(RegistryError, match="logged no model named 'model'"):
        registry.register(handoff, succeeded(spec, "k"), spec, model_name=unique("m"))
    failed = JobOutcome(succeeded(spec, "k").ref, JobStatus(phase=Phase.FAILED))
    with pytest.raises(RegistryError, match="did not succeed"):
        registry.register(handoff, failed, spec, model_name=unique("m"))


def test_the_gate_promotes_better_candidates_only_and_records_why(
    registry: ModelRegistry, client: MlflowClient
) -> None:
    experiment, model = unique("exp"), unique("fraud")
    policy = GatePolicy("accuracy", min_improvement=0.01)
    versions = []
    for key, accuracy in (("k1", 0.80), ("k2", 0.90), ("k3", 0.85)):
        spec, handoff, job_spec = train(registry, experiment, key, accuracy=accuracy)
        versions.append(
            registry.register(handoff, succeeded(job_spec, key), spec, model_name=model)
        )

    first = registry.evaluate(model, versions[0].version, policy)
    better = registry.evaluate(model, versions[1].version, policy)
    worse = registry.evaluate(model, versions[2].version, policy)

    assert first.promoted
    assert first.champion_version is None
    assert better.promoted
    assert better.champion_version == "1"
    assert better.candidate_value == 0.9
    assert better.champion_value == 0.8
    assert not worse.promoted
    assert worse.champion_version == "2"
    assert client.get_model_version_by_alias(model, "champion").version == "2"
    tags = client.get_model_version(model, "3").tags
    assert tags[TAG_DECISION] == "rejected"
    assert (tags[TAG_CANDIDATE_VALUE], tags[TAG_CHAMPION_VALUE]) == ("0.85", "0.9")
    assert tags[TAG_CHAMPION_VERSION] == "2"

    # A retried gate returns its recorded decision instead of judging the champion by itself.
    assert registry.evaluate(model, "2", policy) == better
    assert client.get_model_version_by_alias(model, "champion").version == "2"

    # Serving failed: the alias goes back to the previous champion, once.
    assert registry.restore_alias(better)
    assert client.get_model_version_by_alias(model, "champion").version == "1"
    assert client.get_model_version(model, "2").tags[TAG_ROLLED_BACK] == "true"
    assert not registry.restore_alias(better)
    assert registry.evaluate(model, "2", policy) == better  # and it is not promoted again
    assert client.get_model_version_by_alias(model, "champion").version == "1"


def test_restoring_the_first_promotion_removes_the_alias(
    registry: ModelRegistry, client: MlflowClient
) -> None:
    experiment, model = unique("exp"), unique("fraud")
    spec, handoff, job_spec = train(registry, experiment, "k", accuracy=0.7)
    version = registry.register(handoff, succeeded(job_spec, "k"), spec, model_name=model)
    decision = registry.evaluate(model, version.version, GatePolicy("accuracy"))
    assert decision.promoted
    assert registry.restore_alias(decision)
    assert not client.get_registered_model(model).aliases


def test_an_alias_resolves_to_the_files_kserve_loads(
    registry: ModelRegistry, mlflow_server: MlflowServer
) -> None:
    experiment, model = unique("exp"), unique("fraud")
    spec, handoff, job_spec = train(registry, experiment, "k", accuracy=0.7)
    version = registry.register(handoff, succeeded(job_spec, "k"), spec, model_name=model)
    registry.evaluate(model, version.version, GatePolicy("accuracy"))

    by_alias = registry.resolve(f"models:/{model}@champion")
    by_version = registry.resolve(f"models:/{model}/{version.version}")

    assert by_alias.storage_uri == by_version.storage_uri
    assert by_alias.version == version.version
    assert by_alias.download_uri.startswith("mlflow-artifacts:/")
    model_id = version.model_id
    assert by_alias.model_id == model_id
    assert by_alias.storage_uri.startswith(mlflow_server.artifact_destination)
    assert by_alias.storage_uri.endswith(f"/models/{model_id}/artifacts")
    local = Path(by_alias.storage_uri.removeprefix("file://"))
    assert (local / "MLmodel").is_file()
    logged = registry.resolve(f"models:/{model_id}")
    assert logged.storage_uri == by_alias.storage_uri
    assert registry.check_compatible(by_alias, KSERVE_MLSERVER)  # warnings only: MLflow 3 vs 2


def test_runs_sources_and_unknown_versions_are_refused(
    registry: ModelRegistry, client: MlflowClient
) -> None:
    experiment, model = unique("exp"), unique("legacy")
    _spec, handoff, _ = train(registry, experiment, "k", accuracy=0.7)
    client.create_registered_model(model)
    client.create_model_version(model, f"runs:/{handoff.run_id}/model", run_id=handoff.run_id)
    with pytest.raises(ModelSourceRefusedError) as caught:
        registry.resolve(f"models:/{model}/1")
    assert caught.value.uri == f"runs:/{handoff.run_id}/model"
    with pytest.raises(RegistryError, match="does not exist"):
        registry.resolve(f"models:/{model}/9")
    with pytest.raises(RegistryError, match="does not exist"):
        registry.resolve(f"models:/{model}@champion")


def test_the_default_skops_format_is_refused_for_the_stock_runtime(
    registry: ModelRegistry,
) -> None:
    experiment, model = unique("exp"), unique("fraud")
    spec, handoff, job_spec = train(
        registry, experiment, "k", accuracy=0.7, serialization_format="skops"
    )
    version = registry.register(handoff, succeeded(job_spec, "k"), spec, model_name=model)
    resolved = registry.resolve(version.model_uri)
    facts = registry.model_facts(resolved)
    assert facts.flavors["sklearn"].serialization_format == "skops"
    with pytest.raises(IncompatibleModelError, match="'skops'") as caught:
        registry.check_compatible(resolved, KSERVE_MLSERVER)
    hint = caught.value.hint or ""
    assert hint.index("ONNX") < hint.index("serialization_format='pickle'")


def test_output_mode_logs_the_directory_the_job_wrote_once(
    registry: ModelRegistry, client: MlflowClient, tmp_path: Path
) -> None:
    experiment, model = unique("exp"), unique("fraud")
    spec = make_spec()
    handoff = registry.start_run(
        spec, key="k", experiment=experiment, mode=HandoffMode.OUTPUT, model_dir=str(tmp_path)
    )
    assert handoff.model_dir is not None
    assert handoff.model_dir.startswith(f"{tmp_path}/mnist-")
    job_spec = with_handoff(spec, handoff)
    train_and_save(job_environment(job_spec), accuracy=0.75)

    version = registry.register(handoff, succeeded(job_spec, "k"), spec, model_name=model)
    again = registry.register(handoff, succeeded(job_spec, "k"), spec, model_name=model)

    assert (version.version, again.version, again.created) == ("1", "1", False)
    logged = client.search_logged_models([handoff.experiment_id])
    assert [m.model_id for m in logged] == [version.model_id]
    resolved = registry.resolve(version.model_uri)
    assert (Path(resolved.storage_uri.removeprefix("file://")) / "MLmodel").is_file()
    assert float(client.get_model_version(model, "1").tags[f"{TAG_METRIC_PREFIX}accuracy"]) == 0.75


def test_finishing_a_run_records_the_jobs_lineage_and_its_end(
    registry: ModelRegistry, client: MlflowClient
) -> None:
    experiment = unique("exp")
    spec = make_spec()
    handoff = registry.start_run(spec, key="k", experiment=experiment)
    job_spec = with_handoff(spec, handoff)
    outcome = succeeded(job_spec, "k", attempt=3)
    registry.finish_run(handoff, outcome, spec, flow_run_id="flow-1")
    run = client.get_run(handoff.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[TAG_JOB_UID] == outcome.ref.uid
    assert run.data.tags[TAG_ATTEMPT] == "3"
    assert run.data.tags[TAG_FLOW_RUN] == "flow-1"
    failed = JobOutcome(outcome.ref, JobStatus(phase=Phase.FAILED))
    registry.finish_run(handoff, failed, spec)
    assert client.get_run(handoff.run_id).info.status == "FAILED"
