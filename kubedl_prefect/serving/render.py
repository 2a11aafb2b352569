"""The InferenceService manifest of an :class:`~.spec.InferenceServiceSpec`. Pure.

The manifest is what :mod:`.deploy` applies (server-side, as ``kubedl-prefect``); it validates
against KServe v0.20's full CRD schema, strictly (tests check it offline, as the training
manifests are checked). Beyond the user's settings it carries:

- the deployment mode as the ``serving.kserve.io/deploymentMode`` annotation, always;
- labels linking the model version and the training job (on the service and, through
  ``predictor.labels``, on its pods), with the exact names in annotations, since label values
  are limited to 63 characters of ``[A-Za-z0-9._-]``;
- ``app.kubernetes.io/managed-by: kubedl-prefect``, which :mod:`.deploy` checks before it
  changes or deletes a service;
- in Standard mode over ``v2``, a readiness probe of the model's own ready endpoint on the model
  server (:attr:`~.spec.InferenceServiceSpec.model_ready_probe`): KServe's default TCP probe
  passes before the model loaded.

Example:
    >>> from kubedl_prefect.serving.spec import MODEL_SERVER_PORT, Canary, InferenceServiceSpec
    >>> manifest = render_inference_service(InferenceServiceSpec(
    ...     name="fraud", namespace="ml", storage_uri="s3://ml/3/models/m-ab/artifacts"))
    >>> manifest["spec"]["predictor"]["model"]["modelFormat"], manifest["metadata"]["annotations"]
    ({'name': 'mlflow'}, {'serving.kserve.io/deploymentMode': 'Standard'})
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from typing import Final

from kubedl_prefect.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from kubedl_prefect.kube.resources import INFERENCE_SERVICES, KubeObject
from kubedl_prefect.serving.spec import MODEL_SERVER_PORT, Canary, InferenceServiceSpec
from kubedl_prefect.spec.types import GPU_RESOURCE

DEPLOYMENT_MODE_ANNOTATION: Final = "serving.kserve.io/deploymentMode"
"""KServe's annotation choosing the deployment mode."""
ISVC_POD_LABEL: Final = "serving.kserve.io/inferenceservice"
"""The label KServe puts on an InferenceService's pods (value: its name)."""

KSERVE_CONTAINER: Final = "kserve-container"
"""The name KServe gives the model server's container."""

LABEL_MODEL: Final = "kubedl-prefect.io/model"
LABEL_MODEL_VERSION: Final = "kubedl-prefect.io/model-version"
LABEL_TRAINING_JOB: Final = "kubedl-prefect.io/training-job"
ANNOTATION_MODEL_URI: Final = "kubedl-prefect.io/model-uri"
ANNOTATION_MODEL_NAME: Final = "kubedl-prefect.io/model-name"
ANNOTATION_JOB_NAMESPACE: Final = "kubedl-prefect.io/training-job-namespace"
ANNOTATION_JOB_NAME: Final = "kubedl-prefect.io/training-job-name"
ANNOTATION_JOB_UID: Final = "kubedl-prefect.io/training-job-uid"

_LABEL_VALUE_BAD: Final = re.compile(r"[^A-Za-z0-9._-]+")

ANY: Final = None
"""In :data:`RENDERED_SHAPE`, a field whose value may be anything."""
_MODEL_SHAPE: Final = {
    "name": ANY,
    "modelFormat": {"name": ANY, "version": ANY},
    "protocolVersion": ANY,
    "runtime": ANY,
    "storageUri": ANY,
    "readinessProbe": {
        "httpGet": {"path": ANY, "port": ANY},
        "periodSeconds": ANY,
        "failureThreshold": ANY,
    },
    "resources": {"limits": ANY, "requests": ANY},
    "env": [{"name": ANY, "value": ANY}],
}
RENDERED_SHAPE: Final = {
    "labels": ANY,
    "annotations": ANY,
    "spec": {
        "predictor": {
            "model": _MODEL_SHAPE,
            "labels": ANY,
            "minReplicas": ANY,
            "maxReplicas": ANY,
            "serviceAccountName": ANY,
            "nodeSelector": ANY,
            "tolerations": ANY,
            "canaryTrafficPercent": ANY,
        },
        "canary": [
            {
                "predictor": {"name": ANY, "model": _MODEL_SHAPE, "labels": ANY},
                "trafficPercent": ANY,
            }
        ],
    },
}
"""Every field :func:`render_inference_service` may write (labels, annotations and spec).

A mapping names the keys a mapping may have, a one-item list the shape of every item of a list,
:data:`ANY` a value that may be anything. What a rollback restores from a record that anyone with
ConfigMap access could have written is checked against it (:mod:`.record`): no containers,
volumes, images, exec probes or ``valueFrom`` that this renderer would not write.
"""


def label_value(text: str) -> str:
    """``text`` as a valid label value: other characters become ``-``; long ones are hashed.

    Example:
        >>> label_value("team/fraud detector")
        'team-fraud-detector'
        >>> len(label_value("x" * 100))
        63
    """
    value = _LABEL_VALUE_BAD.sub("-", text).strip("-._")
    if len(value) > 63:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        value = f"{value[:52].rstrip('-._')}-{digest}"
    return value


def lineage_labels(service: InferenceServiceSpec) -> dict[str, str]:
    """The labels of the service and its pods: ours, the link's and the user's."""
    labels = {LABEL_MANAGED_BY: MANAGED_BY}
    link = service.link
    if link is not None:
        labels[LABEL_MODEL] = label_value(link.model_name)
        labels[LABEL_MODEL_VERSION] = label_value(link.version)
        if link.job_name:
            labels[LABEL_TRAINING_JOB] = label_value(link.job_name)
    labels.update(service.labels)
    return labels


def _annotations(service: InferenceServiceSpec) -> dict[str, str]:
    annotations = {DEPLOYMENT_MODE_ANNOTATION: service.deployment_mode.value}
    link = service.link
    if link is not None:
        annotations[ANNOTATION_MODEL_URI] = link.model_uri
        annotations[ANNOTATION_MODEL_NAME] = link.model_name
        for key, value in (
            (ANNOTATION_JOB_NAMESPACE, link.job_namespace),
            (ANNOTATION_JOB_NAME, link.job_name),
            (ANNOTATION_JOB_UID, link.job_uid),
        ):
            if value:
                annotations[key] = value
    annotations.update(service.annotations)
    annotations[DEPLOYMENT_MODE_ANNOTATION] = service.deployment_mode.value
    return annotations


def _resources(service: InferenceServiceSpec) -> KubeObject:
    amounts: dict[str, str | int] = {}
    if service.resources.cpu is not None:
        amounts["cpu"] = service.resources.cpu
    if service.resources.memory is not None:
        amounts["memory"] = service.resources.memory
    if service.resources.gpus:
        amounts[GPU_RESOURCE] = service.resources.gpus
    return {"limits": dict(amounts), "requests": dict(amounts)} if amounts else {}


def _model(service: InferenceServiceSpec, storage_uri: str) -> KubeObject:
    model: KubeObject = {"modelFormat": {"name": service.model_format}}
    if service.model_format_version is not None:
        model["modelFormat"]["version"] = service.model_format_version
    model["protocolVersion"] = service.protocol.value
    if service.runtime is not None:
        model["runtime"] = service.runtime
    model["storageUri"] = storage_uri
    if service.ready_path is not None:
        model["readinessProbe"] = {
            "httpGet": {"path": service.ready_path, "port": MODEL_SERVER_PORT},
            "periodSeconds": 5,
            "failureThreshold": 3,
        }
    resources = _resources(service)
    if resources:
        model["resources"] = resources
    if service.env:
        model["env"] = [{"name": name, "value": value} for name, value in service.env.items()]
    return model


def _canary(service: InferenceServiceSpec, canary: Canary) -> KubeObject:
    """KServe's ``spec.canary[]`` entry: the stable predictor with the candidate's model.

    KServe merges the entry's predictor over the stable one, so it names only what differs:
    the model (whole, for clarity) and the lineage labels of the candidate's pods.
    """
    labels = lineage_labels(replace(service, link=canary.link or service.link))
    # The entry's schema requires the model's container name; KServe names it so anyway.
    model = {"name": KSERVE_CONTAINER, **_model(service, canary.storage_uri)}
    return {
        "predictor": {
            "name": canary.name,
            "model": model,
            "labels": labels,
        },
        "trafficPercent": canary.traffic_percent,
    }


def render_inference_service(
    service: InferenceServiceSpec, *, namespace: str | None = None
) -> KubeObject:
    """The InferenceService manifest for ``service`` (in ``namespace`` unless it names one).

    A Standard-mode :class:`~.spec.Canary` becomes KServe's ``spec.canary`` (one entry);
    Knative's ``canary_traffic_percent`` becomes ``predictor.canaryTrafficPercent``.

    Raises:
        InferenceServiceSpecError: ``service`` has problems (all of them are listed).
    """
    service.check(namespace)
    model = _model(service, service.storage_uri)
    labels = lineage_labels(service)
    predictor: KubeObject = {"model": model, "labels": dict(labels)}
    if service.min_replicas is not None:
        predictor["minReplicas"] = service.min_replicas
    if service.max_replicas is not None:
        predictor["maxReplicas"] = service.max_replicas
    if service.service_account is not None:
        predictor["serviceAccountName"] = service.service_account
    if service.node_selector:
        predictor["nodeSelector"] = dict(service.node_selector)
    if service.tolerations:
        predictor["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in service.tolerations
        ]
    if service.canary_traffic_percent is not None:
        predictor["canaryTrafficPercent"] = service.canary_traffic_percent

    metadata: KubeObject = {"name": service.name}
    where = service.namespace or namespace
    if where is not None:
        metadata["namespace"] = where
    metadata["labels"] = labels
    metadata["annotations"] = _annotations(service)
    spec: KubeObject = {"predictor": predictor}
    if service.canary is not None:
        spec["canary"] = [_canary(service, service.canary)]
    return {
        "apiVersion": INFERENCE_SERVICES.api_version,
        "kind": INFERENCE_SERVICES.kind,
        "metadata": metadata,
        "spec": spec,
    }
