"""The real KServe controller in the test bed: Standard mode, without Knative or Istio.

One more supervised process next to the training operators (:mod:`.operators` lists it with them):
KServe's ``cmd/manager`` at :data:`~kubedl_prefect.testbed.upstream.KSERVE` (v0.20.0), built from
the module's own source (its ``go.mod`` has ``replace`` directives: see :mod:`.build`). It
reconciles InferenceServices into a predictor Deployment and Service whose pods kwok runs on the
simulated nodes, and reports their status as it does on a real cluster: the runtime it chose,
``modelStatus``, ``NoSupportingRuntime`` when no runtime fits. docs/operators.md has the findings.

What it needs, all written here from the pinned module (never hand-written copies):

- the CRDs it watches or lists, full schemas, installed with the others (:mod:`.content`): it
  exits when one it always watches is missing (InferenceService, ServingRuntime,
  InferenceGraph, TrainedModel), watches ClusterServingRuntimes when present and lists
  ClusterStorageContainers for every ``storageUri``;
- namespace :data:`KSERVE_NAMESPACE` with ConfigMap ``inferenceservice-config``
  (:func:`inferenceservice_config`: the one KServe ships, in Standard mode, without Ingress),
  read at start by the controller and on every call by its webhooks;
- the ClusterServingRuntimes KServe ships (``config/runtimes``), with the images its kustomization
  sets (:func:`cluster_serving_runtimes`);
- its ClusterRole from ``config/rbac/role.yaml``, bound to its client-certificate user;
- a webhook serving certificate in ``$TMPDIR/k8s-webhook-server/serving-certs`` (the test bed's
  loopback certificate); the build binds the webhook server to loopback.

Its webhooks are **registered** once it runs (:func:`kserve_webhooks`, written by
:func:`install_after_start`): upstream's ``config/webhook/manifests.yaml``, pointed at the
loopback port by URL with the test bed's CA, ``failurePolicy: Fail`` as shipped. So what the API
server accepts is what a cluster with KServe accepts: InferenceServices go through KServe's
defaulter (the ``serving.kserve.io/model-format`` annotation; a ``model`` predictor's resources
are left as given, ``{}`` when none: only the old framework predictors get the ConfigMap's
default resources) and validator,
runtimes through theirs, and every pod labelled ``serving.kserve.io/inferenceservice`` through the
pod mutator, which injects the ``storage-initializer`` init container, the
``kserve-provision-location`` volume and ``/mnt/models`` for a ``storageUri``. While the
controller is down, those writes are refused (as on a cluster).
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
from pathlib import Path
from typing import Any, Final

import yaml

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    ResourceKind,
)
from kubedl_prefect.testbed import cluster
from kubedl_prefect.testbed.build import GoBinary, SourcePatch
from kubedl_prefect.testbed.components import (
    LOOPBACK,
    Component,
    ComponentContext,
    HealthCheck,
    Identity,
    Layout,
)
from kubedl_prefect.testbed.upstream import KSERVE, module_dir, module_file

#: Namespace of KServe's own objects (its ``POD_NAMESPACE``: where it reads its ConfigMap).
KSERVE_NAMESPACE: Final = "kserve"
#: The ConfigMap the controller reads at start (and exits without).
CONFIG_MAP_NAME: Final = "inferenceservice-config"
#: Image of the storage initializer named in the ConfigMap (the pod mutator injects it; the
#: process node runs it as its local storage initializer, see ``nodeagent.images``).
STORAGE_INITIALIZER_IMAGE: Final = f"kserve/storage-initializer:{KSERVE.version}"

#: Client-certificate user of the controller (no ':', see :mod:`.operators`).
KSERVE_IDENTITY: Final = Identity("kserve-controller")

#: Port offsets of its endpoints (see :class:`~kubedl_prefect.testbed.components.Ports`).
PORT_OFFSETS: Final = {"kserve-metrics": 67, "kserve-probe": 68, "kserve-webhook": 69}

#: ClusterServingRuntimes (``serving.kserve.io/v1alpha1``, cluster-scoped).
CLUSTER_SERVING_RUNTIMES: Final = ResourceKind(
    "serving.kserve.io",
    "v1alpha1",
    "ClusterServingRuntime",
    "clusterservingruntimes",
    namespaced=False,
)

KSERVE_BINARY: Final = GoBinary(
    name="kserve-manager",
    module=KSERVE,
    package="./cmd/manager",
    env=(("CGO_ENABLED", "0"), ("GOFLAGS", "-mod=mod")),
    patches=(
        SourcePatch(
            module=KSERVE.path,
            file="cmd/manager/main.go",
            old="webhook.NewServer(webhook.Options{\n",
            new='webhook.NewServer(webhook.Options{\n\t\t\tHost: "127.0.0.1",\n',
            reason="the webhook server has no host flag and binds every interface: loopback only",
        ),
    ),
)


def _port(layout: Layout, endpoint: str) -> int:
    return layout.ports.offset(PORT_OFFSETS[endpoint])


#: The keys of KServe's shipped ConfigMap that the test bed sets (merged over the shipped values):
#: Standard mode (the shipped default is Knative, which is absent); no Ingress object and no
#: Istio VirtualService; the storage initializer's image at the pinned version.
CONFIG_OVERRIDES: Final[dict[str, dict[str, Any]]] = {
    "deploy": {"defaultDeploymentMode": "Standard"},
    "ingress": {"disableIngressCreation": True, "disableIstioVirtualHost": True},
    "storageInitializer": {"image": STORAGE_INITIALIZER_IMAGE},
}


def inferenceservice_config() -> dict[str, str]:
    """The data of ``inferenceservice-config``: KServe's own (``config/configmap``), adjusted.

    Every key of the shipped ConfigMap but ``_example``, each JSON value with
    :data:`CONFIG_OVERRIDES` merged over it. The controller parses ``deploy``, ``ingress`` and
    ``storageInitializer`` (whose four quantities Standard mode reads on every reconcile); the
    webhooks the rest: the pod mutator refuses pods without ``agent``, ``logger`` and
    ``batcher`` quantities, the defaulter gives ``inferenceService``'s default resources to the
    old framework predictors (``sklearn:``, ``pytorch:``...), not to a ``model:`` predictor.

    Raises:
        TestbedError: The module's ConfigMap changed shape (no data, a value not JSON).

    Example:
        >>> json.loads(inferenceservice_config()["deploy"])
        {'defaultDeploymentMode': 'Standard'}
    """
    path = module_file(KSERVE, "config/configmap/inferenceservice.yaml")
    documents = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    shipped = next((d for d in documents if d.get("kind") == "ConfigMap"), {}).get("data") or {}
    if not all(key in shipped for key in CONFIG_OVERRIDES):
        raise TestbedError(
            f"{path} of {KSERVE.path}@{KSERVE.version} lacks {list(CONFIG_OVERRIDES)}"
        )
    data: dict[str, str] = {}
    for key, text in shipped.items():
        if key.startswith("_"):
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TestbedError(f"{path}: the value of {key!r} is not JSON: {exc}") from exc
        if isinstance(value, dict):
            value.update(CONFIG_OVERRIDES.get(key, {}))
        data[key] = json.dumps(value, sort_keys=True)
    return data


def kustomize_image(image: str, images: list[dict[str, Any]]) -> str:
    """``image`` with a kustomization's ``images`` transformer applied (name, tag, digest).

    Example:
        >>> kustomize_image("mlserver:replace", [
        ...     {"name": "mlserver", "newName": "docker.io/seldonio/mlserver", "newTag": "1.7.1"}])
        'docker.io/seldonio/mlserver:1.7.1'
    """
    name, tag = image, ""
    if "@" in image:
        name, digest = image.split("@", 1)
        tag = "@" + digest
    elif ":" in image.rsplit("/", 1)[-1]:
        name, rest = image.rsplit(":", 1)
        tag = ":" + rest
    for entry in images:
        if entry.get("name") != name:
            continue
        new_name = str(entry.get("newName") or name)
        if entry.get("digest"):
            return f"{new_name}@{entry['digest']}"
        if entry.get("newTag"):
            return f"{new_name}:{entry['newTag']}"
        return new_name + tag
    return image


def _set_images(node: Any, images: list[dict[str, Any]]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                node[key] = kustomize_image(value, images)
            else:
                _set_images(value, images)
    elif isinstance(node, list):
        for item in node:
            _set_images(item, images)


def cluster_serving_runtimes() -> list[dict[str, Any]]:
    """The ClusterServingRuntimes of ``config/runtimes``, as its kustomization renders them.

    Every runtime the kustomization lists (``kserve-mlserver`` among them, the only one for the
    ``mlflow`` format), images as its ``images`` transformer sets them.

    Raises:
        TestbedError: The module's layout changed (no kustomization, no runtimes).
    """
    folder = module_dir(KSERVE) / "config" / "runtimes"
    kustomization = yaml.safe_load(
        module_file(KSERVE, "config/runtimes/kustomization.yaml").read_text()
    )
    images = list(kustomization.get("images") or [])
    runtimes: list[dict[str, Any]] = []
    for name in kustomization.get("resources") or []:
        for document in yaml.safe_load_all((folder / name).read_text()):
            if isinstance(document, dict) and document.get("kind") == "ClusterServingRuntime":
                _set_images(document, images)
                runtimes.append(document)
    if not runtimes:
        raise TestbedError(
            f"no ClusterServingRuntime in {folder} of {KSERVE.path}@{KSERVE.version}"
        )
    return runtimes


def controller_cluster_role() -> dict[str, Any]:
    """KServe's ``kserve-manager-role`` (``config/rbac/role.yaml``), named after our user."""
    path = module_file(KSERVE, "config/rbac/role.yaml")
    roles = [
        d
        for d in yaml.safe_load_all(path.read_text())
        if isinstance(d, dict) and d.get("kind") == "ClusterRole"
    ]
    if len(roles) != 1:
        raise TestbedError(f"expected one ClusterRole in {path}, found {len(roles)}")
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": KSERVE_IDENTITY.user},
        "rules": roles[0]["rules"],
    }


def kserve_manifests() -> list[dict[str, Any]]:
    """Objects the controller needs before it starts, in the order they are written."""
    user = KSERVE_IDENTITY.user
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KSERVE_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP_NAME, "namespace": KSERVE_NAMESPACE},
            "data": inferenceservice_config(),
        },
        controller_cluster_role(),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": user},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": user,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
        *cluster_serving_runtimes(),
    ]


def webhook_tmpdir(layout: Layout) -> Path:
    """The controller's ``$TMPDIR``: its webhook certificate is read from under it."""
    return layout.config_dir / "kserve-tmp"


def write_webhook_cert(ctx: ComponentContext) -> Path:
    """Put the test bed's loopback serving certificate where the webhook server reads it.

    controller-runtime reads ``$TMPDIR/k8s-webhook-server/serving-certs/tls.{crt,key}``; the
    certificate is issued by the test bed's CA for IP 127.0.0.1, the CA :func:`kserve_webhooks`
    names.
    """
    folder = webhook_tmpdir(ctx.layout) / "k8s-webhook-server" / "serving-certs"
    folder.mkdir(parents=True, exist_ok=True)
    for source, name in ((ctx.serving_cert, "tls.crt"), (ctx.serving_key, "tls.key")):
        target = folder / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
    return folder


def kserve_webhooks(layout: Layout) -> list[dict[str, Any]]:
    """KServe's webhook configurations (``config/webhook/manifests.yaml``), on its loopback port.

    As upstream's default kustomization writes them (names, rules, selectors, failure policies),
    with each ``clientConfig.service`` replaced by ``https://127.0.0.1:<port><path>`` and the test
    bed's CA as ``caBundle`` (cert-manager injects it upstream). The llmisvc and localmodel
    webhooks (other folders, other servers) are left out.

    Raises:
        TestbedError: The module has no such configurations, or a webhook no path.
    """
    path = module_file(KSERVE, "config/webhook/manifests.yaml")
    port = _port(layout, "kserve-webhook")
    ca_bundle = base64.b64encode(layout.ca_file.read_bytes()).decode()
    result = []
    for document in yaml.safe_load_all(path.read_text()):
        if not isinstance(document, dict) or document.get("kind") not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        webhooks = copy.deepcopy(document.get("webhooks") or [])
        for webhook in webhooks:
            service = (webhook.get("clientConfig") or {}).get("service") or {}
            if not service.get("path"):
                raise TestbedError(f"webhook {webhook.get('name')} of {path} has no path")
            webhook["clientConfig"] = {
                "url": f"https://{LOOPBACK}:{port}{service['path']}",
                "caBundle": ca_bundle,
            }
        result.append(
            {
                "apiVersion": document["apiVersion"],
                "kind": document["kind"],
                "metadata": {"name": document["metadata"]["name"]},
                "webhooks": webhooks,
            }
        )
    if not result or not all(d["webhooks"] for d in result):
        raise TestbedError(f"no webhook configurations in {path} of KServe {KSERVE.version}")
    return result


async def install_after_start(kube: KubeClient, layout: Layout) -> None:
    """Register KServe's webhooks (idempotent; the controller must run: its validators answer).

    Raises:
        TestbedError: The API server refused one.
    """
    await cluster.write_in_order(
        kube,
        (MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS),
        kserve_webhooks(layout),
        "KServe",
    )


def kserve_args(ctx: ComponentContext) -> list[str]:
    """Command line of the KServe controller (writes its webhook certificate first)."""
    write_webhook_cert(ctx)
    layout = ctx.layout
    return [
        f"--kubeconfig={ctx.kubeconfig}",
        f"--metrics-addr={LOOPBACK}:{_port(layout, 'kserve-metrics')}",
        f"--health-probe-addr={LOOPBACK}:{_port(layout, 'kserve-probe')}",
        # On loopback through a build patch (KSERVE_BINARY); see kserve_webhooks.
        f"--webhook-port={_port(layout, 'kserve-webhook')}",
        "--leader-elect=false",
        "--zap-devel=false",
    ]


def kserve_env(ctx: ComponentContext) -> dict[str, str]:
    """Environment of the controller: its namespace and the ``$TMPDIR`` of its certificate."""
    return {"POD_NAMESPACE": KSERVE_NAMESPACE, "TMPDIR": str(webhook_tmpdir(ctx.layout))}


def kserve_health(layout: Layout) -> HealthCheck:
    """Ready once the webhook server and the controllers started (``/readyz``)."""
    return HealthCheck(f"http://{LOOPBACK}:{_port(layout, 'kserve-probe')}/readyz")


#: The controller's process row.
KSERVE_COMPONENT: Final = Component(
    name="kserve-controller",
    binary=KSERVE_BINARY.name,
    args=kserve_args,
    identity=KSERVE_IDENTITY,
    health=kserve_health,
    env_from=kserve_env,
)
