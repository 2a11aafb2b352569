from __future__ import annotations

from typing import Any

import pytest

from kubedl_prefect.errors import ModelSourceRefusedError, RegistryError
from kubedl_prefect.registry.uris import ModelUri, parse_model_uri, storage_uri


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("models:/fraud/3", ModelUri(name="fraud", version="3")),
        ("models:/fraud@champion", ModelUri(name="fraud", alias="champion")),
        ("models:/m-0123abcd", ModelUri(model_id="m-0123abcd")),
        ("models:/team.fraud model/12", ModelUri(name="team.fraud model", version="12")),
    ],
)
def test_registry_uris_parse_and_print_back(uri: str, parsed: ModelUri) -> None:
    assert parse_model_uri(uri) == parsed
    assert str(parsed) == uri


def test_runs_uris_are_refused_with_the_fix() -> None:
    with pytest.raises(ModelSourceRefusedError) as caught:
        parse_model_uri("runs:/0a1b/model")
    assert caught.value.uri == "runs:/0a1b/model"
    assert "models:/m-<id>" in (caught.value.hint or "")
    with pytest.raises(ModelSourceRefusedError, match="runs:/"):
        storage_uri("runs:/0a1b/model")


def test_other_uris_are_not_registry_uris() -> None:
    with pytest.raises(RegistryError, match="models:/<name>/<version>"):
        parse_model_uri("models:/fraud")


def test_proxied_artifacts_map_to_the_artifact_destination() -> None:
    location = "mlflow-artifacts:/3/models/m-ab12/artifacts"
    assert storage_uri(location, artifact_destination="s3://ml/store/") == (
        "s3://ml/store/3/models/m-ab12/artifacts"
    )
    assert (
        storage_uri(
            "mlflow-artifacts://mlflow.ml:5000/3/models/m-ab12/artifacts",
            artifact_destination="gs://ml",
        )
        == "gs://ml/3/models/m-ab12/artifacts"
    )
    with pytest.raises(ModelSourceRefusedError, match="no artifact destination"):
        storage_uri(location)


@pytest.mark.parametrize(
    "location",
    [
        "s3://bucket/3/models/m-1/artifacts",
        "gs://bucket/models/m-1/artifacts",
        "pvc://mlflow-store/3/models/m-1/artifacts",
        "file:///mnt/models/m-1/artifacts",
        "https://acct.blob.core.windows.net/c/m-1",
    ],
)
def test_locations_kserve_reads_pass_through_without_a_trailing_slash(location: str) -> None:
    assert storage_uri(location) == location
    assert storage_uri(location + "/") == location


def test_plain_paths_become_file_uris_and_rewrites_apply_longest_first() -> None:
    assert storage_uri("/srv/mlflow/1/models/m-1/artifacts") == (
        "file:///srv/mlflow/1/models/m-1/artifacts"
    )
    rewrites = {"file:///srv": "pvc://srv", "file:///srv/mlflow": "pvc://mlflow-store"}
    assert storage_uri("/srv/mlflow/1/m", rewrites=rewrites) == "pvc://mlflow-store/1/m"
    assert storage_uri("/srv/other", rewrites=rewrites) == "pvc://srv/other"
    assert storage_uri("/srvx/other", rewrites=rewrites) == "file:///srvx/other"


def test_unknown_schemes_and_unresolved_registry_uris_are_refused() -> None:
    with pytest.raises(ModelSourceRefusedError, match="dbfs"):
        storage_uri("dbfs:/models/m-1")
    with pytest.raises(ModelSourceRefusedError, match="cannot read the MLflow registry"):
        storage_uri("models:/fraud/1")


@pytest.mark.parametrize(
    ("location", "fields"),
    [
        ("https://ci:s3cr3t-pw@store.example/models/m-1", {}),
        ("mlflow-artifacts:/3/m-1", {"artifact_destination": "https://ci:s3cr3t-pw@store/a"}),
        ("file:///srv/m-1", {"rewrites": {"file:///srv": "https://ci:s3cr3t-pw@store"}}),
    ],
)
def test_a_location_with_credentials_is_refused_without_showing_them(
    location: str, fields: dict[str, Any]
) -> None:
    with pytest.raises(ModelSourceRefusedError, match="holds user info") as caught:
        storage_uri(location, **fields)
    assert "s3cr3t-pw" not in f"{caught.value} {caught.value.uri}"
    assert "service_account" in (caught.value.hint or "")
