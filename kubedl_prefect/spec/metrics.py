"""Autoscaling metrics of elastic training (``autoscaling/v2`` ``MetricSpec``).

The metrics the operator's autoscaler scales elastic workers on. Few specs set
``elastic.metrics``: :mod:`kubedl_prefect.spec.kube_types` validates the field with these models
through :class:`~kubedl_prefect.spec.fields.LazyModel`, which imports this module and builds them
the first time a spec holds one.
"""

# No `from __future__ import annotations`: pydantic takes these modules' annotations as they
# are instead of compiling and evaluating each one's text when the classes are made (a start-up
# cost of kubedl-prefect validate); a class named before its definition is written in quotes.

from typing import Final, Literal

from pydantic import Field, model_validator

from kubedl_prefect.spec.affinity import LabelSelector
from kubedl_prefect.spec.fields import (
    DNS1123Label,
    NonEmptyStr,
    PositiveInt32,
    QualifiedName,
    Quantity,
    SpecModel,
    spec_error,
)

__all__ = [
    "ContainerResourceMetric",
    "ExternalMetric",
    "MetricIdentifier",
    "MetricSpec",
    "MetricTarget",
    "ObjectMetric",
    "ObjectReference",
    "PodsMetric",
    "ResourceMetric",
]


_TARGET_FIELDS: Final = ("value", "average_value", "average_utilization")


class MetricTarget(SpecModel):
    """The target value of a metric (``autoscaling/v2`` ``MetricTarget``)."""

    type: Literal["Utilization", "Value", "AverageValue"] = Field(
        description="Utilization (percent of the request), Value or AverageValue."
    )
    value: Quantity | None = Field(default=None, description="For type Value.")
    average_value: Quantity | None = Field(default=None, description="For type AverageValue.")
    average_utilization: PositiveInt32 | None = Field(
        default=None, description="For type Utilization: percent of the requested resource."
    )

    @model_validator(mode="after")
    def _field_fits_type(self) -> "MetricTarget":
        wanted = {
            "Utilization": "average_utilization",
            "Value": "value",
            "AverageValue": "average_value",
        }[self.type]
        given = [n for n in _TARGET_FIELDS if getattr(self, n) is not None]
        if given != [wanted]:
            camel = {
                "average_utilization": "averageUtilization",
                "value": "value",
                "average_value": "averageValue",
            }
            raise spec_error(
                f"a {self.type} target needs {camel[wanted]} and nothing else, got "
                f"{', '.join(camel[n] for n in given) or 'none'}",
                f"give only {camel[wanted]}",
            )
        return self


class MetricIdentifier(SpecModel):
    """A metric by name, optionally narrowed by a label selector."""

    name: NonEmptyStr = Field(description="Metric name.")
    selector: LabelSelector | None = Field(default=None, description="Metric labels.")


class ObjectReference(SpecModel):
    """The object an Object metric describes."""

    api_version: NonEmptyStr | None = Field(default=None, description="e.g. v1.")
    kind: NonEmptyStr = Field(description="e.g. Service.")
    name: NonEmptyStr = Field(description="Its name.")


class ResourceMetric(SpecModel):
    """A resource (cpu, memory) of the pods, averaged."""

    name: QualifiedName = Field(description="Resource name, e.g. cpu.")
    target: MetricTarget = Field(description="The target.")


class ContainerResourceMetric(ResourceMetric):
    """A resource of one container of the pods."""

    container: DNS1123Label = Field(description="Container name.")


class PodsMetric(SpecModel):
    """A custom metric of the pods, averaged."""

    metric: MetricIdentifier = Field(description="The metric.")
    target: MetricTarget = Field(description="The target (AverageValue).")


class ObjectMetric(SpecModel):
    """A metric of another object."""

    described_object: ObjectReference = Field(description="The object.")
    metric: MetricIdentifier = Field(description="The metric.")
    target: MetricTarget = Field(description="The target (Value or AverageValue).")


class ExternalMetric(SpecModel):
    """A metric from outside the cluster."""

    metric: MetricIdentifier = Field(description="The metric.")
    target: MetricTarget = Field(description="The target (Value or AverageValue).")


_METRIC_SOURCES: Final = {
    "Resource": ("resource", ("Utilization", "AverageValue")),
    "ContainerResource": ("container_resource", ("Utilization", "AverageValue")),
    "Pods": ("pods", ("AverageValue",)),
    "Object": ("object_", ("Value", "AverageValue")),
    "External": ("external", ("Value", "AverageValue")),
}


class MetricSpec(SpecModel):
    """One metric the operator's autoscaler scales elastic workers on (``autoscaling/v2``).

    Exactly the member named by ``type`` is given, e.g. ``{type: Resource, resource: {name: cpu,
    target: {type: Utilization, averageUtilization: 80}}}``.
    """

    type: Literal["Resource", "ContainerResource", "Pods", "Object", "External"] = Field(
        description="Which member holds the metric."
    )
    resource: ResourceMetric | None = Field(default=None, description="For type Resource.")
    container_resource: ContainerResourceMetric | None = Field(
        default=None, description="For type ContainerResource."
    )
    pods: PodsMetric | None = Field(default=None, description="For type Pods.")
    object_: ObjectMetric | None = Field(
        default=None, alias="object", description="For type Object."
    )
    external: ExternalMetric | None = Field(default=None, description="For type External.")

    @model_validator(mode="after")
    def _member_fits_type(self) -> "MetricSpec":
        wanted, targets = _METRIC_SOURCES[self.type]
        members = {name for name, _ in _METRIC_SOURCES.values() if getattr(self, name) is not None}
        spelled = {
            "resource": "resource",
            "container_resource": "containerResource",
            "pods": "pods",
            "object_": "object",
            "external": "external",
        }
        if members != {wanted}:
            raise spec_error(
                f"a {self.type} metric needs `{spelled[wanted]}` and no other member, got "
                f"{', '.join(sorted(spelled[m] for m in members)) or 'none'}",
                f"give only {spelled[wanted]}: {{...}}",
            )
        target: MetricTarget = getattr(self, wanted).target
        if target.type not in targets:
            raise spec_error(
                f"a {self.type} metric cannot have a {target.type} target",
                f"use a target of type {' or '.join(targets)}",
            )
        return self
