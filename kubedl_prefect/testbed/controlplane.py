"""The control plane of the test bed: its binaries, their command lines, its component rows.

Four processes, all on 127.0.0.1 (ports from :class:`~kubedl_prefect.testbed.components.Ports`):

- :data:`APISERVER`: ``kube-apiserver-etcd``, kube-apiserver with an embedded etcd (our wrapper in
  ``go/kube/cmd``), TLS, RBAC, client-certificate and service-account-token authentication;
- :data:`CONTROLLER_MANAGER` and :data:`SCHEDULER`, from ``k8s.io/kubernetes``, each with its own
  client certificate;
- :data:`KWOK`, the kwok controller with our stages (:mod:`.content`), which also serves the
  nodes' kubelet API (container logs, see :mod:`.podlogs`).

The runner (:mod:`.testbed`) starts the API server, installs the CRDs, then starts
:data:`CONTROL_PLANE_AFTER_CRDS` in order; the training operators (:mod:`.operators`) come after.
"""

from __future__ import annotations

from kubedl_prefect.testbed import content
from kubedl_prefect.testbed.build import GO_ROOT, GoBinary, kube_version_ldflags
from kubedl_prefect.testbed.components import (
    LOOPBACK,
    Component,
    ComponentContext,
    HealthCheck,
    Identity,
)
from kubedl_prefect.testbed.upstream import KUBERNETES

#: Name of the cluster in the kubeconfigs.
CLUSTER_NAME = "kubedl-prefect-testbed"
#: The administrator (``system:masters``): the identity of the admin kubeconfig.
ADMIN = Identity("kubedl-prefect-admin", ("system:masters",))
#: The API server's identity towards kubelets (kwok's server), e.g. to read container logs.
APISERVER_KUBELET_CLIENT = Identity("kube-apiserver-kubelet-client")
#: File stem of its certificate and key in the PKI folder.
KUBELET_CLIENT_STEM = "apiserver-kubelet-client"
#: Service IP range of the cluster (no Service is reachable: nothing runs in the cluster).
SERVICE_CIDR = "10.96.0.0/16"

_KUBE_LDFLAGS = kube_version_ldflags(KUBERNETES.version)

APISERVER_BINARY = GoBinary(
    "kube-apiserver-etcd", GO_ROOT / "kube", "./cmd/kube-apiserver-etcd", _KUBE_LDFLAGS
)
CONTROLLER_MANAGER_BINARY = GoBinary(
    "kube-controller-manager",
    GO_ROOT / "kube",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    _KUBE_LDFLAGS,
)
SCHEDULER_BINARY = GoBinary(
    "kube-scheduler", GO_ROOT / "kube", "k8s.io/kubernetes/cmd/kube-scheduler", _KUBE_LDFLAGS
)
KWOK_BINARY = GoBinary("kwok", GO_ROOT / "kwok", "sigs.k8s.io/kwok/cmd/kwok")

#: The control plane's binaries, in build order (the API server first: it is needed first).
CONTROL_PLANE_BINARIES: tuple[GoBinary, ...] = (
    APISERVER_BINARY,
    CONTROLLER_MANAGER_BINARY,
    SCHEDULER_BINARY,
    KWOK_BINARY,
)

#: Controllers of kube-controller-manager the test bed needs (fewer controllers, less memory):
#: namespaces, garbage collection, service accounts and their tokens, workloads (Jobs and
#: Deployments for users and operators), Services' endpoints, node health and eviction, RBAC
#: aggregation (admin/edit/view), the root CA ConfigMap, quotas and disruption budgets, the
#: removal of the protection finalizer of deleted PersistentVolumeClaims (a deleted claim stays
#: Terminating forever without it), the binding of claims to PersistentVolumes (those the
#: process node's local provisioner makes, see ``nodeagent/provisioner.py``) and the removal of
#: deleted volumes' protection finalizer.
KCM_CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "service-cidr-controller",
    "pod-garbage-collector-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "resourcequota-controller",
    "disruption-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
)


def _apiserver_args(ctx: ComponentContext) -> list[str]:
    layout, pki = ctx.layout, ctx.layout.pki_dir
    return [
        f"--etcd-data-dir={layout.data_dir}",
        f"--etcd-client-port={layout.ports.etcd_client}",
        f"--etcd-peer-port={layout.ports.etcd_peer}",
        "--",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={layout.ports.apiserver}",
        f"--tls-cert-file={ctx.serving_cert}",
        f"--tls-private-key-file={ctx.serving_key}",
        f"--client-ca-file={layout.ca_file}",
        "--authorization-mode=Node,RBAC",
        # The issuer is the API server's own URL, so that its OIDC discovery document and keys
        # (served by it) are found at the issuer, as Trainer's status server looks them up; the
        # in-cluster name stays accepted.
        f"--service-account-issuer={layout.apiserver_url}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-jwks-uri={layout.apiserver_url}/openid/v1/jwks",
        f"--service-account-key-file={pki / 'sa.key'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # The `kubernetes` Service cannot point at a loopback address; nothing in the test bed
        # reaches the API server through it (everything runs outside the cluster).
        "--endpoint-reconciler-type=none",
        # Kubelets are kwok's server on the nodes' InternalIP (loopback), with the cluster CA's
        # serving certificate; container logs go through it.
        f"--kubelet-client-certificate={pki / (KUBELET_CLIENT_STEM + '.crt')}",
        f"--kubelet-client-key={pki / (KUBELET_CLIENT_STEM + '.key')}",
        f"--kubelet-certificate-authority={layout.ca_file}",
        "--kubelet-preferred-address-types=InternalIP",
        "--profiling=false",
        "--event-ttl=1h",
    ]


def _secure_component_args(ctx: ComponentContext, port: int) -> list[str]:
    """Flags of a control-plane component that uses its own kubeconfig and serves HTTPS."""
    return [
        f"--kubeconfig={ctx.kubeconfig}",
        f"--authentication-kubeconfig={ctx.kubeconfig}",
        f"--authorization-kubeconfig={ctx.kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--tls-cert-file={ctx.serving_cert}",
        f"--tls-private-key-file={ctx.serving_key}",
        "--leader-elect=false",
    ]


def _controller_manager_args(ctx: ComponentContext) -> list[str]:
    layout = ctx.layout
    return [
        *_secure_component_args(ctx, layout.ports.controller_manager),
        "--use-service-account-credentials=true",
        f"--root-ca-file={layout.ca_file}",
        f"--service-account-private-key-file={layout.pki_dir / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--cluster-name={CLUSTER_NAME}",
        f"--controllers={','.join(KCM_CONTROLLERS)}",
        # Namespace teardown and garbage collection between tests are API-bound: raise the
        # client-side rate limit (default 20 qps).
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--profiling=false",
    ]


def _scheduler_args(ctx: ComponentContext) -> list[str]:
    return [*_secure_component_args(ctx, ctx.layout.ports.scheduler), "--profiling=false"]


def _kwok_args(ctx: ComponentContext) -> list[str]:
    layout = ctx.layout
    configs = [layout.config_dir / "kwok.yaml", *content.stage_files()]
    return [
        f"--kubeconfig={ctx.kubeconfig}",
        *(f"--config={path}" for path in configs),
        # One port: plain HTTP (health) and HTTPS (the kubelet API the API server calls).
        f"--server-address={LOOPBACK}:{layout.ports.kwok}",
        f"--tls-cert-file={ctx.serving_cert}",
        f"--tls-private-key-file={ctx.serving_key}",
        # Per-pod Logs objects are read from the API server (the default is in kwok.yaml).
        "--enable-crds=Logs",
    ]


APISERVER = Component(
    name="kube-apiserver",
    binary=APISERVER_BINARY.name,
    args=_apiserver_args,
    health=lambda layout: HealthCheck(f"{layout.apiserver_url}/readyz", client_cert=True),
    # Half the Go default: the heap (mostly the CRDs' schemas) then peaks at 1.5x the live data
    # instead of 2x, about 200 MB less, for a little more GC work on a mostly idle server.
    env={"GOGC": "50"},
)
CONTROLLER_MANAGER = Component(
    name="kube-controller-manager",
    binary=CONTROLLER_MANAGER_BINARY.name,
    args=_controller_manager_args,
    identity=Identity("system:kube-controller-manager"),
    health=lambda layout: HealthCheck(
        f"https://{LOOPBACK}:{layout.ports.controller_manager}/healthz"
    ),
)
SCHEDULER = Component(
    name="kube-scheduler",
    binary=SCHEDULER_BINARY.name,
    args=_scheduler_args,
    identity=Identity("system:kube-scheduler"),
    health=lambda layout: HealthCheck(f"https://{LOOPBACK}:{layout.ports.scheduler}/healthz"),
)
# kwok writes node and pod status, node leases, events and InferenceService status: it runs as
# a cluster administrator, like kwokctl does.
KWOK = Component(
    name="kwok",
    binary=KWOK_BINARY.name,
    args=_kwok_args,
    identity=Identity("kwok-controller", ("system:masters",)),
    health=lambda layout: HealthCheck(f"http://{LOOPBACK}:{layout.ports.kwok}/healthz"),
)

#: The control plane's processes after the API server, started once the CRDs are in.
CONTROL_PLANE_AFTER_CRDS: tuple[Component, ...] = (CONTROLLER_MANAGER, SCHEDULER, KWOK)

#: Every control-plane process, in start order.
CONTROL_PLANE: tuple[Component, ...] = (APISERVER, *CONTROL_PLANE_AFTER_CRDS)
