from __future__ import annotations

import json

import pytest

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import parse_spec, render
from kubedl_prefect.spec.handoff import (
    EXPERIMENT_ID_ENV,
    HANDOFF_ENV_NAMES,
    HANDOFF_MODE_ENV,
    MODEL_ARTIFACT_ENV,
    MODEL_DIR_ENV,
    PASSWORD_ENV,
    RUN_ID_ENV,
    TRACKING_URI_ENV,
    USERNAME_ENV,
    Handoff,
    HandoffMode,
    TrackingCredentials,
    is_rank_zero,
    read_handoff,
    with_handoff,
)

SPEC = parse_spec(
    {
        "name": "mnist",
        "framework": "pytorch",
        "image": "busybox",
        "replicas": {"master": 1, "worker": 2},
        "env": {"OMP_NUM_THREADS": 4},
    }
)
HANDOFF = Handoff(
    tracking_uri="http://mlflow.ml:5000",
    experiment_id="7",
    experiment_name="mnist",
    run_id="0a1b",
    credentials=TrackingCredentials(
        "mlflow-auth",
        username_key="user",
        password_key="password",
        extra={"AWS_SECRET_ACCESS_KEY": "s3-secret"},
    ),
)


def container_env(manifest: dict, role: str) -> dict[str, dict]:
    template = manifest["spec"]["pytorchReplicaSpecs"][role]["template"]
    return {e["name"]: e for e in template["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("dialect", ["kubedl", "kubeflow"])
def test_every_replica_gets_the_run_and_secret_references_never_values(dialect: str) -> None:
    manifest = render(with_handoff(SPEC, HANDOFF), dialect)
    for role in ("Master", "Worker"):
        env = container_env(manifest, role)
        assert env[RUN_ID_ENV] == {"name": RUN_ID_ENV, "value": "0a1b"}
        assert env[TRACKING_URI_ENV]["value"] == "http://mlflow.ml:5000"
        assert env[EXPERIMENT_ID_ENV]["value"] == "7"
        assert env[HANDOFF_MODE_ENV]["value"] == "run"
        assert env[MODEL_ARTIFACT_ENV]["value"] == "model"
        assert env["OMP_NUM_THREADS"]["value"] == "4"
        for name, key in (
            (USERNAME_ENV, "user"),
            (PASSWORD_ENV, "password"),
            ("AWS_SECRET_ACCESS_KEY", "s3-secret"),
        ):
            assert env[name] == {
                "name": name,
                "valueFrom": {"secretKeyRef": {"name": "mlflow-auth", "key": key}},
            }
    assert "password" not in json.dumps(manifest).replace('"key": "password"', "")


def test_credentials_in_the_uri_and_conflicting_env_are_refused() -> None:
    leaky = Handoff("http://me:secret@mlflow:5000", "7", "e", "r")
    with pytest.raises(SpecError) as caught:
        with_handoff(SPEC, leaky)
    assert [issue.path for issue in caught.value.issues] == ["handoff.trackingUri"]
    assert "secret" not in str(caught.value)
    clash = parse_spec(
        {"name": "m", "image": "i", "replicas": {"master": {"count": 1, "env": {RUN_ID_ENV: "x"}}}}
    )
    with pytest.raises(SpecError) as caught:
        with_handoff(clash, HANDOFF)
    assert [issue.path for issue in caught.value.issues] == [f"replicas.master.env.{RUN_ID_ENV}"]


def test_output_mode_needs_a_location_and_passes_it() -> None:
    with pytest.raises(SpecError, match=r"handoff.modelDir"):
        with_handoff(SPEC, Handoff("http://m", "7", "e", "r", mode=HandoffMode.OUTPUT))
    spec = with_handoff(
        SPEC, Handoff("http://m", "7", "e", "r", mode=HandoffMode.OUTPUT, model_dir="/out/x")
    )
    assert spec.env is not None
    assert spec.env[MODEL_DIR_ENV].value == "/out/x"


def test_training_code_reads_back_what_the_job_was_given() -> None:
    spec = with_handoff(SPEC, HANDOFF)
    environ = {name: value.value for name, value in (spec.env or {}).items() if value.value}
    assert read_handoff(environ) == Handoff(
        tracking_uri="http://mlflow.ml:5000",
        experiment_id="7",
        experiment_name="mnist",
        run_id="0a1b",
    )
    assert read_handoff({}) is None
    assert {RUN_ID_ENV, TRACKING_URI_ENV, MODEL_DIR_ENV} <= HANDOFF_ENV_NAMES


@pytest.mark.parametrize(
    ("environ", "zero"),
    [
        ({}, True),
        ({"RANK": "0"}, True),
        ({"RANK": "3"}, False),
        ({"OMPI_COMM_WORLD_RANK": "1"}, False),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"chief": ["a"], "worker": ["b"]},
                        "task": {"type": "chief", "index": 0},
                    }
                )
            },
            True,
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"chief": ["a"], "worker": ["b"]},
                        "task": {"type": "worker", "index": 0},
                    }
                )
            },
            False,
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 0}}
                )
            },
            True,
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"ps": ["p"], "worker": ["a"]}, "task": {"type": "ps", "index": 0}}
                )
            },
            False,
        ),
    ],
)
def test_rank_zero_is_found_for_each_framework(environ: dict[str, str], zero: bool) -> None:
    assert is_rank_zero(environ) is zero
