r"""Train, register, gate and serve: one flow from a training spec to a model being served.

``train-and-serve`` runs the whole chain for one logical job (spec name + key):

1. ``start-model-run``: the MLflow run of the logical job (found again on a re-run), whose
   handoff (tracking URI, run id, model name) goes into every replica's environment;
2. ``run-training-job``: the training job on the cluster block, with classified retries;
3. ``register-model``: the model the job logged (or wrote) becomes a version with its lineage;
4. ``resolve-model-version``: the version's ``storageUri``, checked against the serving runtime;
5. ``gate-model-version``: the candidate against the champion alias on one metric;
6. ``render-inference-service``: the InferenceService manifest, always, so the flow run shows
   what would be served;
7. with ``serve="kserve"`` and a promoted candidate, ``deploy-inference-service`` applies it,
   waits for Ready and rolls spec and alias back otherwise; with ``serve="local"``,
   ``serve-locally`` serves the version on this machine by the same model server (MLServer)
   instead; ``"none"`` stops at the manifest.

The flow run's page links to the MLflow run and the model version (``register-model``'s link
artifacts) and to the endpoint (``deploy-inference-service``'s or ``serve-locally``'s).

It returns a :class:`TrainAndServeResult`. Jobs the flow run created are deleted when it is
cancelled or crashes (``CLEANUP_HOOKS``).

``flows/train_and_serve.py`` in the checkout re-exports this module. Run it once against the test
bed and a tracking server::

    python -m kubedl_prefect.prefect.flows.train_and_serve flows/specs/testbed-mnist.yaml \
        --cluster testbed --tracking-uri http://127.0.0.1:5000 --model mnist --serve none
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from kubedl_prefect.prefect import (
    CLEANUP_HOOKS,
    KServeServing,
    KubernetesCluster,
    MlflowRegistry,
    RetrySettings,
    TrainingJob,
    TrainingResult,
    deploy_inference_service,
    gate_model_version,
    register_model,
    render_inference_service,
    resolve_model_version,
    run_training_job,
    start_model_run,
)
from kubedl_prefect.prefect.artifacts import web_link
from kubedl_prefect.prefect.blocks import ClusterBlock, load_cluster
from kubedl_prefect.prefect.chain import write_link
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.model_blocks import as_serving_block
from kubedl_prefect.prefect.sync import run_in_caller_context
from kubedl_prefect.registry import GatePolicy
from kubedl_prefect.registry.compat import KSERVE_MLSERVER
from kubedl_prefect.registry.gate import GateDecision
from kubedl_prefect.registry.mlflow_registry import RegisteredVersion, ResolvedModel
from kubedl_prefect.serving import ModelLink, ServingOutcome
from kubedl_prefect.spec import TrainingJobSpec, load_spec, parse_spec, spec_to_data
from kubedl_prefect.spec.handoff import with_handoff

if TYPE_CHECKING:
    from kubedl_prefect.serving.local import LocalModelServer

_SUMMARY = "Train, register, gate and serve: one flow from a training spec to a served model."

Serve = Literal["kserve", "local", "none"]
"""Where a promoted version is served: KServe, this machine, or nowhere (manifest only)."""


@dataclass(frozen=True)
class TrainAndServeResult:
    """What one train-and-serve run did.

    Attributes:
        training: How the training job ended.
        version: The registered model version (with its lineage tags).
        resolved: Its ``storageUri`` (what KServe loads).
        decision: The gate's decision, with both values.
        manifest: The InferenceService manifest (rendered and checked, applied only when served).
        serving: The InferenceService that is Ready (``serve="kserve"``, promoted).
        local: The local model server (``serve="local"``, promoted): ``predict()``, ``stop()``.
    """

    training: TrainingResult
    version: RegisteredVersion
    resolved: ResolvedModel
    decision: GateDecision
    manifest: dict[str, Any]
    serving: ServingOutcome | None = None
    local: Any = None

    @property
    def served(self) -> bool:
        """Whether the version is being served (by KServe or locally)."""
        return self.serving is not None or self.local is not None


def service_name(model_name: str) -> str:
    """An InferenceService name (DNS-1035, at most 53 characters) for a model's name.

    Example:
        >>> service_name("Team/Fraud_Detector")
        'team-fraud-detector'
    """
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"m-{name}"
    return name[:53].rstrip("-")


def registry_block(tracking_uri: str | None, registry: str | None) -> MlflowRegistry:
    """The saved registry block ``registry``, else one for ``tracking_uri``."""
    if registry:
        loaded = MlflowRegistry.load(registry)
        assert isinstance(loaded, MlflowRegistry)
        return loaded
    if not tracking_uri:
        raise ValueError("give tracking_uri (an MLflow server) or registry (a saved block's name)")
    return MlflowRegistry(tracking_uri=tracking_uri)


def serving_block(
    name: str | None, cluster: ClusterBlock, namespace: str | None, runtime: str | None
) -> KServeServing:
    """The saved serving block ``name``, else one on the training cluster.

    A local (embedded) training cluster has no KServe: the InferenceService then goes to the
    process's default Kubernetes cluster (``$KUBECONFIG``), and is only rendered unless
    ``serve="kserve"`` asks for it.
    """
    if name:
        return as_serving_block(name)
    kube = cluster if isinstance(cluster, KubernetesCluster) else KubernetesCluster()
    return KServeServing(cluster=kube, namespace=namespace, runtime=runtime)


def _spec(spec: str | dict[str, Any]) -> TrainingJobSpec:
    return load_spec(spec) if isinstance(spec, str) else parse_spec(spec)


@flow(name="train-and-serve", log_prints=True, **CLEANUP_HOOKS)
def train_and_serve(
    spec: str | dict[str, Any] = "flows/specs/testbed-mnist.yaml",
    cluster: str = "testbed",
    dialect: str = "kubedl",
    namespace: str | None = None,
    key: str | None = None,
    max_attempts: int = 3,
    model_name: str = "mnist",
    tracking_uri: str | None = None,
    registry: str | None = None,
    experiment: str | None = None,
    metric: str = "accuracy",
    higher_is_better: bool = True,
    min_improvement: float = 0.0,
    alias: str = "champion",
    serving: str | None = None,
    serving_namespace: str | None = None,
    runtime: str | None = KSERVE_MLSERVER.name,
    name: str | None = None,
    serve: Serve = "kserve",
) -> TrainAndServeResult:
    """Train the spec, register the model, gate it against the champion, and serve it.

    Args:
        spec: A spec file (on the machine of the flow run) or the spec's fields.
        cluster: The name of a saved cluster block: ``kubedl-kubernetes-cluster`` (training,
            and serving unless ``serving`` names a block) or ``kubedl-local-cluster`` (this
            machine: the embedded default; serve with ``serve="local"``).
        dialect: ``kubedl`` or ``kubeflow``.
        namespace: Where the job runs (default: the cluster block's namespace).
        key: The logical job's key (default: this flow run's id; a re-run of the flow run
            adopts its job, run and version).
        max_attempts: Attempts in all for retryable training failures.
        model_name: The registered model.
        tracking_uri: The MLflow tracking server (or give ``registry``).
        registry: The name of a saved ``kubedl-mlflow-registry`` block.
        experiment: The MLflow experiment (default: the block's, else the spec's name).
        metric: The metric the gate compares.
        higher_is_better: ``False`` for losses and errors.
        min_improvement: The least improvement over the champion that promotes.
        alias: The champion alias.
        serving: The name of a saved ``kubedl-kserve-serving`` block.
        serving_namespace: Without a serving block: where the InferenceService goes.
        runtime: Without a serving block: the serving runtime (empty: KServe chooses).
        name: The InferenceService's name (default: from the model's name).
        serve: ``kserve`` (apply a promoted version), ``local`` (serve it on this machine) or
            ``none`` (only the manifest).
    """
    typed = _spec(spec)
    key = key or f"{flow_run.id}/train-and-serve"
    mlflow = registry_block(tracking_uri, registry)
    handoff = start_model_run(mlflow, typed, key, experiment=experiment)
    cluster_block = load_cluster(cluster)
    job = TrainingJob(
        spec=spec_to_data(with_handoff(typed, handoff)),
        cluster=cluster_block,
        dialect=dialect,
        namespace=namespace,
        retry=RetrySettings(max_attempts=max_attempts),
    )
    training = run_training_job(job, key=key)
    print(f"{training.spec_name}: {training.phase} after {len(training.attempts)} attempt(s)")

    version = register_model(mlflow, handoff, training, typed, model_name)
    server = serving_block(serving, cluster_block, serving_namespace, runtime)
    check = KSERVE_MLSERVER if serve == "kserve" and server.check_compatibility else None
    resolved = resolve_model_version(mlflow, version, runtime=check)
    policy = GatePolicy(
        metric, higher_is_better=higher_is_better, min_improvement=min_improvement, alias=alias
    )
    decision = gate_model_version(mlflow, version, policy)
    print(
        f"{version.model_uri}: {'promoted' if decision.promoted else 'kept out'}: {decision.reason}"
    )

    ref = training.job_ref
    service = server.service(
        name or service_name(model_name),
        resolved.storage_uri,
        link=ModelLink(model_name, version.version, ref.namespace, ref.name, ref.uid),
    )
    manifest = render_inference_service(service, server)
    result = TrainAndServeResult(training, version, resolved, decision, manifest)
    if not decision.promoted or serve == "none":
        return result
    if serve == "kserve":
        outcome = deploy_inference_service(service, server, mlflow, decision)
        print(f"{outcome.namespace}/{outcome.name} is Ready at {outcome.url}")
        return TrainAndServeResult(training, version, resolved, decision, manifest, outcome)
    local = _serve_locally(mlflow, version.model_uri, service.name)
    print(f"{version.model_uri} is served locally at {local.infer_url}")
    return TrainAndServeResult(training, version, resolved, decision, manifest, local=local)


# Never persisted: the result is a running server (a process and an HTTP client).
@task(name="serve-locally", cache_policy=NO_CACHE, persist_result=False)
def _serve_locally(mlflow: MlflowRegistry, model_uri: str, name: str) -> LocalModelServer:
    """Serve ``model_uri`` on this machine (MLServer, the runtime kserve-mlserver runs).

    Its task run leaves the ``<name>-endpoint`` link artifact to the model on the server
    (``/v2/models/<name>``: its metadata; ``/infer`` under it predicts), as
    ``deploy_inference_service`` does for KServe's URL.
    """
    import os

    from kubedl_prefect.serving.local import serve_locally

    credentials = {variable: os.environ[variable] for variable in mlflow.export_credentials()}
    local = serve_locally(model_uri, tracking_uri=mlflow.tracking_uri, name=name, env=credentials)
    ctx = RunContext.capture()
    run_in_caller_context(
        lambda: write_link(
            ctx,
            name,
            "endpoint",
            web_link(local.url, f"/v2/models/{name}"),
            f"{name} on this machine (MLServer)",
            f"The endpoint of `{model_uri}` served on this machine: POST `{local.infer_url}`",
        )
    )
    return local


def main() -> None:
    """Run :func:`train_and_serve` once."""
    parser = argparse.ArgumentParser(description=_SUMMARY)
    parser.add_argument("spec", nargs="?", default="flows/specs/testbed-mnist.yaml")
    parser.add_argument("--cluster", default="testbed")
    parser.add_argument("--dialect", default="kubedl", choices=["kubedl", "kubeflow"])
    parser.add_argument("--key")
    parser.add_argument("--model", default="mnist")
    parser.add_argument("--tracking-uri")
    parser.add_argument("--registry", help="a saved kubedl-mlflow-registry block")
    parser.add_argument("--metric", default="accuracy")
    parser.add_argument("--serve", default="kserve", choices=["kserve", "local", "none"])
    args = parser.parse_args()
    result = train_and_serve(
        spec=args.spec,
        cluster=args.cluster,
        dialect=args.dialect,
        key=args.key,
        model_name=args.model,
        tracking_uri=args.tracking_uri,
        registry=args.registry,
        metric=args.metric,
        serve=args.serve,
    )
    print(result.decision.reason)
    print(result.serving or result.local or "nothing applied")


if __name__ == "__main__":
    main()
