"""Rendering a spec to the custom resource of one operator (dialect).

``render`` is re-exported by :mod:`kubedl_prefect.spec`; the dialect modules hold the facts of
each operator. Every rendered manifest is checked before it is returned: each container has an
image, and the whole object fits what the API server stores (:data:`MAX_MANIFEST_BYTES`).

A render imports the module of its own dialect only (``kubedl-prefect render --dialect kubedl``
starts without the Trainer renderer, the largest).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Final

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.checks import dialect_issues
from kubedl_prefect.spec.model import TrainingJobSpec
from kubedl_prefect.spec.renderers.common import Manifest, RenderOptions, deep_merge
from kubedl_prefect.spec.types import FRAMEWORKS, TRAINJOB_KIND, Dialect
from kubedl_prefect.spec.validation import as_dialect

__all__ = [
    "ETCD_REQUEST_LIMIT_BYTES",
    "MAX_MANIFEST_BYTES",
    "Manifest",
    "RenderOptions",
    "deep_merge",
    "manifest_issues",
    "render",
    "render_unchecked",
]

ETCD_REQUEST_LIMIT_BYTES: Final = 1536 * 1024
"""etcd's default request limit (``--max-request-bytes``, 1.5 MiB): the most an object can be."""

MAX_MANIFEST_BYTES: Final = 512 * 1024
"""The largest rendered manifest accepted: 512 KiB of compact JSON, a third of etcd's limit.

The object the API server stores is more than the manifest: ``metadata.managedFields`` records
every field set (about as large again for manifests made of many short fields), ``kubectl apply``
keeps a second copy in the ``last-applied-configuration`` annotation, and the operator adds the
status. A manifest of at most a third of :data:`ETCD_REQUEST_LIMIT_BYTES` stays storable with
all three.
"""


def render(
    spec: TrainingJobSpec, dialect: Dialect | str, options: RenderOptions | None = None
) -> Manifest:
    """Render ``spec`` to the custom resource the operator of ``dialect`` expects.

    Checks the dialect's own rules first (see :func:`~kubedl_prefect.spec.validate`), and the
    rendered manifest itself: every container has an image, and it is at most
    :data:`MAX_MANIFEST_BYTES` of JSON.

    Args:
        spec: A valid spec.
        dialect: ``kubedl`` (``training.kubedl.io/v1alpha1``), ``kubeflow`` (``kubeflow.org/v1``)
            or ``trainer`` (Kubeflow Trainer v2's ``TrainJob``, ``trainer.kubeflow.org/v1alpha1``).
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
    issues = dialect_issues(spec, chosen, options)
    if issues:
        raise SpecError(issues, source=f"{spec.name} (for {chosen.value})")
    manifest = render_unchecked(spec, chosen, options)
    issues = manifest_issues(manifest)
    if issues:
        raise SpecError(issues, source=f"{spec.name} (for {chosen.value})")
    return manifest


def render_unchecked(
    spec: TrainingJobSpec, dialect: Dialect, options: RenderOptions | None = None
) -> Manifest:
    """The manifest of ``spec`` for ``dialect``, without the dialect's and the manifest's checks.

    For callers that check themselves (:func:`~kubedl_prefect.spec.validate`).
    """
    options = options or RenderOptions()
    if dialect is Dialect.KUBEDL:
        from kubedl_prefect.spec.renderers.kubedl import render_kubedl

        return render_kubedl(spec, options)
    if dialect is Dialect.TRAINER:
        from kubedl_prefect.spec.kueue import queued_manifest
        from kubedl_prefect.spec.renderers.trainer import render_trainer

        # Kueue's labels and spec.suspend when spec.kueue names a queue (the Kubeflow renderer
        # applies them itself).
        return queued_manifest(render_trainer(spec, options), spec)
    from kubedl_prefect.spec.renderers.kubeflow import render_kubeflow

    return render_kubeflow(spec, options)


def manifest_issues(manifest: Manifest) -> list[SpecIssue]:
    """What makes a rendered manifest unfit to send: a container without an image, the size.

    Example:
        >>> manifest_issues({"kind": "PyTorchJob", "spec": {"x": "y" * 600_000}})[0].path
        '(manifest)'
    """
    issues = list(_imageless_containers(manifest))
    size = len(json.dumps(manifest, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_MANIFEST_BYTES:
        issues.append(
            SpecIssue(
                "(manifest)",
                f"the rendered {manifest.get('kind', 'job')} is {size / 1024:.0f} KiB of JSON; "
                f"kubedl-prefect sends at most {MAX_MANIFEST_BYTES // 1024} KiB, a third of "
                f"what etcd stores per object ({ETCD_REQUEST_LIMIT_BYTES // 1024} KiB), because "
                "the stored object adds managed fields, the status and, with kubectl apply, a "
                "second copy",
                "make the spec smaller: put scripts and data in a ConfigMap or a volume instead "
                "of command, args, env or podTemplate",
            )
        )
    return issues


def _imageless_containers(manifest: Manifest) -> Iterator[SpecIssue]:
    body = manifest.get("spec") or {}
    if manifest.get("kind") == TRAINJOB_KIND:
        return  # the runtime gives the image when the trainer has none
    for info in FRAMEWORKS.values():
        for replica_type, replica in (body.get(info.replica_specs_field) or {}).items():
            pod = ((replica or {}).get("template") or {}).get("spec") or {}
            for field in ("initContainers", "containers"):
                for container in pod.get(field) or []:
                    image = container.get("image") if isinstance(container, dict) else None
                    if not isinstance(image, str) or not image:
                        name = container.get("name") if isinstance(container, dict) else None
                        yield SpecIssue(
                            f"replicas.{replica_type.lower()}",
                            f"the rendered {replica_type} pod has a container without an image "
                            f"({field}: {name!r})",
                            "give the container an image in podTemplate, or address the "
                            "training container by its name",
                        )
