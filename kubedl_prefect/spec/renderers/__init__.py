"""Rendering a spec to the custom resource of one operator (dialect).

``render`` is re-exported by :mod:`kubedl_prefect.spec`; the dialect modules hold the facts of
each operator.
"""

from __future__ import annotations

from kubedl_prefect.spec.model import TrainingJobSpec
from kubedl_prefect.spec.renderers.common import Manifest, RenderOptions, deep_merge
from kubedl_prefect.spec.renderers.kubedl import render_kubedl
from kubedl_prefect.spec.renderers.kubeflow import render_kubeflow
from kubedl_prefect.spec.types import Dialect
from kubedl_prefect.spec.validation import as_dialect, validate

__all__ = ["Manifest", "RenderOptions", "deep_merge", "render"]


def render(
    spec: TrainingJobSpec, dialect: Dialect | str, options: RenderOptions | None = None
) -> Manifest:
    """Render ``spec`` to the custom resource the operator of ``dialect`` expects.

    Checks the dialect's own rules first (see :func:`~kubedl_prefect.spec.validate`).

    Args:
        spec: A valid spec.
        dialect: ``kubedl`` (``training.kubedl.io/v1alpha1``) or ``kubeflow`` (``kubeflow.org/v1``).
        options: Job name, namespace, and labels, annotations and env added by the caller.

    Returns:
        One manifest (``apiVersion``, ``kind``, ``metadata``, ``spec``) as plain data.

    Raises:
        SpecError: If the spec does not fit the operator, or an option is invalid.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "mnist", "image": "busybox", "replicas": {"master": 1}})
        >>> render(spec, "kubeflow")["apiVersion"]
        'kubeflow.org/v1'
    """
    chosen = as_dialect(dialect)
    validate(spec, chosen)
    options = options or RenderOptions()
    if chosen is Dialect.KUBEDL:
        return render_kubedl(spec, options)
    return render_kubeflow(spec, options)
