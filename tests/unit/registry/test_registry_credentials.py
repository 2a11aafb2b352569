"""No registry URI carries credentials, and no URL in an error shows any."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException

from kubedl_prefect.errors import KubeDLPrefectError, RegistryError
from kubedl_prefect.registry.mlflow_registry import ModelRegistry, registry_error

PASSWORD = "s3cr3t-mlflow-password"


@pytest.mark.parametrize(
    ("uri", "fields"),
    [
        (f"https://ci:{PASSWORD}@mlflow.example", {}),
        ("https://mlflow.example", {"registry_uri": f"https://ci:{PASSWORD}@registry.example"}),
        ("https://mlflow.example", {"pod_tracking_uri": f"http://ci:{PASSWORD}@mlflow.ml.svc"}),
    ],
)
def test_a_uri_with_user_info_is_refused_with_the_way_to_pass_credentials(
    uri: str, fields: dict[str, str]
) -> None:
    with pytest.raises(RegistryError, match="holds user info") as caught:
        ModelRegistry(uri, **fields)
    assert PASSWORD not in str(caught.value)
    assert "MLFLOW_TRACKING_USERNAME" in (caught.value.hint or "")
    assert not caught.value.retryable


def test_an_mlflow_error_quoting_a_url_with_credentials_is_redacted() -> None:
    error = MlflowException(
        f"API request to https://ci:{PASSWORD}@mlflow.example/api/2.0/mlflow/runs/get failed",
        error_code="TEMPORARILY_UNAVAILABLE",
    )
    translated = registry_error(error, "get run")
    assert PASSWORD not in str(translated)
    assert "https://***@mlflow.example/api/2.0/mlflow/runs/get" in str(translated)
    assert translated.retryable


def test_no_error_of_the_tree_shows_the_credentials_of_a_url() -> None:
    error = KubeDLPrefectError(
        f"cannot reach 'http://admin:{PASSWORD}@[::1]:8080/x' or s3://k:{PASSWORD}@bucket/m",
        hint=f"check https://u:{PASSWORD}@h/",
    )
    for shown in (str(error), repr(error), error.message, error.hint or "", str(error.args)):
        assert PASSWORD not in shown
    assert "'http://***@[::1]:8080/x'" in error.message
    assert "s3://***@bucket/m" in error.message
    assert error.hint == "check https://***@h/"
