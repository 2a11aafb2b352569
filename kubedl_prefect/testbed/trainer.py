"""Kubeflow Trainer v2 and JobSet in the test bed: the real controllers, their webhooks registered.

Two more supervised processes next to the training operators (:mod:`.operators` lists them with
the others), each built from a wrapper module of ours under ``go/`` at the exact versions of
:data:`~kubedl_prefect.testbed.upstream.TRAINER` (v2.3.0) and
:data:`~kubedl_prefect.testbed.upstream.JOBSET` (v0.12.0):

- the **JobSet controller** (``jobset-controller``, the module root of ``sigs.k8s.io/jobset``)
  turns a JobSet into its Jobs (and a headless Service); the Job controller of
  kube-controller-manager makes the pods, which kwok runs like every other pod;
- the **Trainer controller** (``trainer-controller-manager``) turns a ``TrainJob`` into a JobSet
  from its runtime, a Volcano PodGroup when the runtime asks for gang scheduling, and copies the
  JobSet's outcome into the TrainJob's conditions. Its alpha feature gate ``TrainJobStatus`` is
  on, so its status server runs (``status.trainerStatus``).

Unlike the KServe controller, their webhooks are **registered** with the API server: what the
API server accepts or refuses here is what a real cluster with Trainer accepts or refuses (a
TrainJob setting a reserved ``PET_*`` variable is refused by Trainer's own validator). The
webhook configurations are read from the modules (with the patches their kustomizations apply),
their ``clientConfig`` pointed at the controllers' loopback ports by URL, with the test bed's CA
as ``caBundle``; both controllers serve the test bed's loopback certificate, their own
certificate management switched off in their ``--config`` files.

Everything else comes from the modules too, read at run time: the CRDs (:mod:`.content`), the
ClusterRoles (bound to each controller's client-certificate user) and the runtimes Trainer ships
(:func:`cluster_training_runtimes`). Runtimes are written once the Trainer's webhook answers
(its validator checks them), after the controllers started: see :func:`install_after_start`.

Trainer's status server has no host setting and binds every interface, reads its certificate
from a ``/tmp`` folder every test bed shares, and finds the token issuer in the in-Pod token
file: the build patches those three places (:data:`TRAINER_BINARY`); the test bed hands it a
TokenRequest token (:func:`write_token`) and runs the API server as its own issuer, so the
status server's OIDC discovery works outside a Pod. Also written from the test bed's PKI: the
Secret Trainer copies each TrainJob's status-server CA from (:func:`webhook_secret`).
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
from pathlib import Path
from typing import Any, Final

import yaml

from kubedl_prefect.errors import KubeAPIError, TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    SECRETS,
    SERVICE_ACCOUNTS,
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
from kubedl_prefect.testbed.rbac import cluster_role_binding, upstream_cluster_role
from kubedl_prefect.testbed.upstream import JOBSET, TRAINER, GoModule, module_file

#: Namespace Trainer believes it runs in (its default outside a Pod): where its ServiceAccount is.
TRAINER_NAMESPACE: Final = "kubeflow-system"
#: Trainer's ServiceAccount upstream (and the name its status-server URL is built from).
TRAINER_SERVICE_ACCOUNT: Final = "kubeflow-trainer-controller-manager"
#: Secret of Trainer's webhook certificate (its default name): with certificate management off
#: it is provided from outside (cert-manager's layout: ``ca.crt``, ``tls.crt``, ``tls.key``);
#: Trainer copies its ``ca.crt`` into each TrainJob's ``<name>-tls-config`` ConfigMap.
TRAINER_WEBHOOK_SECRET: Final = "kubeflow-trainer-webhook-cert"

#: Client-certificate users of the controllers (no ':', see :mod:`.operators`).
TRAINER_IDENTITY: Final = Identity("kubeflow-trainer-controller-manager")
JOBSET_IDENTITY: Final = Identity("jobset-controller-manager")

#: Port offsets of their endpoints (see :class:`~kubedl_prefect.testbed.components.Ports`).
PORT_OFFSETS: Final = {
    "trainer-webhook": 70,
    "trainer-metrics": 71,
    "trainer-probe": 72,
    "trainer-status-server": 73,
    "jobset-webhook": 74,
    "jobset-metrics": 75,
    "jobset-probe": 76,
}

#: Trainer's alpha feature gates we turn on (``TrainJobStatus``: its status server and
#: ``status.trainerStatus``).
TRAINER_FEATURE_GATES: Final = {"TrainJobStatus": True}

#: Concurrent reconciles of the Trainer controllers (upstream's configuration: 5 for TrainJobs).
TRAINER_CONCURRENCY: Final = {
    "TrainJob.trainer.kubeflow.org": 8,
    "TrainingRuntime.trainer.kubeflow.org": 1,
    "ClusterTrainingRuntime.trainer.kubeflow.org": 1,
}

#: Environment variable the patched build reads the token file's path from (see
#: :data:`TRAINER_BINARY`).
TOKEN_FILE_ENV: Final = "KUBEDL_PREFECT_TESTBED_SA_TOKEN_FILE"

#: ClusterTrainingRuntimes (``trainer.kubeflow.org/v1alpha1``, cluster-scoped).
CLUSTER_TRAINING_RUNTIMES: Final = ResourceKind(
    "trainer.kubeflow.org",
    "v1alpha1",
    "ClusterTrainingRuntime",
    "clustertrainingruntimes",
    namespaced=False,
)

#: Runtime files installed besides those of ``manifests/base/runtimes/kustomization.yaml``: the
#: Volcano variant of ``torch-distributed`` ships at v2.3.0 only as an example (the first
#: document of that file; the second is an example TrainJob, not installed).
EXTRA_RUNTIME_FILES: Final = ("examples/yaml/04-volcano-integration.yaml",)
#: The upstream Volcano variant (``podGroupPolicy.volcano``): Trainer makes a Volcano PodGroup
#: and annotates the pods with it, but leaves their ``schedulerName`` alone, so the default
#: scheduler places them one by one and the gang is not enforced.
VOLCANO_RUNTIME: Final = "torch-distributed-volcano"
#: A runtime of ours derived at run time from :data:`VOLCANO_RUNTIME`, identical but for
#: ``schedulerName: volcano`` in every pod template (``runtimePatches`` cannot set it): its pods
#: are placed by Volcano as one gang, and held with Volcano's reason when the gang does not fit.
VOLCANO_SCHEDULED_RUNTIME: Final = "torch-distributed-volcano-scheduler"

SCHEDULER_PLUGINS: Final = GoModule("sigs.k8s.io/scheduler-plugins", "v0.35.4-devel")
"""The scheduler-plugins module Trainer v2.3.0's ``go.mod`` requires: its PodGroup
(``scheduling.x-k8s.io/v1alpha1``) is what a ``coscheduling`` runtime makes. Only its CRD is
used (:func:`coscheduling_podgroup_crd`); the coscheduling scheduler plugin itself does not run
in the test bed, so such a PodGroup admits nothing: its pods go to the default scheduler."""
#: Label on runtimes the test bed derives, naming the upstream runtime.
DERIVED_FROM_LABEL: Final = "testbed.kubedl-prefect.io/derived-from"
#: Scheduler name of Volcano (as :data:`.operators.VOLCANO_SCHEDULER_NAME`, which imports us).
VOLCANO_SCHEDULER_NAME: Final = "volcano"

# --- binaries ---------------------------------------------------------------------------------

TRAINER_BINARY: Final = GoBinary(
    name="trainer-controller-manager",
    module=GO_ROOT / "trainer",
    package="github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
    patches=(
        SourcePatch(
            module=TRAINER.path,
            file="pkg/statusserver/server.go",
            old='Addr:         fmt.Sprintf(":%d", *cfg.Port),',
            new='Addr:         fmt.Sprintf("127.0.0.1:%d", *cfg.Port),',
            reason="the status server has no host setting and binds every interface: loopback",
        ),
        SourcePatch(
            module=TRAINER.path,
            file="pkg/util/cert/cert.go",
            old='var certDir = "/tmp/k8s-webhook-server/serving-certs"',
            new='var certDir = os.TempDir() + "/k8s-webhook-server/serving-certs"',
            reason="the status server reads its certificate from a /tmp folder every test bed "
            "shares; read it where the webhook server does ($TMPDIR), one folder per test bed",
        ),
        SourcePatch(
            module=TRAINER.path,
            file="pkg/statusserver/auth.go",
            old='os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/token")',
            new=f'os.ReadFile(os.Getenv("{TOKEN_FILE_ENV}"))',
            reason="the status server finds the cluster's token issuer in its Pod's token; "
            "outside a Pod the test bed hands it a TokenRequest token in a file",
        ),
    ),
)
JOBSET_BINARY: Final = GoBinary(
    name="jobset-controller",
    module=GO_ROOT / "jobset",
    # The manager's main package is the module root of sigs.k8s.io/jobset.
    package=JOBSET.path,
    ldflags=(f"-X {JOBSET.path}/pkg/version.GitVersion={JOBSET.version}",),
)


def _port(layout: Layout, endpoint: str) -> int:
    return layout.ports.offset(PORT_OFFSETS[endpoint])


# --- certificates and configuration files -----------------------------------------------------


def _tmpdir(layout: Layout, component: str) -> Path:
    return layout.config_dir / f"{component}-tmp"


def _write_serving_cert(ctx: ComponentContext, folder: Path) -> Path:
    """Copy the test bed's loopback serving certificate into ``folder`` (``tls.crt``/``.key``).

    Issued by the test bed's CA for IP 127.0.0.1: the CA the webhook configurations name.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for source, name in ((ctx.serving_cert, "tls.crt"), (ctx.serving_key, "tls.key")):
        target = folder / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
    return folder


def trainer_configuration(layout: Layout) -> dict[str, Any]:
    """Trainer's ``Configuration`` (``config.trainer.kubeflow.org/v1alpha1``) for ``layout``.

    Every listener on loopback, certificate management off (the webhook and status servers read
    the test bed's certificate from ``$TMPDIR/k8s-webhook-server/serving-certs``), no leader
    election, plain-HTTP metrics (no token review per scrape), :data:`TRAINER_FEATURE_GATES`.

    Example:
        >>> from kubedl_prefect.testbed.components import Ports
        >>> config = trainer_configuration(Layout(ports=Ports(28400)))
        >>> config["webhook"], config["certManagement"], config["featureGates"]
        ({'host': '127.0.0.1', 'port': 28470}, {'enable': False}, {'TrainJobStatus': True})
    """
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "webhook": {"host": LOOPBACK, "port": _port(layout, "trainer-webhook")},
        "metrics": {
            "bindAddress": f"{LOOPBACK}:{_port(layout, 'trainer-metrics')}",
            "secureServing": False,
        },
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{_port(layout, 'trainer-probe')}"},
        "controller": {"groupKindConcurrency": dict(TRAINER_CONCURRENCY)},
        "certManagement": {"enable": False},
        "statusServer": {"port": _port(layout, "trainer-status-server")},
        "featureGates": dict(TRAINER_FEATURE_GATES),
    }


def jobset_configuration(layout: Layout) -> dict[str, Any]:
    """JobSet's ``Configuration`` (``config.jobset.x-k8s.io/v1alpha1``) for ``layout``.

    Every listener on loopback, internal certificate management off, the webhook and the
    (authenticated HTTPS) metrics servers reading the test bed's certificate from
    :func:`jobset_cert_dir`, no leader election.
    """
    certs = str(jobset_cert_dir(layout))
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "webhook": {"host": LOOPBACK, "port": _port(layout, "jobset-webhook"), "certDir": certs},
        "metrics": {
            "bindAddress": f"{LOOPBACK}:{_port(layout, 'jobset-metrics')}",
            "certDir": certs,
        },
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{_port(layout, 'jobset-probe')}"},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
    }


def jobset_cert_dir(layout: Layout) -> Path:
    """Where the JobSet controller reads its serving certificate."""
    return layout.config_dir / "jobset-certs"


def token_file(layout: Layout) -> Path:
    """Where Trainer's ServiceAccount token is written for its status server (see the module)."""
    return layout.config_dir / "trainer-serviceaccount.token"


async def _service_account_token(kube: KubeClient) -> str:
    """A token of Trainer's ServiceAccount, from the TokenRequest API."""
    requests = ResourceKind(
        "", "v1", "TokenRequest", f"{SERVICE_ACCOUNTS.plural}/{TRAINER_SERVICE_ACCOUNT}/token"
    )
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 7 * 24 * 3600},
    }
    try:
        answer = await kube.create(requests, TRAINER_NAMESPACE, body)
    except KubeAPIError as exc:
        raise TestbedError(f"could not get a token for Trainer: {exc.message}") from exc
    return str(answer["status"]["token"])


def token_issuer(token: str) -> str:
    """The ``iss`` claim of a JWT (read without checking its signature, as Trainer does).

    Example:
        >>> payload = base64.urlsafe_b64encode(b'{"iss":"https://127.0.0.1:28443"}')
        >>> token_issuer("e30." + payload.decode().rstrip("=") + ".sig")
        'https://127.0.0.1:28443'
    """
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return str(claims["iss"])
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise TestbedError(f"the service-account token is not a JWT with an issuer: {exc}") from exc


def write_token(layout: Layout) -> Path:
    """Write a fresh token of Trainer's ServiceAccount to :func:`token_file`; return its path.

    Trainer's status server reads the cluster's token issuer from it at start (in a Pod, from
    the projected token) and then discovers the issuer's keys from the API server.
    """
    token = cluster.call(layout, _service_account_token)
    issuer = token_issuer(token)
    if issuer != layout.apiserver_url:
        raise TestbedError(
            f"the API server of test bed {layout.name} issues service-account tokens as "
            f"{issuer!r}, not as itself ({layout.apiserver_url}): Trainer's status server "
            "could not find the issuer's keys",
            hint=f"it was started by an older kubedl-prefect: run `kubedl-prefect testbed down "
            f"--name {layout.name}`, then `up`",
        )
    path = token_file(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token)
    path.chmod(0o600)
    return path


def _write_config(layout: Layout, name: str, document: dict[str, Any]) -> Path:
    path = layout.config_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def trainer_args(ctx: ComponentContext) -> list[str]:
    """Command line of the Trainer controller (writes its configuration, certificate, token)."""
    layout = ctx.layout
    _write_serving_cert(ctx, _tmpdir(layout, "trainer") / "k8s-webhook-server" / "serving-certs")
    write_token(layout)
    config = _write_config(layout, "trainer-configuration.yaml", trainer_configuration(layout))
    return [f"--config={config}", f"--kubeconfig={ctx.kubeconfig}", "--zap-devel=false"]


def trainer_env(ctx: ComponentContext) -> dict[str, str]:
    """Its ``$TMPDIR`` (certificate folder) and the token file of its status server."""
    return {
        "TMPDIR": str(_tmpdir(ctx.layout, "trainer")),
        TOKEN_FILE_ENV: str(token_file(ctx.layout)),
    }


def jobset_args(ctx: ComponentContext) -> list[str]:
    """Command line of the JobSet controller (writes its configuration and certificate)."""
    layout = ctx.layout
    _write_serving_cert(ctx, jobset_cert_dir(layout))
    config = _write_config(layout, "jobset-configuration.yaml", jobset_configuration(layout))
    return [
        f"--config={config}",
        f"--kubeconfig={ctx.kubeconfig}",
        "--leader-elect=false",
        "--zap-devel=false",
    ]


def trainer_health(layout: Layout) -> HealthCheck:
    """Ready once its webhook server serves (``/readyz``; controllers are set up just before)."""
    return HealthCheck(f"http://{LOOPBACK}:{_port(layout, 'trainer-probe')}/readyz")


def jobset_health(layout: Layout) -> HealthCheck:
    """Ready once its webhook server serves (``/readyz``)."""
    return HealthCheck(f"http://{LOOPBACK}:{_port(layout, 'jobset-probe')}/readyz")


# --- cluster objects --------------------------------------------------------------------------


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def apply_json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> None:
    """Apply the ``add``/``replace`` operations of an RFC 6902 patch to ``document`` in place.

    Enough for the patches the upstream kustomizations apply to their webhook configurations.

    Example:
        >>> doc = {"metadata": {"name": "a"}, "webhooks": [{"name": "w"}]}
        >>> apply_json_patch(doc, [
        ...     {"op": "replace", "path": "/metadata/name", "value": "b"},
        ...     {"op": "add", "path": "/webhooks/0/objectSelector", "value": {}}])
        >>> doc
        {'metadata': {'name': 'b'}, 'webhooks': [{'name': 'w', 'objectSelector': {}}]}
    """
    for operation in operations:
        op, path = operation.get("op"), str(operation.get("path", ""))
        if op not in ("add", "replace") or not path.startswith("/"):
            raise TestbedError(f"unsupported JSON patch operation {operation!r}")
        keys = [k.replace("~1", "/").replace("~0", "~") for k in path[1:].split("/")]
        parent: Any = document
        for key in keys[:-1]:
            parent = parent[int(key)] if isinstance(parent, list) else parent[key]
        last = keys[-1]
        value = copy.deepcopy(operation["value"])
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            elif op == "add":
                parent.insert(int(last), value)
            else:
                parent[int(last)] = value
        else:
            parent[last] = value


def _kustomized_webhooks(folder: str, module_files: dict[str, Path]) -> list[dict[str, Any]]:
    """The webhook configurations of an upstream ``webhook`` folder, patched as it says.

    Its kustomization's JSON patches are applied (each targets one kind, optionally one name).
    """
    kustomization = yaml.safe_load(module_files["kustomization"].read_text())
    documents = [
        d
        for d in _documents(module_files["manifests"])
        if d.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    base = module_files["kustomization"].parent
    for patch in kustomization.get("patches") or []:
        target = patch.get("target") or {}
        operations = yaml.safe_load((base / patch["path"]).read_text())
        for document in documents:
            if document["kind"] != target.get("kind"):
                continue
            if target.get("name") and document["metadata"]["name"] != target["name"]:
                continue
            apply_json_patch(document, operations)
    if not documents:
        raise TestbedError(f"no webhook configurations in {folder}")
    return documents


def _point_at_loopback(
    documents: list[dict[str, Any]], *, port: int, ca_bundle: str, name_prefix: str = ""
) -> list[dict[str, Any]]:
    """The webhook configurations with their Service references replaced by loopback URLs."""
    result = []
    for document in documents:
        document = copy.deepcopy(document)
        document["metadata"] = {"name": name_prefix + document["metadata"]["name"]}
        for webhook in document.get("webhooks") or []:
            service = (webhook.get("clientConfig") or {}).get("service") or {}
            path = service.get("path", "/")
            webhook["clientConfig"] = {
                "url": f"https://{LOOPBACK}:{port}{path}",
                "caBundle": ca_bundle,
            }
        result.append(document)
    return result


def _ca_bundle(layout: Layout) -> str:
    return base64.b64encode(layout.ca_file.read_bytes()).decode()


def trainer_webhooks(layout: Layout) -> list[dict[str, Any]]:
    """Trainer's webhook configurations (``manifests/base/webhook``), on its loopback port.

    Named as upstream's kustomization names them (``validator.trainer.kubeflow.org``,
    ``defaulter.trainer.kubeflow.org``), with its object selectors.
    """
    documents = _kustomized_webhooks(
        "manifests/base/webhook of Trainer",
        {
            "kustomization": module_file(TRAINER, "manifests/base/webhook/kustomization.yaml"),
            "manifests": module_file(TRAINER, "manifests/base/webhook/manifests.yaml"),
        },
    )
    return _point_at_loopback(
        documents, port=_port(layout, "trainer-webhook"), ca_bundle=_ca_bundle(layout)
    )


def jobset_webhooks(layout: Layout) -> list[dict[str, Any]]:
    """JobSet's webhook configurations (``config/components/webhook``), on its loopback port.

    Named with the ``jobset-`` prefix of upstream's default kustomization; the pod webhooks
    keep their object selector (only pods of a JobSet go through them).
    """
    documents = _kustomized_webhooks(
        "config/components/webhook of JobSet",
        {
            "kustomization": module_file(JOBSET, "config/components/webhook/kustomization.yaml"),
            "manifests": module_file(JOBSET, "config/components/webhook/manifests.yaml"),
        },
    )
    return _point_at_loopback(
        documents,
        port=_port(layout, "jobset-webhook"),
        ca_bundle=_ca_bundle(layout),
        name_prefix="jobset-",
    )


def trainer_manifests() -> list[dict[str, Any]]:
    """Objects both controllers need before they start, in the order they are written.

    - their ClusterRoles, read from the modules (Trainer's ``manifests/base/rbac/role.yaml``,
      JobSet's ``config/components/rbac/role.yaml`` and the ``proxy-role`` its authenticated
      metrics server needs), renamed after and bound to their client-certificate users;
    - Trainer's namespace and ServiceAccount (its status server's token, see the module), and
      the built-in ``system:service-account-issuer-discovery`` role for its user: in a Pod it
      has that through the group ``system:serviceaccounts``.
    """
    trainer, jobset = TRAINER_IDENTITY.user, JOBSET_IDENTITY.user
    return [
        upstream_cluster_role(module_file(TRAINER, "manifests/base/rbac/role.yaml"), trainer),
        cluster_role_binding(trainer, trainer, trainer),
        cluster_role_binding(
            f"{trainer}-issuer-discovery", "system:service-account-issuer-discovery", trainer
        ),
        upstream_cluster_role(module_file(JOBSET, "config/components/rbac/role.yaml"), jobset),
        cluster_role_binding(jobset, jobset, jobset),
        upstream_cluster_role(
            module_file(JOBSET, "config/components/rbac/auth_proxy_role.yaml"),
            f"{jobset}-metrics-auth",
        ),
        cluster_role_binding(f"{jobset}-metrics-auth", f"{jobset}-metrics-auth", jobset),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINER_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": TRAINER_SERVICE_ACCOUNT, "namespace": TRAINER_NAMESPACE},
        },
    ]


def _runtime_files() -> list[Path]:
    """Files of ``manifests/base/runtimes`` as its kustomizations list them, then the extras."""
    files: list[Path] = []

    def walk(kustomization: Path) -> None:
        listed = yaml.safe_load(kustomization.read_text()).get("resources") or []
        for entry in listed:
            path = kustomization.parent / entry
            if path.is_dir():
                walk(path / "kustomization.yaml")
            else:
                files.append(path)

    walk(module_file(TRAINER, "manifests/base/runtimes/kustomization.yaml"))
    files += [module_file(TRAINER, name) for name in EXTRA_RUNTIME_FILES]
    return files


def cluster_training_runtimes() -> list[dict[str, Any]]:
    """The ClusterTrainingRuntimes of Trainer's release, as upstream ships them.

    Every runtime ``manifests/base/runtimes`` lists (``torch-distributed``, the MPI runtimes
    ``deepspeed-distributed`` and ``mlx-distributed``, ``jax-distributed``,
    ``xgboost-distributed``, the torchtune ones), the Volcano variant
    ``torch-distributed-volcano`` from :data:`EXTRA_RUNTIME_FILES`, and, last, the one the test
    bed derives from it (:func:`volcano_scheduled_runtime`).

    Raises:
        TestbedError: The module's layout changed (no runtimes found).
    """
    runtimes = [
        d
        for path in _runtime_files()
        for d in _documents(path)
        if d.get("kind") == "ClusterTrainingRuntime"
    ]
    if not runtimes:
        raise TestbedError(f"no ClusterTrainingRuntime in {TRAINER.path}@{TRAINER.version}")
    by_name = {r["metadata"]["name"]: r for r in runtimes}
    if VOLCANO_RUNTIME not in by_name:
        raise TestbedError(f"no {VOLCANO_RUNTIME} runtime in {TRAINER.path}@{TRAINER.version}")
    return [*runtimes, volcano_scheduled_runtime(by_name[VOLCANO_RUNTIME])]


def volcano_scheduled_runtime(upstream: dict[str, Any]) -> dict[str, Any]:
    """:data:`VOLCANO_SCHEDULED_RUNTIME`: ``upstream`` with its pods scheduled by Volcano.

    Example:
        >>> runtime = volcano_scheduled_runtime({
        ...     "metadata": {"name": "torch-distributed-volcano", "labels": {"a": "b"}},
        ...     "spec": {"template": {"spec": {"replicatedJobs": [
        ...         {"name": "node", "template": {"spec": {"template": {"spec": {}}}}}]}}}})
        >>> runtime["metadata"]["name"]
        'torch-distributed-volcano-scheduler'
        >>> runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
        {'template': {'spec': {'schedulerName': 'volcano'}}}
    """
    runtime = copy.deepcopy(upstream)
    labels = dict(runtime["metadata"].get("labels") or {})
    labels[DERIVED_FROM_LABEL] = upstream["metadata"]["name"]
    runtime["metadata"] = {"name": VOLCANO_SCHEDULED_RUNTIME, "labels": labels}
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"].setdefault("spec", {}).setdefault("template", {})
        pod.setdefault("spec", {})["schedulerName"] = VOLCANO_SCHEDULER_NAME
    return runtime


def coscheduling_podgroup_crd() -> dict[str, Any]:
    """scheduler-plugins' PodGroup CRD from :data:`SCHEDULER_PLUGINS` (downloaded if missing).

    Trainer's coscheduling plugin watches PodGroups only when this CRD exists at its start
    ("PodGroup CRDs must be installed in advance"): install it, then (re)start Trainer.

    Raises:
        TestbedError: The module has no such file.
    """
    path = module_file(SCHEDULER_PLUGINS, "config/crd/bases/scheduling.x-k8s.io_podgroups.yaml")
    (crd,) = [d for d in _documents(path) if d.get("kind") == "CustomResourceDefinition"]
    return crd


def coscheduling_runtime(
    upstream: dict[str, Any], name: str, schedule_timeout_s: int = 60
) -> dict[str, Any]:
    """``upstream`` (a ClusterTrainingRuntime) as ``name`` with a ``coscheduling`` podGroupPolicy.

    Example:
        >>> runtime = coscheduling_runtime(
        ...     {"metadata": {"name": "torch-distributed"}, "spec": {"mlPolicy": {}}}, "cosched")
        >>> runtime["metadata"]["name"], runtime["spec"]["podGroupPolicy"]
        ('cosched', {'coscheduling': {'scheduleTimeoutSeconds': 60}})
    """
    runtime = copy.deepcopy(upstream)
    labels = dict(runtime["metadata"].get("labels") or {})
    labels[DERIVED_FROM_LABEL] = upstream["metadata"]["name"]
    runtime["metadata"] = {"name": name, "labels": labels}
    runtime["spec"]["podGroupPolicy"] = {
        "coscheduling": {"scheduleTimeoutSeconds": schedule_timeout_s}
    }
    return runtime


#: What :func:`install_after_start` writes.
_KINDS: Final = (
    CLUSTER_ROLES,
    CLUSTER_ROLE_BINDINGS,
    NAMESPACES,
    SECRETS,
    SERVICE_ACCOUNTS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    CLUSTER_TRAINING_RUNTIMES,
)


def webhook_secret(layout: Layout) -> dict[str, Any]:
    """:data:`TRAINER_WEBHOOK_SECRET` with the test bed's CA and loopback serving certificate."""
    pki = layout.pki_dir

    def encoded(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TRAINER_WEBHOOK_SECRET, "namespace": TRAINER_NAMESPACE},
        "type": "kubernetes.io/tls",
        "data": {
            "ca.crt": encoded(layout.ca_file),
            "tls.crt": encoded(pki / "serving.crt"),
            "tls.key": encoded(pki / "serving.key"),
        },
    }


def after_start_manifests(layout: Layout) -> list[dict[str, Any]]:
    """What is written once the controllers answer, in order.

    Trainer's certificate Secret, the webhook configurations, then the runtimes.
    """
    return [
        webhook_secret(layout),
        *jobset_webhooks(layout),
        *trainer_webhooks(layout),
        *cluster_training_runtimes(),
    ]


async def install_after_start(kube: KubeClient, layout: Layout) -> None:
    """Register the webhooks and install the runtimes (idempotent; the controllers must run).

    With ``failurePolicy: Fail`` the webhooks refuse TrainJobs and JobSets while their
    controller is down, as on a real cluster; the runtimes are written through Trainer's own
    validator.
    """
    await cluster.write_in_order(kube, _KINDS, after_start_manifests(layout), "Trainer and JobSet")


#: The controllers' process rows: JobSet first (Trainer's JobSets need its webhook).
TRAINER_COMPONENTS: Final = (
    Component(
        name="jobset-controller",
        binary=JOBSET_BINARY.name,
        args=jobset_args,
        identity=JOBSET_IDENTITY,
        health=jobset_health,
    ),
    Component(
        name="trainer-controller",
        binary=TRAINER_BINARY.name,
        args=trainer_args,
        identity=TRAINER_IDENTITY,
        health=trainer_health,
        env_from=trainer_env,
    ),
)
