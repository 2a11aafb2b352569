"""Building blocks of the spec models: the base model, the error helper, constrained scalars.

The constrained scalars are ``Annotated`` types that check a value the way the API server would
(DNS labels and subdomains, qualified names, label values, quantities, 32-bit integers...), so
that a bad value is refused with its field path before anything reaches a cluster. Each check
raises :func:`spec_error`, which :mod:`kubedl_prefect.spec.validation` turns into a
:class:`~kubedl_prefect.errors.SpecIssue` carrying the problem and the fix.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, core_schema

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue

from kubedl_prefect.spec.naming import DNS1035_PATTERN
from kubedl_prefect.spec.quantity import is_quantity, parse_quantity
from kubedl_prefect.spec.reader import source_text

INT32_MAX: Final = 2**31 - 1
"""The largest value of a Kubernetes ``int32`` field."""


def spec_error(problem: str, fix: str) -> PydanticCustomError:
    """A pydantic error carrying our problem text and fix, for the SpecError translation."""
    return PydanticCustomError("spec_field", "{problem}", {"problem": problem, "fix": fix})


# --- constrained scalars -------------------------------------------------------------------

_QUALIFIED_NAME: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
_DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_ENV_NAME: Final = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_CONFIG_KEY: Final = re.compile(r"^[-._a-zA-Z0-9]{1,253}\Z")
_POD_FIELD: Final = re.compile(
    r"^(metadata\.(name|namespace|uid|labels\['[^']+'\]|annotations\['[^']+'\])"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))\Z"
)


def _check_dns1035(value: str) -> str:
    if not DNS1035_PATTERN.match(value):
        raise spec_error(
            f"{value!r} is not a DNS-1035 label",
            "use lower-case letters, digits and '-', start with a letter and end with a letter "
            "or digit",
        )
    return value


def _check_dns1123_label(value: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise spec_error(
            f"{value!r} is not a DNS-1123 label",
            "use at most 63 lower-case letters, digits and '-', starting and ending with a "
            "letter or digit",
        )
    return value


def _check_dns1123_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise spec_error(
            f"{value!r} is not a valid object name (DNS-1123 subdomain)",
            "use lower-case letters, digits, '-' and '.', starting and ending with a letter "
            "or digit",
        )
    return value


def _check_qualified_name(value: str) -> str:
    prefix, slash, name = value.rpartition("/")
    prefix_ok = not slash or (len(prefix) <= 253 and _DNS1123_SUBDOMAIN.match(prefix) is not None)
    if not (prefix_ok and len(name) <= 63 and _QUALIFIED_NAME.match(name)):
        raise spec_error(
            f"{value!r} is not a valid key",
            "use an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or "
            "'.', starting and ending with a letter or digit (e.g. example.com/team)",
        )
    return value


def _check_label_value(value: str) -> str:
    if value and (len(value) > 63 or not _QUALIFIED_NAME.match(value)):
        raise spec_error(
            f"{value!r} is not a valid label value",
            "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
            "or digit (or an empty string)",
        )
    return value


def _check_env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise spec_error(
            f"{value!r} is not a valid environment variable name",
            "use letters, digits, '_', '-' and '.', not starting with a digit",
        )
    return value


def _check_config_key(value: str) -> str:
    if not _CONFIG_KEY.match(value):
        raise spec_error(
            f"{value!r} is not a valid Secret or ConfigMap key",
            "use letters, digits, '-', '_' and '.'",
        )
    return value


def _check_pod_field(value: str) -> str:
    if not _POD_FIELD.match(value):
        raise spec_error(
            f"{value!r} is not a pod field the API server can expose",
            "use metadata.name, metadata.namespace, metadata.uid, metadata.labels['KEY'], "
            "metadata.annotations['KEY'], spec.nodeName, spec.serviceAccountName, status.hostIP "
            "or status.podIP",
        )
    return value


def _check_sub_path(value: str) -> str:
    if value.startswith("/") or ".." in value.split("/"):
        raise spec_error(
            f"sub-path {value!r} must be relative and stay inside the volume",
            "use a relative path without '..'",
        )
    return value


def _check_absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise spec_error(f"{value!r} is not an absolute path", "start the path with '/'")
    return value


def _number_to_text(value: Any) -> Any:
    # YAML turns `cpu: 4` and `cpu: 0.5` into numbers; quantities are strings in Kubernetes. A
    # number read from YAML keeps the text it was written as.
    if isinstance(value, bool):
        raise spec_error(
            f"{str(value).lower()} is a boolean, not a quantity",
            "write a quantity such as 4, 500m or 16Gi",
        )
    if isinstance(value, int | float):
        return source_text(value)
    return value


def _check_quantity(value: str) -> str:
    if not is_quantity(value):
        raise spec_error(
            f"{value!r} is not a Kubernetes quantity",
            "write a number with an optional suffix, e.g. 500m, 4, 16Gi, 1e9",
        )
    try:
        amount = parse_quantity(value)
    except ValueError:
        raise spec_error(f"{value!r} is out of range", "use a smaller quantity") from None
    if amount < 0:
        raise spec_error(f"{value!r} is negative", "use a quantity of zero or more")
    return value


DNS1035Name = Annotated[str, AfterValidator(_check_dns1035)]
"""A DNS-1035 label (job names): lower-case letters, digits and ``-``, starting with a letter."""
DNS1123Label = Annotated[str, AfterValidator(_check_dns1123_label)]
"""A DNS-1123 label of at most 63 characters (volume names)."""
ObjectName = Annotated[str, AfterValidator(_check_dns1123_subdomain)]
"""A Kubernetes object name (DNS-1123 subdomain): Secrets, ConfigMaps, PVCs, classes."""
QualifiedName = Annotated[str, AfterValidator(_check_qualified_name)]
"""A label, annotation or resource key, with an optional DNS prefix (``example.com/team``)."""
LabelValue = Annotated[str, AfterValidator(_check_label_value)]
"""A label value: at most 63 characters, or empty."""
EnvName = Annotated[str, AfterValidator(_check_env_name)]
"""An environment variable name."""
AbsolutePath = Annotated[str, AfterValidator(_check_absolute_path)]
"""An absolute path (mount paths, node paths)."""
Quantity = Annotated[str, BeforeValidator(_number_to_text), AfterValidator(_check_quantity)]
"""A non-negative Kubernetes quantity (``500m``, ``16Gi``); YAML numbers become strings."""
NonEmptyStr = Annotated[str, Field(min_length=1)]
"""A string of at least one character."""
ConfigKey = Annotated[str, AfterValidator(_check_config_key)]
"""A key of a Secret or ConfigMap."""
PodFieldPath = Annotated[str, AfterValidator(_check_pod_field)]
"""A pod field the downward API can expose (``metadata.name``, ``status.podIP``...)."""
SubPath = Annotated[str, AfterValidator(_check_sub_path)]
"""A relative path inside a volume, without ``..``."""
StrictInt = Annotated[int, Strict()]
"""A whole number, strictly: booleans (YAML ``true``), floats (``2.0``) and strings are refused."""
StrictBool = Annotated[bool, Strict()]
"""``true`` or ``false``, strictly: numbers and strings (``"yes"``) are refused."""
Int32 = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
"""A non-negative ``int32`` (strict: no booleans, floats or strings)."""
PositiveInt32 = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
"""A positive ``int32`` (strict)."""
PortNumber = Annotated[int, Strict(), Field(ge=1, le=65535)]
"""A TCP/UDP port, 1 to 65535 (strict)."""


# --- base model ------------------------------------------------------------------------------


class SpecModel(BaseModel):
    """Base of every spec model: frozen, strict about unknown fields, camelCase in YAML.

    A :class:`pydantic.ValidationError` of a spec model does not print the input: it may be a
    secret (an environment value), or a shared-reference structure whose text has no end.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_enum_values=False,
        # Built on first use, not at import: validating a spec builds the one validator of
        # TrainingJobSpec instead of one per nested model (kubedl-prefect validate starts ~30 ms
        # sooner; bench/cli_startup.py).
        defer_build=True,
    )


class LazyModel:
    """A field type validated by a spec model that is imported and built when a value comes.

    ``Annotated[Any, LazyModel("kubedl_prefect.spec.affinity", "Affinity")]`` validates a value
    as ``Affinity.model_validate`` would, with the same problems at the same field paths (pydantic
    puts a nested model's errors under the field's location), and serializes it as that model;
    the model's module is imported, and its validator built, the first time a value that is not
    ``None`` is validated. A spec that never holds one pays for neither (models for settings few
    specs use: :mod:`kubedl_prefect.spec.kube_types` says which).
    """

    __slots__ = ("_model", "module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        self._model: type[BaseModel] | None = None

    def model(self) -> type[BaseModel]:
        """The model, imported on first use."""
        if self._model is None:
            model = getattr(importlib.import_module(self.module), self.name)
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise TypeError(f"{self.module}.{self.name} is not a pydantic model")
            self._model = model
        return self._model

    def validate(self, value: Any) -> BaseModel:
        """``value`` validated by the model (an instance of it is taken as it is)."""
        return self.model().model_validate(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.validate)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(self.model().__pydantic_core_schema__)
