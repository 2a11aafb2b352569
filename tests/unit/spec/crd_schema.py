"""Offline, strict validation of a manifest against a CRD's ``openAPIV3Schema``.

The CRDs come from the pinned operator modules in the Go module cache (upstream.py), never from
this repository. The Kubernetes structural schema is turned into a JSON Schema that
``jsonschema`` checks, with the Kubernetes extensions handled:

- ``x-kubernetes-int-or-string``: an integer or a string;
- ``format: int32`` / ``int64``: the integer's range;
- ``x-kubernetes-list-type: map`` / ``set``: unique keys / items;
- ``x-kubernetes-preserve-unknown-fields``: anything goes below.

It is STRICTER than the API server on purpose: where the schema lists ``properties`` (or is an
object without properties) and does not preserve unknown fields, an unknown key is an error.
The API server would prune it silently, which is exactly how a misplaced field (``runPolicy``
where the operator expects the fields inline) goes unnoticed.

Usage::

    checker = CRDSchema.for_kind(Dialect.KUBEDL, Framework.PYTORCH)
    assert checker.errors(manifest) == []
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from kubedl_prefect.spec import Dialect, Framework, job_resource
from kubedl_prefect.testbed.upstream import KUBEDL, KUBEFLOW_TRAINING, GoModule, module_file

TRAINER = GoModule("github.com/kubeflow/trainer/v2", "v2.3.0")
"""Kubeflow Trainer v2, whose TrainJob CRD the ``trainer`` dialect renders for."""

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_COPIED = (
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "uniqueItems",
)

# ObjectMeta is not in the CRD schema (the API server validates it itself): what we render.
_OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 63, "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def crd_path(dialect: Dialect | str, framework: Framework | str) -> Path:
    """The CRD file of ``framework``'s kind for ``dialect``, in the Go module cache."""
    dialect = Dialect(dialect)
    resource = job_resource(dialect, framework)
    if dialect is Dialect.KUBEDL:
        return module_file(KUBEDL, f"config/crd/bases/{resource.group}_{resource.plural}.yaml")
    if dialect is Dialect.TRAINER:
        return module_file(TRAINER, f"manifests/base/crds/{resource.group}_{resource.plural}.yaml")
    return module_file(
        KUBEFLOW_TRAINING, f"manifests/base/crds/{resource.group}_{resource.plural}.yaml"
    )


def _list_map_keys(
    validator: Any, keys: list[str], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not isinstance(instance, list):
        return
    seen: set[tuple[Any, ...]] = set()
    for item in instance:
        if not isinstance(item, dict):
            continue
        key = tuple(item.get(k) for k in keys)
        if key in seen:
            yield ValidationError(f"duplicate entry for list-map keys {keys}: {key}")
        seen.add(key)


_Validator = validators.extend(Draft202012Validator, {"x-list-map-keys": _list_map_keys})


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Translate one Kubernetes structural-schema node (recursively) into strict JSON Schema."""
    out: dict[str, Any] = {}
    preserve = bool(node.get("x-kubernetes-preserve-unknown-fields"))
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    elif "type" in node:
        out["type"] = node["type"]
        if node.get("nullable"):
            out["type"] = [node["type"], "null"]
    for keyword in _COPIED:
        if keyword in node:
            out[keyword] = node[keyword]
    if node.get("type") == "integer" and node.get("format") in _INT_RANGES:
        low, high = _INT_RANGES[node["format"]]
        out["minimum"] = max(low, out.get("minimum", low))
        out["maximum"] = min(high, out.get("maximum", high))
    for combinator in ("anyOf", "allOf", "oneOf"):
        if combinator in node and not node.get("x-kubernetes-int-or-string"):
            out[combinator] = [to_json_schema(sub) for sub in node[combinator]]
    if "not" in node:
        out["not"] = to_json_schema(node["not"])
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
    if "additionalProperties" in node:
        extra = node["additionalProperties"]
        out["additionalProperties"] = to_json_schema(extra) if isinstance(extra, dict) else extra
    elif node.get("type") == "object" and not preserve:
        out["additionalProperties"] = False  # the strictness: unknown keys would be pruned
    if "items" in node:
        out["items"] = to_json_schema(node["items"])
    if node.get("x-kubernetes-list-type") == "map":
        out["x-list-map-keys"] = node.get("x-kubernetes-list-map-keys", [])
    elif node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


class CRDSchema:
    """A strict validator for manifests of one kind in one dialect."""

    def __init__(self, crd: dict[str, Any], api_version: str, kind: str) -> None:
        versions = [v for v in crd["spec"]["versions"] if v.get("served")]
        wanted = api_version.rpartition("/")[2]
        (version,) = [v for v in versions if v["name"] == wanted]
        schema = to_json_schema(version["schema"]["openAPIV3Schema"])
        schema["properties"]["metadata"] = _OBJECT_META
        schema["properties"]["apiVersion"] = {"const": api_version}
        schema["properties"]["kind"] = {"const": kind}
        schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "spec"})
        schema["properties"].pop("status", None)
        _Validator.check_schema(schema)
        self.structural = version["schema"]["openAPIV3Schema"]
        self.schema = schema
        self._validator = _Validator(schema)

    @classmethod
    def for_kind(cls, dialect: Dialect | str, framework: Framework | str) -> CRDSchema:
        """The checker for ``framework``'s kind in ``dialect`` (CRD loaded once per process).

        Names are made members first: ``"kubedl"`` equals ``Dialect.KUBEDL`` as a cache key but
        is not it, so a first call with the plain name used to look in the wrong module.
        """
        return _cached(Dialect(dialect), Framework(framework))

    def errors(self, manifest: dict[str, Any]) -> list[str]:
        """Every schema violation, as ``path: message`` lines (empty when the manifest passes)."""
        found = sorted(self._validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
        return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in found]


def defaulted(checker: CRDSchema, manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with the CRD's ``default`` values filled in, as the API server does."""
    data = copy.deepcopy(manifest)
    _fill(checker.structural, data)
    return data


def _fill(node: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for key, sub in (node.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _fill(sub, value[key])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in (node.get("properties") or {}):
                    _fill(extra, value[key])
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for item in value:
            _fill(node["items"], item)


@cache
def _cached(dialect: Dialect, framework: Framework) -> CRDSchema:
    path = crd_path(dialect, framework)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as handle:
        crd = yaml.load(handle, Loader=loader)
    resource = job_resource(dialect, framework)
    return CRDSchema(crd, resource.api_version, resource.kind)
