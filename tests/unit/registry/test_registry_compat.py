from __future__ import annotations

import pytest

from kubedl_prefect.errors import IncompatibleModelError, RegistryError
from kubedl_prefect.registry.compat import (
    KSERVE_MLSERVER,
    ModelFacts,
    RuntimeProfile,
    Severity,
    check,
    refuse_incompatible,
)

# What mlflow.sklearn.log_model wrote here (MLflow 3.17.2, scikit-learn 1.9.1), abridged.
SKLEARN_SKOPS = """
artifact_path: mlflow-artifacts:/3/models/m-f281/artifacts
flavors:
  python_function:
    env: {conda: conda.yaml, virtualenv: python_env.yaml}
    loader_module: mlflow.sklearn
    model_path: model.skops
    predict_fn: predict
    python_version: 3.11.7
  sklearn:
    code: null
    pickled_model: model.skops
    serialization_format: skops
    sklearn_version: 1.9.1
mlflow_version: 3.17.2
model_id: m-f281
"""


def sklearn_model(fmt: str, *, python: str = "3.10.12", sklearn: str = "1.5.2") -> str:
    return (
        SKLEARN_SKOPS.replace("serialization_format: skops", f"serialization_format: {fmt}")
        .replace("python_version: 3.11.7", f"python_version: {python}")
        .replace("sklearn_version: 1.9.1", f"sklearn_version: {sklearn}")
    )


def assert_safe_format_first(fix: str) -> None:
    """A fix names a format that runs no code on load before pickle, and says what pickle does."""
    assert "ONNX" in fix
    assert "runs no code on load" in fix
    assert fix.index("ONNX") < fix.index("serialization_format='pickle'")
    assert "only for a model whose training you trust" in fix
    assert "runs code" in fix[fix.index("serialization_format='pickle'") :]


def test_facts_are_read_from_the_mlmodel() -> None:
    facts = ModelFacts.from_mlmodel(SKLEARN_SKOPS)
    assert set(facts.flavors) == {"python_function", "sklearn"}
    assert facts.flavors["sklearn"].serialization_format == "skops"
    assert facts.flavors["sklearn"].library_version == "1.9.1"
    assert (facts.mlflow_version, facts.python_version, facts.model_id) == (
        "3.17.2",
        "3.11.7",
        "m-f281",
    )


def test_pytorch_format_is_read_from_its_files() -> None:
    text = """
flavors:
  python_function: {loader_module: mlflow.pytorch, python_version: 3.10.12}
  pytorch: {model_data: data, pytorch_version: 2.4.1}
mlflow_version: 3.17.2
"""
    exported = ModelFacts.from_mlmodel(text, files=["data/model.pt2"])
    pickled = ModelFacts.from_mlmodel(text, files=["data/model.pth", "data/pickle_module_info.txt"])
    assert exported.flavors["pytorch"].serialization_format == "pt2"
    assert pickled.flavors["pytorch"].serialization_format == "pickle"
    (error,) = [issue for issue in check(exported, KSERVE_MLSERVER) if issue.error]
    assert "'pt2'" in error.problem
    assert_safe_format_first(error.fix)
    assert "MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false" in error.fix
    assert not [issue for issue in check(pickled, KSERVE_MLSERVER) if issue.error]


def test_skops_is_refused_by_the_stock_mlserver_runtime_with_the_fix() -> None:
    with pytest.raises(IncompatibleModelError) as caught:
        refuse_incompatible(
            "models:/fraud/3", ModelFacts.from_mlmodel(SKLEARN_SKOPS), KSERVE_MLSERVER
        )
    error = caught.value
    assert error.runtime == "kserve-mlserver"
    assert "serialised as 'skops'" in str(error)
    assert_safe_format_first(error.hint or "")
    assert len(error.problems) == 1


def test_a_pinned_format_in_the_runtimes_versions_passes_without_warnings() -> None:
    facts = ModelFacts.from_mlmodel(sklearn_model("pickle"))
    issues = refuse_incompatible("m", facts, KSERVE_MLSERVER)
    # Only the MLflow major version differs (3 against the image's 2).
    assert [issue.severity for issue in issues] == [Severity.WARNING]
    assert "MLflow 3.17.2" in issues[0].problem


def test_newer_libraries_and_other_pythons_are_warnings() -> None:
    facts = ModelFacts.from_mlmodel(sklearn_model("pickle", python="3.12.1", sklearn="1.9.1"))
    problems = [issue.problem for issue in check(facts, KSERVE_MLSERVER)]
    assert not [issue for issue in check(facts, KSERVE_MLSERVER) if issue.error]
    assert any("sklearn 1.9.1" in p and "has 1.5.2" in p for p in problems)
    assert any("Python 3.12.1" in p for p in problems)
    cloud = ModelFacts.from_mlmodel(sklearn_model("cloudpickle", python="3.11.7"))
    (warning,) = [i for i in check(cloud, KSERVE_MLSERVER) if "cloudpickled" in i.problem]
    assert "under Python 3.11.7" in warning.problem
    assert "runs code when the server loads it" in warning.fix


def test_a_model_without_pyfunc_cannot_be_served_by_an_mlflow_runtime() -> None:
    facts = ModelFacts.from_mlmodel("flavors:\n  onnx: {onnx_version: 1.15}\nmlflow_version: 3.1\n")
    (error,) = [issue for issue in check(facts, KSERVE_MLSERVER) if issue.error]
    assert "no python_function flavor" in error.problem
    other = RuntimeProfile("onnx-rt", "onnx", "3.17.2", "3.11", {})
    assert not [issue for issue in check(facts, other) if issue.error]


def test_text_that_is_no_mlmodel_is_an_error() -> None:
    with pytest.raises(RegistryError, match="no flavors"):
        ModelFacts.from_mlmodel("just: text\n")
    with pytest.raises(RegistryError, match="not YAML"):
        ModelFacts.from_mlmodel("flavors: [\n")
