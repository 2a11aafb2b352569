"""Can the serving runtime load this model version? A check before anything is deployed. Pure.

A model version fails to load in KServe for reasons the registry already knows: its ``MLmodel``
says which flavors it has, the MLflow and Python versions that saved it, and how each flavor
serialised the model. Since MLflow 3.14 the defaults changed (scikit-learn saves as ``skops``,
PyTorch as ``pt2`` through ``torch.export``); a runtime built on an older MLflow cannot read
these. :func:`check` compares :class:`ModelFacts` (read from the ``MLmodel``) with a
:class:`RuntimeProfile` (what the runtime's image holds) and returns every problem with the
change that fixes it; errors refuse the deployment, warnings are reported.

A fix names a format that runs no code on load first (ONNX; PyTorch's ``pt2`` with a server
that refuses pickled records) and pickle last, for trusted models only: a pickled model runs
code in the server that loads it, so a registered version is code to its server.

:data:`KSERVE_MLSERVER` describes KServe's stock ``kserve-mlserver`` runtime (KServe v0.20:
``seldonio/mlserver:1.7.1``, whose image pins MLflow 2.19.0, Python 3.10, scikit-learn 1.5.2 and
torch 2.4.1, read from MLServer 1.7.1's ``Dockerfile`` and ``poetry.lock``).

Example:
    >>> facts = ModelFacts.from_mlmodel('''
    ... mlflow_version: 3.17.2
    ... flavors:
    ...   python_function: {loader_module: mlflow.sklearn, python_version: 3.10.12}
    ...   sklearn: {serialization_format: skops, sklearn_version: 1.5.2}
    ... ''')
    >>> [issue.problem for issue in check(facts, KSERVE_MLSERVER) if issue.error]
    ["the sklearn flavor was serialised as 'skops', which kserve-mlserver (MLflow 2.19.0) cannot \
load"]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

import yaml

from kubedl_prefect.errors import IncompatibleModelError, RegistryError

PYFUNC: Final = "python_function"
"""The flavor MLflow-model servers load through (``mlflow.pyfunc``)."""


class Severity(StrEnum):
    """How bad a compatibility problem is."""

    ERROR = "error"
    """The runtime cannot load the model: the deployment is refused."""
    WARNING = "warning"
    """It may load, or fail in ways only a real load tells: reported, not refused."""


@dataclass(frozen=True)
class CompatibilityIssue:
    """One reason a runtime may not load a model, and the change that fixes it."""

    severity: Severity
    problem: str
    fix: str

    @property
    def error(self) -> bool:
        """Whether it refuses the deployment."""
        return self.severity is Severity.ERROR

    def __str__(self) -> str:
        return f"{self.severity}: {self.problem} (fix: {self.fix})"


@dataclass(frozen=True)
class FlavorFacts:
    """One flavor of a logged model.

    Attributes:
        name: ``sklearn``, ``pytorch``, ``python_function``...
        serialization_format: How the model was serialised, when the flavor says (or its files
            show: ``model.pt2`` is ``pt2``).
        library_version: The version of the flavor's library that saved it.
        conf: The flavor's whole ``MLmodel`` entry.
    """

    name: str
    serialization_format: str | None = None
    library_version: str | None = None
    conf: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


_LIBRARY_VERSION_KEYS: Final = {
    "sklearn": "sklearn_version",
    "pytorch": "pytorch_version",
    "xgboost": "xgb_version",
    "lightgbm": "lgb_version",
    "tensorflow": "keras_version",
}


@dataclass(frozen=True)
class ModelFacts:
    """What a logged model's ``MLmodel`` says about how to load it.

    Attributes:
        flavors: The flavors, by name.
        mlflow_version: The MLflow version that saved it.
        python_version: The Python version that saved it (from the pyfunc flavor).
        model_id: The logged model's id (``m-<id>``), when recorded.
    """

    flavors: Mapping[str, FlavorFacts]
    mlflow_version: str | None = None
    python_version: str | None = None
    model_id: str | None = None

    @classmethod
    def from_mlmodel(cls, text: str, *, files: Iterable[str] = ()) -> ModelFacts:
        """Read an ``MLmodel`` file; ``files`` are the model's file paths (for PyTorch's format).

        Raises:
            RegistryError: The text is not an ``MLmodel`` (no ``flavors`` mapping).
        """
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RegistryError(f"the model's MLmodel file is not YAML: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("flavors"), dict):
            raise RegistryError(
                "the model's MLmodel file has no flavors",
                hint="log the model with an MLflow flavor (mlflow.<flavor>.log_model)",
            )
        names = set(files)
        flavors: dict[str, FlavorFacts] = {}
        for name, conf in data["flavors"].items():
            conf = conf if isinstance(conf, dict) else {}
            fmt = conf.get("serialization_format")
            if fmt is None and name == "pytorch":
                model_data = str(conf.get("model_data") or "data")
                fmt = "pt2" if f"{model_data}/model.pt2" in names else None
                if fmt is None and f"{model_data}/model.pth" in names:
                    fmt = "pickle"
            version_key = _LIBRARY_VERSION_KEYS.get(str(name))
            flavors[str(name)] = FlavorFacts(
                name=str(name),
                serialization_format=str(fmt) if fmt is not None else None,
                library_version=str(conf[version_key]) if version_key in conf else None,
                conf=MappingProxyType(dict(conf)),
            )
        pyfunc = flavors.get(PYFUNC)
        python_version = pyfunc.conf.get("python_version") if pyfunc else None
        return cls(
            flavors=MappingProxyType(flavors),
            mlflow_version=_text(data.get("mlflow_version")),
            python_version=_text(python_version),
            model_id=_text(data.get("model_id")),
        )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class RuntimeProfile:
    """What a serving runtime's image can load.

    Args:
        name: The runtime (the ``ClusterServingRuntime`` name, ``kserve-mlserver``).
        model_format: The KServe model format served (``mlflow``).
        mlflow_version: The MLflow inside the image.
        python_version: Its Python (``major.minor``).
        serialization_formats: Per flavor, the formats its MLflow can load.
        libraries: Versions of the flavors' libraries in the image, by flavor name.
        protocols: The inference protocols it speaks.
    """

    name: str
    model_format: str
    mlflow_version: str
    python_version: str
    serialization_formats: Mapping[str, frozenset[str]]
    libraries: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    protocols: frozenset[str] = frozenset({"v2"})


KSERVE_MLSERVER: Final = RuntimeProfile(
    name="kserve-mlserver",
    model_format="mlflow",
    mlflow_version="2.19.0",
    python_version="3.10",
    serialization_formats=MappingProxyType(
        {
            "sklearn": frozenset({"pickle", "cloudpickle"}),
            "pytorch": frozenset({"pickle"}),
        }
    ),
    libraries=MappingProxyType({"sklearn": "1.5.2", "pytorch": "2.4.1"}),
    protocols=frozenset({"v2"}),
)
"""KServe v0.20's stock ``kserve-mlserver`` runtime (``seldonio/mlserver:1.7.1``)."""

_PICKLE_CAVEAT: Final = (
    "only for a model whose training you trust, log it with {call}(..., "
    "serialization_format='pickle'), which this runtime loads, but pickle runs code when the "
    "server loads it"
)

_FORMAT_FIXES: Final = {
    "sklearn": (
        "prefer a format that runs no code on load: convert it to ONNX (skl2onnx, then "
        "mlflow.onnx.log_model) and serve it with an ONNX runtime (model_format onnx); or use a "
        "runtime image built on the MLflow that logged it (skops: safer than pickle, though its "
        "trusted types come from the model itself); "
        + _PICKLE_CAVEAT.format(call="mlflow.sklearn.log_model")
    ),
    "pytorch": (
        "prefer a format that runs no code on load: export it to ONNX (torch.onnx.export, then "
        "mlflow.onnx.log_model) and serve it with an ONNX runtime (model_format onnx), or keep "
        "'pt2' and serve it with a runtime image on MLflow 3.14+ and torch 2.10+ that sets "
        "MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false (MLflow then refuses an archive that holds "
        "pickled records); " + _PICKLE_CAVEAT.format(call="mlflow.pytorch.log_model")
    ),
}
"""What to do about a flavor's format the runtime cannot load: safe formats first."""


def _version_tuple(text: str | None) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in (text or "").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check(facts: ModelFacts, runtime: RuntimeProfile) -> list[CompatibilityIssue]:
    """Every reason ``runtime`` may not load the model ``facts`` describe (empty: none)."""
    issues: list[CompatibilityIssue] = []
    where = f"{runtime.name} (MLflow {runtime.mlflow_version})"
    if runtime.model_format == "mlflow" and PYFUNC not in facts.flavors:
        issues.append(
            CompatibilityIssue(
                Severity.ERROR,
                f"the model has no {PYFUNC} flavor (it has "
                f"{', '.join(sorted(facts.flavors)) or 'none'}), and {runtime.name} loads MLflow "
                "models through mlflow.pyfunc",
                "log it with a flavor that adds python_function (mlflow.sklearn, mlflow.pytorch, "
                "mlflow.pyfunc...), or serve it with a runtime for its own format",
            )
        )
    for name, flavor in sorted(facts.flavors.items()):
        known = runtime.serialization_formats.get(name)
        if known is None or flavor.serialization_format is None:
            continue
        if flavor.serialization_format not in known:
            issues.append(
                CompatibilityIssue(
                    Severity.ERROR,
                    f"the {name} flavor was serialised as {flavor.serialization_format!r}, which "
                    f"{where} cannot load",
                    _FORMAT_FIXES.get(
                        name,
                        "pin a format the runtime knows, or use a runtime image built on the "
                        "MLflow that logged it",
                    ),
                )
            )
        elif flavor.serialization_format == "cloudpickle" and _minor(facts.python_version) != (
            _minor(runtime.python_version)
        ):
            issues.append(
                CompatibilityIssue(
                    Severity.WARNING,
                    f"the {name} flavor was cloudpickled under Python {facts.python_version}, "
                    f"and {runtime.name} runs Python {runtime.python_version}: cloudpickle is "
                    "only guaranteed to load under the Python version that wrote it",
                    f"train with Python {runtime.python_version}, or log with "
                    "serialization_format='pickle' (which, like cloudpickle, runs code when the "
                    "server loads it)",
                )
            )
        image_version = runtime.libraries.get(name)
        if (
            image_version is not None
            and flavor.library_version is not None
            and _version_tuple(flavor.library_version)[:2] > _version_tuple(image_version)[:2]
        ):
            issues.append(
                CompatibilityIssue(
                    Severity.WARNING,
                    f"the {name} flavor was saved by {name} {flavor.library_version}; "
                    f"{runtime.name} has {image_version}, which may not read it",
                    f"train with {name} {image_version}, or serve with an image that has "
                    f"{flavor.library_version}",
                )
            )
    model_major = _version_tuple(facts.mlflow_version)[:1]
    if model_major and model_major > _version_tuple(runtime.mlflow_version)[:1]:
        issues.append(
            CompatibilityIssue(
                Severity.WARNING,
                f"the model was logged by MLflow {facts.mlflow_version}, {runtime.name} runs "
                f"MLflow {runtime.mlflow_version}",
                "pin formats the older MLflow knows (checked above), or use a runtime image "
                "built on the same MLflow major version",
            )
        )
    if (
        facts.python_version
        and _minor(facts.python_version) != _minor(runtime.python_version)
        and not any("cloudpickled" in issue.problem for issue in issues)
    ):
        issues.append(
            CompatibilityIssue(
                Severity.WARNING,
                f"the model was saved under Python {facts.python_version}, {runtime.name} runs "
                f"Python {runtime.python_version}",
                f"train with Python {runtime.python_version} if loading fails",
            )
        )
    return issues


def _minor(version: str | None) -> tuple[int, ...]:
    return _version_tuple(version)[:2]


def refuse_incompatible(
    model: str, facts: ModelFacts, runtime: RuntimeProfile
) -> list[CompatibilityIssue]:
    """:func:`check`, raising when any problem is an error; returns the warnings otherwise.

    Raises:
        IncompatibleModelError: ``runtime`` cannot load the model; every problem is listed.
    """
    issues = check(facts, runtime)
    errors = [issue for issue in issues if issue.error]
    if errors:
        lines = "\n".join(f"  - {issue.problem}" for issue in errors)
        raise IncompatibleModelError(
            f"{model} cannot be served by {runtime.name}:\n{lines}",
            runtime=runtime.name,
            problems=[str(issue) for issue in errors],
            hint="; ".join(dict.fromkeys(issue.fix for issue in errors)),
        )
    return issues
