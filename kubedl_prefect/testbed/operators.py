"""Operators of the test bed: KubeDL (Volcano gangs), Kubeflow's, KServe, Trainer v2 and Kueue.

Eight processes run next to the control plane, seven built from a wrapper module of our own under
``go/`` (one per Kubernetes-library pin; see docs/operators.md for versions and findings):

- the **Volcano scheduler** (``vc-scheduler``), scheduler name ``volcano``, with a scheduler
  configuration of ours (:func:`volcano_scheduler_conf`);
- the **KubeDL manager** (``kubedl-manager``, Kubernetes 1.22 libraries), limited to the training
  workloads we use, gang scheduling through Volcano with one PodGroup per job;
- the **Kubeflow training operator** (``training-operator``, ``kubeflow.org/v1``), also gang
  scheduled through Volcano;
- the **KServe controller** (``kserve-manager``, built from KServe's own module), in Standard
  mode, its webhooks registered (pod mutator, defaulter, validators): see :mod:`.kserve`;
- the **JobSet controller** and the **Kubeflow Trainer v2 controller** (``trainer.kubeflow.org``
  TrainJobs run as JobSets), their webhooks registered with the API server: see :mod:`.trainer`;
- the **Kueue controller** (``kueue-manager``), quota admission of the jobs labelled with a
  LocalQueue, its webhooks registered too: see :mod:`.kueue`.

Besides its command line, each operator needs objects in the cluster before it starts (its RBAC,
Volcano's queues in the ``Open`` state, the Secret the Kubeflow operator's certificate rotator
fills, KServe's ConfigMap and serving runtimes): :func:`operator_manifests` lists them and
:func:`install_prerequisites` writes them, after the CRDs and before the operators start.
Files an operator reads (the Volcano configuration, the Kubeflow and KServe webhook serving
certificates) are written when its command line is built, so a
:class:`~kubedl_prefect.testbed.components.Component` row stays self-contained.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from kubedl_prefect.errors import KubeAPIError, TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CONFIG_MAPS,
    NAMESPACES,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
    VOLCANO_QUEUES,
    ResourceKind,
)
from kubedl_prefect.testbed import kserve, kueue, trainer
from kubedl_prefect.testbed.build import GO_ROOT, GoBinary, SourcePatch
from kubedl_prefect.testbed.cluster import create_or_update
from kubedl_prefect.testbed.components import (
    LOOPBACK,
    Component,
    ComponentContext,
    HealthCheck,
    Identity,
    Layout,
)
from kubedl_prefect.testbed.rbac import cluster_role_binding, upstream_cluster_role
from kubedl_prefect.testbed.upstream import (
    KUBEDL,
    KUBEFLOW_TRAINING,
    VOLCANO,
    module_file,
)

#: The Volcano release whose scheduler is built and whose CRDs are installed: v1.14.1, since
#: v1.15.0 needs a ``volcano.sh/apis`` newer than any the module proxy serves (docs/operators.md).
VOLCANO_SCHEDULER = VOLCANO
#: The published ``volcano.sh/apis`` it builds with (upstream uses a local staging copy).
VOLCANO_APIS_VERSION = "v1.14.0"

# --- binaries ---------------------------------------------------------------------------------

KUBEDL_BINARY = GoBinary(
    name="kubedl-manager",
    module=GO_ROOT / "kubedl",
    # The manager's main package is the module root of github.com/alibaba/kubedl.
    package="github.com/alibaba/kubedl",
    patches=(
        SourcePatch(
            module="github.com/alibaba/kubedl",
            file="pkg/metrics/monitor.go",
            old='fmt.Sprintf(":%s", strconv.Itoa(metricsPort))',
            new='fmt.Sprintf("127.0.0.1:%s", strconv.Itoa(metricsPort))',
            reason="--metrics-addr is a bare port, bound on every interface: loopback only",
        ),
    ),
)
KUBEFLOW_BINARY = GoBinary(
    name="training-operator",
    module=GO_ROOT / "kubeflow",
    package="github.com/kubeflow/training-operator/cmd/training-operator.v1",
    patches=(
        SourcePatch(
            module="github.com/kubeflow/training-operator",
            file="cmd/training-operator.v1/main.go",
            old="webhook.NewServer(webhook.Options{\n",
            new='webhook.NewServer(webhook.Options{\n\t\t\tHost: "127.0.0.1",\n',
            reason="the webhook server has no host flag and binds every interface: loopback only",
        ),
    ),
)
VOLCANO_BINARY = GoBinary(
    name="vc-scheduler",
    module=GO_ROOT / "volcano",
    package="volcano.sh/volcano/cmd/scheduler",
    ldflags=(f"-X volcano.sh/volcano/pkg/version.Version={VOLCANO_SCHEDULER.version}",),
)

#: Binaries of the operators, built like the control plane's (see :mod:`.build`).
OPERATOR_BINARIES: list[GoBinary] = [
    VOLCANO_BINARY,
    KUBEDL_BINARY,
    KUBEFLOW_BINARY,
    kserve.KSERVE_BINARY,
    trainer.JOBSET_BINARY,
    trainer.TRAINER_BINARY,
    kueue.KUEUE_BINARY,
]

# --- names, identities, ports -----------------------------------------------------------------

#: Scheduler name pods must carry to be placed by Volcano (both operators set it on gang jobs).
VOLCANO_SCHEDULER_NAME = "volcano"

#: Queue of PodGroups that name none (the scheduler's ``--default-queue``).
VOLCANO_DEFAULT_QUEUE = "default"

#: Namespace of the operators' own namespaced objects (the Kubeflow webhook Secret).
OPERATOR_NAMESPACE = "kubedl-prefect-system"

#: Secret the Kubeflow operator's certificate rotator keeps its webhook CA and certificate in.
KUBEFLOW_WEBHOOK_SECRET = "training-operator-webhook-cert"

#: Where the Kubeflow operator (v1.9) expects its webhook serving certificate: its rotator checks
#: this fixed path (``pkg/cert``); its webhook server reads ``$TMPDIR/k8s-webhook-server/...``,
#: the same folder unless ``$TMPDIR`` is set.
KUBEFLOW_WEBHOOK_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")

#: KubeDL workloads we enable (kinds). Mars would need networking/v1beta1 Ingress, removed in 1.22;
#: the others (ElasticDL, XDL, serving, models, crons, notebooks) are not used by kubedl-prefect.
KUBEDL_WORKLOADS = ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob")

#: Kubeflow schemes we enable (the same kinds; PaddleJob and JAXJob are not used).
KUBEFLOW_SCHEMES = ("pytorchjob", "tfjob", "mpijob", "xgboostjob")

# Client-certificate users of the operators. No ':' in them: the kubeconfig file is named after the
# user and KubeDL reads it from $KUBECONFIG, a ':'-separated list.
VOLCANO_IDENTITY = Identity("volcano-scheduler")
KUBEDL_IDENTITY = Identity("kubedl-operator")
KUBEFLOW_IDENTITY = Identity("kubeflow-training-operator")

#: Port offsets (see :class:`~kubedl_prefect.testbed.components.Ports`) of the operators' endpoints;
#: the control plane uses 43, 47, 57, 59, 79 and 80; KServe's are in :mod:`.kserve` (67-69),
#: Trainer's and JobSet's in :mod:`.trainer` (70-76), Kueue's in :mod:`.kueue` (81-83).
PORT_OFFSETS: dict[str, int] = {
    "volcano-metrics": 60,
    "volcano-healthz": 61,
    "kubedl-controller-metrics": 62,
    "kubedl-metrics": 63,
    "kubeflow-metrics": 64,
    "kubeflow-probe": 65,
    "kubeflow-webhook": 66,
    **kserve.PORT_OFFSETS,
    **trainer.PORT_OFFSETS,
    **kueue.PORT_OFFSETS,
}


def _port(layout: Layout, endpoint: str) -> int:
    return layout.ports.offset(PORT_OFFSETS[endpoint])


#: Concurrent reconciles per KubeDL controller (upstream default 1: one job at a time).
KUBEDL_MAX_RECONCILES = 8
#: Worker threads of each Kubeflow controller (upstream default 1).
KUBEFLOW_CONTROLLER_THREADS = 8
#: Volcano scheduling period (upstream default 1s): a session every 500 ms keeps admission latency
#: low; the cluster is tiny, so a session costs next to nothing.
VOLCANO_SCHEDULE_PERIOD = "500ms"

# --- Volcano ----------------------------------------------------------------------------------


def volcano_scheduler_conf() -> dict[str, Any]:
    """The Volcano scheduler configuration: actions and plugin tiers.

    ``enqueue`` admits a PodGroup (``Pending`` -> ``Inqueue``) only when its ``minResources`` fit
    the queue (``proportion``: the cluster, for the single default queue), so a job asking for
    more GPUs than exist stays ``Pending``; ``allocate`` places a gang all at once (``gang``) on
    nodes that fit (``predicates``, ``nodeorder``, ``binpack``); ``backfill`` places pods
    without requests.
    ``overcommit`` is left out on purpose: it would enqueue jobs up to 1.2x the idle resources.
    """
    return {
        "actions": "enqueue, allocate, backfill",
        "tiers": [
            {"plugins": [{"name": "priority"}, {"name": "gang"}, {"name": "conformance"}]},
            {
                "plugins": [
                    {"name": "drf"},
                    {"name": "predicates"},
                    {"name": "proportion"},
                    {"name": "nodeorder"},
                    {"name": "binpack"},
                ]
            },
        ],
    }


def volcano_conf_path(layout: Layout) -> Path:
    """Where the Volcano scheduler configuration of ``layout`` is written."""
    return layout.config_dir / "volcano-scheduler.conf"


def write_volcano_conf(layout: Layout) -> Path:
    """Write :func:`volcano_scheduler_conf` for ``layout``; return its path."""
    path = volcano_conf_path(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(volcano_scheduler_conf(), sort_keys=False))
    return path


def _kubeconfig(ctx: ComponentContext) -> Path:
    if ctx.kubeconfig is None:
        raise TestbedError("the training operators need a kubeconfig (a component identity)")
    return ctx.kubeconfig


def volcano_args(ctx: ComponentContext) -> list[str]:
    """Command line of the Volcano scheduler (writes its configuration file first)."""
    layout = ctx.layout
    conf = write_volcano_conf(ctx.layout)
    return [
        f"--kubeconfig={_kubeconfig(ctx)}",
        f"--scheduler-conf={conf}",
        f"--scheduler-name={VOLCANO_SCHEDULER_NAME}",
        f"--schedule-period={VOLCANO_SCHEDULE_PERIOD}",
        f"--default-queue={VOLCANO_DEFAULT_QUEUE}",
        "--leader-elect=false",
        "--enable-healthz=true",
        f"--healthz-address={LOOPBACK}:{_port(layout, 'volcano-healthz')}",
        "--enable-metrics=true",
        f"--listen-address={LOOPBACK}:{_port(layout, 'volcano-metrics')}",
        # The cache dumper writes JSON into /tmp on a signal: keep shared folders clean.
        "--cache-dumper=false",
        "--logtostderr=true",
        "-v=2",
    ]


def volcano_health(layout: Layout) -> HealthCheck:
    """The Volcano scheduler is up once its health endpoint answers."""
    return HealthCheck(f"http://{LOOPBACK}:{_port(layout, 'volcano-healthz')}/healthz")


# --- KubeDL -----------------------------------------------------------------------------------


def kubedl_args(ctx: ComponentContext) -> list[str]:
    """Command line of the KubeDL manager (flags as defined by its ``main.go``, v0.5.0).

    It takes its kubeconfig from ``$KUBECONFIG``, which the runner sets for every component with
    an identity: ``main.go`` parses only pflag flags (controller-runtime's ``--kubeconfig`` is a
    Go flag it never sees), and a package ``init`` builds a discovery client before any flag is
    parsed.
    """
    layout = ctx.layout
    return [
        f"--workloads={','.join(KUBEDL_WORKLOADS)}",
        f"--gang-scheduler-name={VOLCANO_SCHEDULER_NAME}",
        # DAGScheduling off: one PodGroup per job (all replicas in one gang), not one per replica
        # type. JobCoordinator (alpha) off: its queue panics (nil owner in Dequeue) when a job it
        # holds changes status, and Volcano's queue already does the queuing.
        "--feature-gates=DAGScheduling=false,JobCoordinator=false",
        f"--max-reconciles={KUBEDL_MAX_RECONCILES}",
        "--enable-leader-election=false",
        f"--controller-metrics-addr={LOOPBACK}:{_port(layout, 'kubedl-controller-metrics')}",
        # A bare port; the build patches KubeDL to bind it on loopback (KUBEDL_BINARY).
        f"--metrics-addr={_port(layout, 'kubedl-metrics')}",
    ]


def kubedl_health(layout: Layout) -> HealthCheck:
    """KubeDL has no health endpoint; its controller metrics answer once the manager started."""
    port = _port(layout, "kubedl-controller-metrics")
    return HealthCheck(f"http://{LOOPBACK}:{port}/metrics")


# --- Kubeflow ---------------------------------------------------------------------------------


def write_kubeflow_webhook_cert(ctx: ComponentContext) -> Path:
    """Put a webhook serving certificate where the Kubeflow operator looks for it.

    The operator's certificate rotator expects the certificate in a fixed folder (in its Pod, a
    mounted Secret) and its webhook server will not start without one. No webhook configuration
    points at it here, so any valid certificate will do: the test bed's loopback one.
    """
    folder = KUBEFLOW_WEBHOOK_CERT_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for source, name in ((ctx.serving_cert, "tls.crt"), (ctx.serving_key, "tls.key")):
            target = folder / name
            if not target.is_file():
                shutil.copyfile(source, target)
                target.chmod(0o600)
    except OSError as exc:
        raise TestbedError(
            f"could not write the Kubeflow operator's webhook certificate into {folder}: {exc}",
            hint=f"make {folder} writable, or remove it so that it is created again",
        ) from exc
    return folder


def kubeflow_args(ctx: ComponentContext) -> list[str]:
    """Command line of the Kubeflow training operator (writes its webhook certificate first)."""
    write_kubeflow_webhook_cert(ctx)
    layout = ctx.layout
    return [
        f"--kubeconfig={_kubeconfig(ctx)}",
        *(f"--enable-scheme={scheme}" for scheme in KUBEFLOW_SCHEMES),
        f"--gang-scheduler-name={VOLCANO_SCHEDULER_NAME}",
        "--leader-elect=false",
        f"--controller-threads={KUBEFLOW_CONTROLLER_THREADS}",
        f"--metrics-bind-address={LOOPBACK}:{_port(layout, 'kubeflow-metrics')}",
        f"--health-probe-bind-address={LOOPBACK}:{_port(layout, 'kubeflow-probe')}",
        # On loopback through a build patch (KUBEFLOW_BINARY); nothing is configured to call it.
        f"--webhook-server-port={_port(layout, 'kubeflow-webhook')}",
        f"--webhook-secret-name={KUBEFLOW_WEBHOOK_SECRET}",
        "--zap-devel=false",
    ]


def kubeflow_health(layout: Layout) -> HealthCheck:
    """Ready once certificates are in place and controllers are being set up (``/readyz``)."""
    return HealthCheck(f"http://{LOOPBACK}:{_port(layout, 'kubeflow-probe')}/readyz")


# --- cluster objects --------------------------------------------------------------------------


def _queue(name: str, *, reclaimable: bool) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": 1, "reclaimable": reclaimable},
        "status": {"state": "Open"},
    }


def operator_manifests() -> list[dict[str, Any]]:
    """Objects the operators need before they start, in the order they are written.

    - Volcano's ``root`` and ``default`` queues, as the scheduler would create them, but ``Open``:
      the scheduler only admits jobs to an open queue, and the component that opens queues
      (``vc-controller-manager``'s queue controller) is not run here;
    - KubeDL and Kubeflow run with the ClusterRoles their own releases ship (read from the pinned
      modules, renamed), bound to their client-certificate users;
    - the Volcano scheduler is bound to ``cluster-admin``: its ClusterRole exists upstream only
      inside a Helm template;
    - the Kubeflow operator's webhook Secret, in :data:`OPERATOR_NAMESPACE` (its role may update
      Secrets, not create them);
    - KServe's namespace, ConfigMap, ClusterRole and serving runtimes
      (:func:`.kserve.kserve_manifests`).

    - Trainer's and JobSet's ClusterRoles, Trainer's namespace and ServiceAccount
      (:func:`.trainer.trainer_manifests`); their webhooks and runtimes are written only once
      they run (:func:`install_after_start`);
    - Kueue's namespace and ClusterRoles (:func:`.kueue.kueue_manifests`).
    """
    kubedl_role = upstream_cluster_role(
        module_file(KUBEDL, "config/rbac/role.yaml"), KUBEDL_IDENTITY.user
    )
    kubeflow_role = upstream_cluster_role(
        module_file(KUBEFLOW_TRAINING, "manifests/base/rbac/role.yaml"), KUBEFLOW_IDENTITY.user
    )
    return [
        _queue("root", reclaimable=False),
        _queue(VOLCANO_DEFAULT_QUEUE, reclaimable=True),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        kubedl_role,
        cluster_role_binding(KUBEDL_IDENTITY.user, KUBEDL_IDENTITY.user, KUBEDL_IDENTITY.user),
        kubeflow_role,
        cluster_role_binding(
            KUBEFLOW_IDENTITY.user, KUBEFLOW_IDENTITY.user, KUBEFLOW_IDENTITY.user
        ),
        cluster_role_binding(VOLCANO_IDENTITY.user, "cluster-admin", VOLCANO_IDENTITY.user),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": KUBEFLOW_WEBHOOK_SECRET, "namespace": OPERATOR_NAMESPACE},
            "type": "Opaque",
        },
        *kserve.kserve_manifests(),
        *trainer.trainer_manifests(),
        *kueue.kueue_manifests(),
    ]


#: The kind of each object :func:`operator_manifests` returns.
_KINDS: dict[str, ResourceKind] = {
    kind.kind: kind
    for kind in (
        NAMESPACES,
        SECRETS,
        SERVICE_ACCOUNTS,
        CONFIG_MAPS,
        CLUSTER_ROLES,
        CLUSTER_ROLE_BINDINGS,
        ROLES,
        ROLE_BINDINGS,
        VOLCANO_QUEUES,
        kserve.CLUSTER_SERVING_RUNTIMES,
    )
}


async def install_prerequisites(kube: KubeClient) -> None:
    """Create or update :func:`operator_manifests` (idempotent: run it on every start).

    Args:
        kube: A client authenticated as the cluster administrator.

    Raises:
        TestbedError: The API server refused one of them.
    """
    for manifest in operator_manifests():
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            # A Queue's state is its status, written through the status subresource.
            await create_or_update(kube, _KINDS[kind], manifest, status="status" in manifest)
        except KubeAPIError as exc:
            raise TestbedError(
                f"the API server refused {kind} {name} for the training operators: {exc.message}"
            ) from exc


async def install_after_start(kube: KubeClient, layout: Layout) -> None:
    """Write what needs the operators running: webhook registrations, then training runtimes.

    KServe's webhooks (:func:`.kserve.install_after_start`); Trainer's and JobSet's webhooks,
    then Trainer's runtimes (through its validator); see :func:`.trainer.install_after_start`;
    then Kueue's webhooks, ResourceFlavor and priority classes
    (:func:`.kueue.install_after_start`). Idempotent.
    """
    await kserve.install_after_start(kube, layout)
    await trainer.install_after_start(kube, layout)
    await kueue.install_after_start(kube, layout)


# --- components -------------------------------------------------------------------------------

#: Processes of the operators, started once the control plane, nodes, CRDs and
#: :func:`operator_manifests` are in place; Volcano first, so gangs are scheduled from the start.
OPERATOR_COMPONENTS: list[Component] = [
    Component(
        name="volcano-scheduler",
        binary=VOLCANO_BINARY.name,
        args=volcano_args,
        identity=VOLCANO_IDENTITY,
        health=volcano_health,
    ),
    Component(
        name="kubedl-operator",
        binary=KUBEDL_BINARY.name,
        args=kubedl_args,
        identity=KUBEDL_IDENTITY,
        health=kubedl_health,
    ),
    Component(
        name="training-operator",
        binary=KUBEFLOW_BINARY.name,
        args=kubeflow_args,
        identity=KUBEFLOW_IDENTITY,
        health=kubeflow_health,
        # Namespace of its webhook Secret (in its Pod, the downward API sets it).
        env={"MY_POD_NAMESPACE": OPERATOR_NAMESPACE},
    ),
    kserve.KSERVE_COMPONENT,
    *trainer.TRAINER_COMPONENTS,
    kueue.KUEUE_COMPONENT,
]
