"""Registration when an answer of the tracking server is lost (a server that crashed mid-request).

MLflow's client re-sends a request whose answer never came, POSTs included (urllib3 retries every
method): a ``model-versions/create`` the server committed before it died is then made twice.
The relay (tests/support/lossy_relay.py) loses that one answer while the real server stays up.
"""

from __future__ import annotations

import uuid

from mlflow import MlflowClient

from kubedl_prefect.lifecycle.backend import JobOutcome, JobRef
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.registry import ModelRegistry
from kubedl_prefect.spec import parse_spec, spec_hash
from kubedl_prefect.spec.handoff import with_handoff
from tests.support.lossy_relay import LossyRelay
from tests.support.mlflow_server import MlflowServer
from tests.support.training import job_environment, train_and_log


def test_a_lost_answer_to_the_versions_creation_leaves_one_version(
    mlflow_server: MlflowServer,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    experiment, model = f"exp-{suffix}", f"lost-{suffix}"
    spec = parse_spec(
        {
            "name": "mnist",
            "framework": "pytorch",
            "image": "ghcr.io/example/mnist:1.0",
            "replicas": {"master": 1},
        }
    )
    direct = ModelRegistry(mlflow_server.url)
    handoff = direct.start_run(spec, key="k1", experiment=experiment)
    job_spec = with_handoff(spec, handoff)
    train_and_log(job_environment(job_spec), accuracy=0.9)
    ref = JobRef(
        backend="kubernetes",
        cluster="https://127.0.0.1:6443",
        dialect="kubedl",
        namespace="ml",
        name="mnist-x7k2-a1",
        uid="uid-k1-1",
        api_version="training.kubedl.io/v1alpha1",
        kind="PyTorchJob",
        key="k1",
        attempt=1,
        spec_hash=spec_hash(job_spec),
    )
    outcome = JobOutcome(ref, JobStatus(phase=Phase.SUCCEEDED, reason="JobSucceeded"))
    relay = LossyRelay(mlflow_server.port, b"/api/2.0/mlflow/model-versions/create")
    try:
        version = ModelRegistry(relay.url).register(handoff, outcome, spec, model_name=model)
    finally:
        relay.close()

    assert relay.lost == 1  # the server made a version whose answer never came back
    versions = MlflowClient(mlflow_server.url).search_model_versions(f"name = '{model}'")
    assert [v.version for v in versions] == [version.version]
    assert version.created
    assert version.status == "READY"
    again = direct.register(handoff, outcome, spec, model_name=model)
    assert (again.version, again.created) == (version.version, False)
