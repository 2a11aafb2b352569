"""Kueue in the test bed: the real controller, its webhooks registered, quota against kwok nodes.

One more supervised process next to the operators (:mod:`.operators` lists it with the others):
the **Kueue controller manager** (``cmd/kueue`` of ``sigs.k8s.io/kueue``), built from a wrapper
module of ours under ``go/kueue`` at exactly :data:`~kubedl_prefect.testbed.upstream.KUEUE`
(v0.19.2). It makes a ``Workload`` for each job labelled ``kueue.x-k8s.io/queue-name``, keeps the
job suspended until the LocalQueue's ClusterQueue has quota for all of it, resumes it, and may
evict (preempt) and requeue it: what the lifecycle's Kueue wait reads on a real cluster.

- **Configuration** (:func:`kueue_configuration`, ``config.kueue.x-k8s.io/v1beta2``): every
  listener on loopback (webhook, health probe, authenticated HTTPS metrics), no leader election,
  internal certificate management off, the frameworks the test bed's operators run
  (:data:`FRAMEWORKS`), ``waitForPodsReady`` on (:data:`WAIT_FOR_PODS_READY`), and the visibility
  API server off (it is an aggregated API server binding every interface).
- **Certificates**: the webhook and metrics servers serve the test bed's loopback certificate
  from ``config/kueue-certs``. With internal certificate management off, Kueue v0.19.2 reads its
  metrics certificate from a fixed ``/etc/kueue/metrics/certs`` (``cmd/kueue/main.go``, no flag
  or setting moves it): the build patches that one line to read the folder from
  :data:`METRICS_CERT_DIR_ENV` when it is set (:data:`KUEUE_BINARY`).
- **CRDs**: ``config/components/crd/bases``, served at ``v1beta2`` only (see
  :data:`~kubedl_prefect.testbed.content.CRD_SOURCES`): the ``v1beta1`` versions need Kueue's
  conversion webhook, which upstream adds with a kustomize patch.
- **Webhooks** (:func:`kueue_webhooks`): upstream's ``config/components/webhook/manifests.yaml``
  with the namespace selector its kustomization sets, pointed at the loopback port by URL with
  the test bed's CA, ``failurePolicy: Fail``; only those of Kueue's own kinds and of
  :data:`FRAMEWORKS` (the others would be no-ops called for every pod or Deployment).
- **Cluster objects** written once it runs (through its webhooks): a ResourceFlavor for the kwok
  nodes (:data:`FLAVOR`) and WorkloadPriorityClasses ``low`` and ``high``. ClusterQueues and
  LocalQueues are per test: :func:`cluster_queue` and :func:`local_queue` build them.
"""

from __future__ import annotations

import base64
import copy
import shutil
from pathlib import Path
from typing import Any, Final

import yaml

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    KUEUE_CLUSTER_QUEUES,
    KUEUE_LOCAL_QUEUES,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    ROLE_BINDINGS,
    ROLES,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    ResourceKind,
)
from kubedl_prefect.testbed import cluster
from kubedl_prefect.testbed.build import GO_ROOT, GoBinary, SourcePatch
from kubedl_prefect.testbed.components import (
    LOOPBACK,
    Component,
    ComponentContext,
    HealthCheck,
    Identity,
    Layout,
)
from kubedl_prefect.testbed.content import GPU_RESOURCE, NODE_LABEL
from kubedl_prefect.testbed.controlplane import CLUSTER_NAME
from kubedl_prefect.testbed.kubeconfig import render_kubeconfig, write_kubeconfig
from kubedl_prefect.testbed.pki import CertificateAuthority
from kubedl_prefect.testbed.rbac import cluster_role_binding, upstream_cluster_role
from kubedl_prefect.testbed.upstream import KUEUE, module_file

#: Client-certificate user of the controller (no ':', see :mod:`.operators`).
KUEUE_IDENTITY: Final = Identity("kueue-controller-manager")
#: The namespace Kueue believes it runs in (its default outside a Pod); it manages no job there.
KUEUE_NAMESPACE: Final = "kueue-system"

#: Port offsets of its endpoints (see :class:`~kubedl_prefect.testbed.components.Ports`): above
#: the control plane's etcd ports (79, 80), every offset from 43 to 80 being taken.
PORT_OFFSETS: Final = {"kueue-webhook": 81, "kueue-metrics": 82, "kueue-probe": 83}

#: Environment variable the patched build reads its metrics certificate folder from.
METRICS_CERT_DIR_ENV: Final = "KUBEDL_PREFECT_KUEUE_METRICS_CERT_DIR"

#: Kueue's names (``FrameworkName`` in ``pkg/controller/jobs/*``) of the kinds the test bed runs.
#: ``kubeflow.org/mpijob`` is mpi-operator's ``v2beta1`` MPIJob: the test bed's MPIJob is the
#: training operator's ``v1``, which Kueue v0.19.2 does not manage (it waits for the v2beta1 API).
FRAMEWORKS: Final = (
    "batch/job",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/tfjob",
    "kubeflow.org/mpijob",
    "kubeflow.org/xgboostjob",
    "trainer.kubeflow.org/trainjob",
)

#: ``waitForPodsReady``: an admitted job whose pods are not all ready in time is evicted
#: (``PodsReadyTimeout``) and requeued after a back-off, deactivated after 3 requeues. kwok pods
#: are ready within a second; the timeout leaves room for a loaded machine.
WAIT_FOR_PODS_READY: Final[dict[str, Any]] = {
    "timeout": "2m",
    "blockAdmission": False,
    "requeuingStrategy": {
        "timestamp": "Eviction",
        "backoffLimitCount": 3,
        "backoffBaseSeconds": 5,
        "backoffMaxSeconds": 60,
    },
}


def pods_ready_timeout_s() -> float:
    """:data:`WAIT_FOR_PODS_READY`'s timeout in seconds (a Go duration of minutes or seconds).

    Example:
        >>> pods_ready_timeout_s()
        120.0
    """
    text = str(WAIT_FOR_PODS_READY["timeout"])
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    total, number = 0.0, ""
    for char in text:
        if char.isdigit() or char == ".":
            number += char
        else:
            total += float(number) * units[char]
            number = ""
    return total


#: Feature gates: the visibility API (Beta, on by default) is an aggregated API server that
#: binds every interface and needs the aggregation layer, which the test bed does not run.
FEATURE_GATES: Final = {"VisibilityOnDemand": False}

#: The ResourceFlavor of the kwok nodes: Kueue puts its node labels into admitted pods' selectors.
FLAVOR: Final = "kwok-gpu"
#: WorkloadPriorityClasses the test bed writes (``kueue.priorityClass`` of a spec).
PRIORITY_CLASSES: Final = {"low": 100, "high": 10000}

RESOURCE_FLAVORS: Final = ResourceKind(
    "kueue.x-k8s.io", "v1beta2", "ResourceFlavor", "resourceflavors", namespaced=False
)
WORKLOAD_PRIORITY_CLASSES: Final = ResourceKind(
    "kueue.x-k8s.io",
    "v1beta2",
    "WorkloadPriorityClass",
    "workloadpriorityclasses",
    namespaced=False,
)

KUEUE_BINARY: Final = GoBinary(
    name="kueue-manager",
    module=GO_ROOT / "kueue",
    package=f"{KUEUE.path}/cmd/kueue",
    ldflags=(f"-X {KUEUE.path}/pkg/version.GitVersion={KUEUE.version}",),
    patches=(
        SourcePatch(
            module=KUEUE.path,
            file="cmd/kueue/main.go",
            old='metricsCertPath := "/etc/kueue/metrics/certs"\n',
            new='metricsCertPath := "/etc/kueue/metrics/certs"\n'
            f'\t\tif dir := os.Getenv("{METRICS_CERT_DIR_ENV}"); dir != "" {{\n'
            "\t\t\tmetricsCertPath = dir\n"
            "\t\t}\n",
            reason="without internal certificate management the metrics certificate is read "
            "from a fixed /etc folder; read it from the test bed's folder instead",
        ),
    ),
)


def _port(layout: Layout, endpoint: str) -> int:
    return layout.ports.offset(PORT_OFFSETS[endpoint])


def cert_dir(layout: Layout) -> Path:
    """Where Kueue's webhook and metrics servers read their certificate (``tls.crt``/``.key``)."""
    return layout.config_dir / "kueue-certs"


def kueue_configuration(layout: Layout) -> dict[str, Any]:
    """Kueue's ``Configuration`` (``config.kueue.x-k8s.io/v1beta2``) for ``layout``.

    Example:
        >>> from kubedl_prefect.testbed.components import Ports
        >>> config = kueue_configuration(Layout(ports=Ports(28400)))
        >>> config["webhook"]["port"], config["health"], config["leaderElection"]
        (28481, {'healthProbeBindAddress': '127.0.0.1:28483'}, {'leaderElect': False})
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "webhook": {
            "host": LOOPBACK,
            "port": _port(layout, "kueue-webhook"),
            "certDir": str(cert_dir(layout)),
        },
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{_port(layout, 'kueue-probe')}"},
        "metrics": {"bindAddress": f"{LOOPBACK}:{_port(layout, 'kueue-metrics')}"},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": copy.deepcopy(WAIT_FOR_PODS_READY),
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": dict(FEATURE_GATES),
    }


def kueue_args(ctx: ComponentContext) -> list[str]:
    """Command line of the Kueue manager (writes its configuration and certificate first)."""
    layout = ctx.layout
    folder = cert_dir(layout)
    folder.mkdir(parents=True, exist_ok=True)
    for source, name in ((ctx.serving_cert, "tls.crt"), (ctx.serving_key, "tls.key")):
        target = folder / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
    config = layout.config_dir / "kueue-configuration.yaml"
    config.write_text(yaml.safe_dump(kueue_configuration(layout), sort_keys=False))
    if ctx.kubeconfig is None:
        raise TestbedError("Kueue needs a kubeconfig (a component identity)")
    if not ctx.kubeconfig.is_file():
        _issue_kubeconfig(layout, ctx.kubeconfig)
    return [f"--config={config}", f"--kubeconfig={ctx.kubeconfig}", "--zap-devel=false"]


def _issue_kubeconfig(layout: Layout, path: Path) -> None:
    """Kueue's client certificate and kubeconfig, when the test bed's start did not issue them.

    A test bed started before Kueue was part of it gets Kueue started by ``up`` next to its
    running control plane, which issues only the identities of its first start.
    """
    certificate = CertificateAuthority(layout.pki_dir).client(KUEUE_IDENTITY)
    document = render_kubeconfig(
        cluster=CLUSTER_NAME,
        server=layout.apiserver_url,
        ca_file=layout.ca_file,
        user=KUEUE_IDENTITY.user,
        client_cert=certificate,
    )
    write_kubeconfig(path, document)


def kueue_env(ctx: ComponentContext) -> dict[str, str]:
    """The folder of its metrics certificate (read by the patched build)."""
    return {METRICS_CERT_DIR_ENV: str(cert_dir(ctx.layout))}


def kueue_health(layout: Layout) -> HealthCheck:
    """Ready once its webhook server serves (``/readyz``)."""
    return HealthCheck(f"http://{LOOPBACK}:{_port(layout, 'kueue-probe')}/readyz")


#: The controller's process row, started after the operators whose kinds it manages.
KUEUE_COMPONENT: Final = Component(
    name="kueue-controller",
    binary=KUEUE_BINARY.name,
    args=kueue_args,
    identity=KUEUE_IDENTITY,
    health=kueue_health,
    env_from=kueue_env,
)

# --- cluster objects --------------------------------------------------------------------------


def kueue_manifests() -> list[dict[str, Any]]:
    """What Kueue needs before it starts: its namespace and RBAC (read from the module).

    ``config/components/rbac/role.yaml``, the ``metrics-auth-role`` of its authenticated
    metrics server and the Role on Secrets of its namespace (it watches them there), renamed
    after and bound to its client-certificate user.
    """
    user = KUEUE_IDENTITY.user
    secrets = yaml.safe_load(
        module_file(KUEUE, "config/components/rbac/manager_secrets_role.yaml").read_text()
    )
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
        upstream_cluster_role(module_file(KUEUE, "config/components/rbac/role.yaml"), user),
        cluster_role_binding(user, user, user),
        upstream_cluster_role(
            module_file(KUEUE, "config/components/rbac/metrics_auth_role.yaml"),
            f"{user}-metrics-auth",
        ),
        cluster_role_binding(f"{user}-metrics-auth", f"{user}-metrics-auth", user),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"{user}-secrets", "namespace": KUEUE_NAMESPACE},
            "rules": secrets["rules"],
        },
        {
            **cluster_role_binding(f"{user}-secrets", f"{user}-secrets", user),
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-secrets", "namespace": KUEUE_NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"{user}-secrets",
            },
        },
    ]


def _framework_webhook_stems() -> set[str]:
    # Upstream names each kind's webhooks m<kind>.kb.io and v<kind>.kb.io.
    return {name.rpartition("/")[2] for name in FRAMEWORKS}


def _namespace_selectors(kustomization: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Webhook name to the namespace selector upstream's kustomization gives it.

    It patches ``vpod.kb.io`` with a selector and copies that to every framework webhook.
    """
    selector: dict[str, Any] | None = None
    for patch in kustomization.get("patches") or []:
        document = yaml.safe_load(patch.get("patch") or "") or {}
        for webhook in document.get("webhooks") or []:
            if webhook.get("namespaceSelector"):
                selector = webhook["namespaceSelector"]
    if selector is None:
        raise TestbedError(f"no namespace selector in Kueue {KUEUE.version}'s webhooks")
    names: dict[str, dict[str, Any]] = {}
    for replacement in kustomization.get("replacements") or []:
        for target in replacement.get("targets") or []:
            for path in target.get("fieldPaths") or []:
                if path.startswith("webhooks.[name=") and path.endswith("].namespaceSelector"):
                    names[path[len("webhooks.[name=") : -len("].namespaceSelector")]] = selector
    return names


def kueue_webhooks(layout: Layout) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, on its loopback port, with the test bed's CA.

    Named as upstream's default kustomization names them (``kueue-`` prefix), with the namespace
    selectors it sets; only the webhooks of Kueue's own kinds and of :data:`FRAMEWORKS`.
    """
    folder = "config/components/webhook"
    kustomization = yaml.safe_load(module_file(KUEUE, f"{folder}/kustomization.yaml").read_text())
    selectors = _namespace_selectors(kustomization)
    stems = _framework_webhook_stems()
    ca_bundle = cluster_ca_bundle(layout)
    port = _port(layout, "kueue-webhook")
    documents = [
        d
        for d in yaml.safe_load_all(module_file(KUEUE, f"{folder}/manifests.yaml").read_text())
        if isinstance(d, dict)
        and d.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    result = []
    for document in documents:
        kept = []
        for webhook in document.get("webhooks") or []:
            name = str(webhook.get("name", ""))
            groups = {g for rule in webhook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if name.split(".")[0][1:] not in stems and "kueue.x-k8s.io" not in groups:
                continue
            webhook = copy.deepcopy(webhook)
            path = ((webhook.get("clientConfig") or {}).get("service") or {}).get("path", "/")
            webhook["clientConfig"] = {
                "url": f"https://{LOOPBACK}:{port}{path}",
                "caBundle": ca_bundle,
            }
            if name in selectors:
                webhook["namespaceSelector"] = copy.deepcopy(selectors[name])
            kept.append(webhook)
        document = {
            "apiVersion": document["apiVersion"],
            "kind": document["kind"],
            "metadata": {"name": "kueue-" + document["metadata"]["name"]},
            "webhooks": kept,
        }
        result.append(document)
    if len(result) != 2 or not all(d["webhooks"] for d in result):
        raise TestbedError(f"no webhook configurations in {folder} of Kueue {KUEUE.version}")
    return result


def cluster_ca_bundle(layout: Layout) -> str:
    """The test bed's CA certificate, base64-encoded (a ``caBundle``)."""
    return base64.b64encode(layout.ca_file.read_bytes()).decode()


def resource_flavor(
    name: str = FLAVOR, node_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A ResourceFlavor of the nodes carrying ``node_labels``.

    By default :data:`FLAVOR`: the kwok nodes, by the label every test-bed node carries. A
    flavor of the process node (:func:`process_flavor`) lets Kueue admit jobs whose pods run
    as real processes.
    """
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": dict(node_labels or {NODE_LABEL: "true"})},
    }


def process_flavor(name: str, label: str) -> dict[str, Any]:
    """A ResourceFlavor of the process node (labelled ``label: "true"``), named ``name``.

    Pods that run there already tolerate its taint (they opt in to it), so the flavor lists no
    taint; Kueue puts the label into the admitted pods' node selector.

    Example:
        >>> process_flavor("process", "testbed.kubedl-prefect.io/process-node")["spec"]
        {'nodeLabels': {'testbed.kubedl-prefect.io/process-node': 'true'}}
    """
    return resource_flavor(name, {label: "true"})


def priority_classes() -> list[dict[str, Any]]:
    """The WorkloadPriorityClasses of :data:`PRIORITY_CLASSES`."""
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": f"kubedl-prefect test bed: {name} priority",
        }
        for name, value in PRIORITY_CLASSES.items()
    ]


def cluster_queue(
    name: str,
    *,
    namespace: str,
    gpus: int,
    cpu: str = "64",
    memory: str = "256Gi",
    cohort: str | None = None,
    preempt_lower_priority: bool = True,
    flavor: str = FLAVOR,
) -> dict[str, Any]:
    """A ClusterQueue admitting jobs of ``namespace`` up to ``gpus`` GPUs of ``flavor``.

    Its quota covers cpu, memory and ``nvidia.com/gpu`` of one flavor (:data:`FLAVOR` unless
    told); with ``preempt_lower_priority`` a job of a higher WorkloadPriorityClass preempts
    lower ones in the same queue.

    Example:
        >>> queue = cluster_queue("cq-a", namespace="team-a", gpus=4, cohort="research")
        >>> queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
        {'name': 'nvidia.com/gpu', 'nominalQuota': '4'}
    """
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", GPU_RESOURCE],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": cpu},
                            {"name": "memory", "nominalQuota": memory},
                            {"name": GPU_RESOURCE, "nominalQuota": str(gpus)},
                        ],
                    }
                ],
            }
        ],
    }
    if cohort is not None:
        spec["cohortName"] = cohort
    if preempt_lower_priority:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    """A LocalQueue of ``namespace`` feeding ClusterQueue ``cluster_queue_name``."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


#: What :func:`write` writes.
_KINDS: Final = (
    NAMESPACES,
    CLUSTER_ROLES,
    CLUSTER_ROLE_BINDINGS,
    ROLES,
    ROLE_BINDINGS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    RESOURCE_FLAVORS,
    WORKLOAD_PRIORITY_CLASSES,
    KUEUE_CLUSTER_QUEUES,
    KUEUE_LOCAL_QUEUES,
)


async def write(kube: KubeClient, manifests: list[dict[str, Any]]) -> None:
    """Create or update Kueue objects (webhooks, flavors, queues...) in order.

    Raises:
        TestbedError: The API server (or Kueue's webhook) refused one.
    """
    await cluster.write_in_order(kube, _KINDS, manifests, "Kueue")


def after_start_manifests(layout: Layout) -> list[dict[str, Any]]:
    """What is written once Kueue answers, in order: its webhooks, the flavor, the priorities."""
    return [*kueue_webhooks(layout), resource_flavor(), *priority_classes()]


async def install_after_start(kube: KubeClient, layout: Layout) -> None:
    """Register Kueue's webhooks, then write the flavor and priority classes (idempotent)."""
    await write(kube, after_start_manifests(layout))
