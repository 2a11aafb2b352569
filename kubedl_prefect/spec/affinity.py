"""Scheduling affinity of the pods, as in a Kubernetes pod: node and pod (anti-)affinity.

The models check what the API server would check, so that an invalid term is refused with its
field path. Few specs set ``affinity``: :mod:`kubedl_prefect.spec.kube_types` validates the field
with these models through :class:`~kubedl_prefect.spec.fields.LazyModel`, which imports this
module and builds them the first time a spec holds one.
"""

# No `from __future__ import annotations`: pydantic takes these modules' annotations as they
# are instead of compiling and evaluating each one's text when the classes are made (a start-up
# cost of kubedl-prefect validate); a class named before its definition is written in quotes.

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from kubedl_prefect.spec.fields import (
    LabelValue,
    NonEmptyStr,
    QualifiedName,
    SpecModel,
    StrictInt,
    spec_error,
)

__all__ = [
    "Affinity",
    "LabelSelector",
    "LabelSelectorRequirement",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PodAffinity",
    "PodAffinityTerm",
    "PreferredSchedulingTerm",
    "WeightedPodAffinityTerm",
]


def _check_operator_values(operator: str, values: list[str] | None) -> None:
    count = len(values or [])
    if operator in {"In", "NotIn"} and count == 0:
        raise spec_error(f"operator {operator} needs values", "add values: [...]")
    if operator in {"Exists", "DoesNotExist"} and count:
        raise spec_error(f"operator {operator} takes no values", "remove values")
    if operator in {"Gt", "Lt"} and (count != 1 or not _is_integer((values or [""])[0])):
        raise spec_error(f"operator {operator} needs exactly one integer value", "e.g. ['3']")


def _is_integer(text: str) -> bool:
    return re.fullmatch(r"-?[0-9]+", text) is not None


class LabelSelectorRequirement(SpecModel):
    """One expression of a label selector."""

    key: QualifiedName = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="Operator.")
    values: list[str] | None = Field(default=None, description="Values, for In and NotIn.")

    @model_validator(mode="after")
    def _values_fit_operator(self) -> "LabelSelectorRequirement":
        _check_operator_values(self.operator, self.values)
        return self


class LabelSelector(SpecModel):
    """A label selector (``matchLabels`` and ``matchExpressions`` are ANDed)."""

    match_labels: dict[QualifiedName, LabelValue] | None = Field(
        default=None, description="Labels that must match exactly."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, description="Expressions that must all hold."
    )


class NodeSelectorRequirement(SpecModel):
    """One expression on node labels or fields."""

    key: NonEmptyStr = Field(description="Label key or field name.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="Operator."
    )
    values: list[str] | None = Field(default=None, description="Values.")

    @model_validator(mode="after")
    def _values_fit_operator(self) -> "NodeSelectorRequirement":
        _check_operator_values(self.operator, self.values)
        return self


class NodeSelectorTerm(SpecModel):
    """Expressions that a node must all satisfy."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, description="On node labels."
    )
    match_fields: list[NodeSelectorRequirement] | None = Field(
        default=None, description="On node fields (metadata.name with In or NotIn)."
    )

    @model_validator(mode="after")
    def _fields_supported(self) -> "NodeSelectorTerm":
        for requirement in self.match_fields or []:
            if (
                requirement.key != "metadata.name"
                or requirement.operator not in {"In", "NotIn"}
                or len(requirement.values or []) != 1
            ):
                raise spec_error(
                    "matchFields supports only key metadata.name with In or NotIn and one value",
                    "match node labels with matchExpressions instead",
                )
        return self


class NodeSelector(SpecModel):
    """Terms of which a node must satisfy at least one."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, description="The terms.")


class PreferredSchedulingTerm(SpecModel):
    """A weighted node preference."""

    weight: Annotated[StrictInt, Field(ge=1, le=100)] = Field(description="Weight, 1 to 100.")
    preference: NodeSelectorTerm = Field(description="The preferred term.")


class NodeAffinity(SpecModel):
    """Node affinity."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Hard requirement."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        Field(default=None, description="Soft preferences.")
    )


class PodAffinityTerm(SpecModel):
    """Pods (by label) that a pod should, or should not, share a topology domain with."""

    label_selector: LabelSelector | None = Field(default=None, description="Which pods.")
    namespaces: list[str] | None = Field(default=None, description="Their namespaces.")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Their namespaces, by label."
    )
    topology_key: QualifiedName = Field(description="Node label defining the domain.")


class WeightedPodAffinityTerm(SpecModel):
    """A weighted pod (anti-)affinity preference."""

    weight: Annotated[StrictInt, Field(ge=1, le=100)] = Field(description="Weight, 1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(SpecModel):
    """Pod affinity or anti-affinity."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, description="Hard requirements."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = (
        Field(default=None, description="Soft preferences.")
    )


class Affinity(SpecModel):
    """Scheduling affinity, as in a Kubernetes pod."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity.")
