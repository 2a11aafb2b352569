"""Prefect blocks of the model chain: the MLflow registry a flow registers into, and KServe serving.

:class:`MlflowRegistry` says where the tracking server and the model registry are, as this
process and as the training pods reach them, with which credentials (``SecretStr``: stored
encrypted, shown as ``********``) and where the artifact store is for KServe.
:class:`KServeServing` says where and how a model version is served: the cluster, the
namespace, the runtime, the resources, the replicas and the time limits.

Both register with a Prefect server with the training blocks, through
:mod:`kubedl_prefect.prefect.collection` (the ``prefect.collections`` entry point, or
``prefect block register -m kubedl_prefect.prefect.collection``). Neither imports MLflow or the
Kubernetes client when it is loaded: Prefect imports the blocks at the start of every command.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from prefect.blocks.core import Block
from pydantic import ConfigDict, Field, HttpUrl, SecretStr, model_validator

from kubedl_prefect.errors import has_user_info
from kubedl_prefect.prefect.blocks import (
    DOCUMENTATION_URL,
    KubernetesCluster,
    ablock_from,
    block_from,
)
from kubedl_prefect.serving.spec import (
    DeploymentMode,
    InferenceServiceSpec,
    ModelLink,
    Protocol,
    ServingResources,
)
from kubedl_prefect.spec.handoff import PASSWORD_ENV, TOKEN_ENV, USERNAME_ENV, TrackingCredentials
from kubedl_prefect.spec.kube_types import Toleration

if TYPE_CHECKING:
    from kubedl_prefect.registry.events import ModelVersionCallback
    from kubedl_prefect.registry.mlflow_registry import ModelRegistry
    from kubedl_prefect.serving.deploy import InferenceServiceDeployer


MLFLOW_LOGO_URL = "https://raw.githubusercontent.com/mlflow/mlflow/master/assets/icon.svg"
"""MLflow's own icon, from its repository's ``assets/`` (the square mark of its logo)."""
KSERVE_LOGO_URL = (
    "https://raw.githubusercontent.com/cncf/artwork/main/projects/kserve/icon/color/"
    "k-serve-icon-color.png"
)
"""KServe's icon, in colour, from the CNCF's artwork repository (where its projects keep theirs)."""


class MlflowRegistry(Block):
    """An MLflow tracking server and model registry: where trained models become versions.

    ``tracking_uri`` is the server as the flow's process reaches it; ``pod_tracking_uri`` as the
    training pods do (an in-cluster Service, say). This process authenticates with ``username`` +
    ``password`` or ``token`` (kept secret; handed to MLflow through its own variables
    ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN`` in this process's environment, never
    logged); the pods read theirs from a Kubernetes Secret (``pod_credentials_secret`` and its
    keys), so no credential ever appears in a job's manifest. A URI with ``user:password@`` in
    it is refused: it would show the password wherever the URI is shown.

    Example:
        Save it once, use it by name in flows::

            from pydantic import SecretStr
            from kubedl_prefect.prefect import MlflowRegistry

            MlflowRegistry(
                tracking_uri="https://mlflow.example.com",
                pod_tracking_uri="http://mlflow.ml.svc:5000",
                username="ci",
                password=SecretStr("..."),
                pod_credentials_secret="mlflow-auth",
                pod_username_key="username",
                pod_password_key="password",
                artifact_destination="s3://ml-artifacts",
            ).save("mlflow", overwrite=True)
            registry = MlflowRegistry.load("BLOCK_NAME").registry()  # here: "mlflow"
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    _block_type_name: ClassVar[str] = "KubeDL MLflow Registry"
    _block_type_slug: ClassVar[str] = "kubedl-mlflow-registry"
    _logo_url: ClassVar[HttpUrl | None] = HttpUrl(MLFLOW_LOGO_URL)
    _documentation_url: ClassVar[HttpUrl | None] = DOCUMENTATION_URL
    _description: ClassVar[str] = (
        "An MLflow tracking server and model registry for trained models: the experiment, "
        "credentials (kept secret), and where its artifact store is for KServe."
    )

    tracking_uri: str = Field(
        title="Tracking URI",
        description="The tracking server as the flow's process reaches it (http(s)://...).",
    )
    registry_uri: str | None = Field(
        default=None,
        title="Registry URI",
        description="The model registry, when it is not the tracking server.",
    )
    pod_tracking_uri: str | None = Field(
        default=None,
        title="Tracking URI for the pods",
        description="The tracking server as the training pods reach it (default: the same).",
    )
    experiment: str | None = Field(
        default=None,
        title="Experiment",
        description="The experiment the training runs go into (default: the spec's name).",
    )
    username: str | None = Field(
        default=None, title="Username", description="Basic-auth user of this process."
    )
    password: SecretStr | None = Field(
        default=None, title="Password", description="Basic-auth password (kept secret)."
    )
    token: SecretStr | None = Field(
        default=None, title="Token", description="Or a bearer token (kept secret)."
    )
    pod_credentials_secret: str | None = Field(
        default=None,
        title="Credentials Secret for the pods",
        description="A Kubernetes Secret in the job's namespace the pods read credentials from.",
    )
    pod_username_key: str | None = Field(
        default=None,
        title="Its username key",
        description="The key of that Secret holding the username (MLFLOW_TRACKING_USERNAME).",
    )
    pod_password_key: str | None = Field(
        default=None,
        title="Its password key",
        description="The key of that Secret holding the password (MLFLOW_TRACKING_PASSWORD).",
    )
    pod_token_key: str | None = Field(
        default=None,
        title="Its token key",
        description="The key of that Secret holding a bearer token (MLFLOW_TRACKING_TOKEN).",
    )
    artifact_destination: str | None = Field(
        default=None,
        title="Artifact destination",
        description=(
            "The server's --artifacts-destination (s3://..., gs://...): what mlflow-artifacts:/ "
            "locations stand for, so that KServe can read them."
        ),
    )
    storage_rewrites: dict[str, str] = Field(
        default_factory=dict,
        title="Storage rewrites",
        description="Prefixes of resolved locations to replace (a store mounted for the cluster).",
    )
    ready_timeout_s: float = Field(
        default=300.0,
        gt=0,
        title="Version ready (s)",
        description="How long a registration waits for the version to be READY.",
    )

    @model_validator(mode="after")
    def _no_credentials_in_uris(self) -> MlflowRegistry:
        # A password in a URI would show in the block's JSON, its repr and every error quoting it.
        from kubedl_prefect.registry.uris import CREDENTIALS_HINT

        for name in ("tracking_uri", "registry_uri", "pod_tracking_uri"):
            uri = getattr(self, name)
            if uri is not None and has_user_info(uri):
                raise ValueError(f"{name} holds user info (user:password@): {CREDENTIALS_HINT}")
        return self

    @model_validator(mode="after")
    def _one_way_to_authenticate(self) -> MlflowRegistry:
        if self.token is not None and (self.username is not None or self.password is not None):
            raise ValueError("give username + password or a token, not both")
        if (self.username is None) != (self.password is None):
            raise ValueError("basic authentication needs both username and password")
        keys = (self.pod_username_key, self.pod_password_key, self.pod_token_key)
        if any(keys) and not self.pod_credentials_secret:
            raise ValueError("the pod credential keys need pod_credentials_secret, the Secret")
        return self

    def pod_credentials(self) -> TrackingCredentials | None:
        """Where the pods read the tracking credentials (``None``: they need none).

        Example:
            >>> MlflowRegistry(tracking_uri="http://mlflow:5000", pod_credentials_secret="auth",
            ...                pod_token_key="token").pod_credentials().secret
            'auth'
        """
        if not self.pod_credentials_secret:
            return None
        return TrackingCredentials(
            self.pod_credentials_secret,
            username_key=self.pod_username_key,
            password_key=self.pod_password_key,
            token_key=self.pod_token_key,
        )

    def export_credentials(self) -> list[str]:
        """Put this process's credentials where MLflow reads them; return the variables set.

        MLflow's client reads ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN`` from the
        environment on every request; values already there are replaced only by given ones.
        """
        values: dict[str, str] = {}
        if self.username is not None and self.password is not None:
            values = {USERNAME_ENV: self.username, PASSWORD_ENV: self.password.get_secret_value()}
        elif self.token is not None:
            values = {TOKEN_ENV: self.token.get_secret_value()}
        os.environ.update(values)
        return sorted(values)

    def registry(self, *, on_event: ModelVersionCallback | None = None) -> ModelRegistry:
        """The registry client (MLflow is imported here, not when the block loads).

        Args:
            on_event: Called with each model-version event record.
        """
        from kubedl_prefect.registry.mlflow_registry import ModelRegistry

        self.export_credentials()
        return ModelRegistry(
            self.tracking_uri,
            registry_uri=self.registry_uri,
            pod_tracking_uri=self.pod_tracking_uri,
            credentials=self.pod_credentials(),
            artifact_destination=self.artifact_destination,
            storage_rewrites=self.storage_rewrites,
            on_event=on_event,
            ready_timeout_s=self.ready_timeout_s,
        )


class KServeServing(Block):
    """Where and how model versions are served: a KServe InferenceService's settings.

    The cluster and namespace the services go to, the serving runtime (``kserve-mlserver``, or
    empty to let KServe choose by format and protocol), the model format and protocol, the
    deployment mode, per-replica resources, replicas, where the predictor runs (node selector,
    tolerations) and how long a service may take to be Ready before it is rolled back.

    Example:
        ::

            from kubedl_prefect.prefect import KServeServing, KubernetesCluster

            serving = KServeServing(
                cluster=KubernetesCluster(kubeconfig_path="~/.kube/config", namespace="ml"),
                namespace="serving",
                cpu="1",
                memory="2Gi",
                min_replicas=1,
                max_replicas=3,
            )
            serving.save("serving", overwrite=True)
            serving = KServeServing.load("BLOCK_NAME")  # here: "serving"
            spec = serving.service("fraud", "s3://ml-artifacts/3/models/m-ab/artifacts")
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    _block_type_name: ClassVar[str] = "KubeDL KServe Serving"
    _block_type_slug: ClassVar[str] = "kubedl-kserve-serving"
    _logo_url: ClassVar[HttpUrl | None] = HttpUrl(KSERVE_LOGO_URL)
    _documentation_url: ClassVar[HttpUrl | None] = DOCUMENTATION_URL
    _description: ClassVar[str] = (
        "KServe InferenceService settings for registered model versions: cluster, namespace, "
        "runtime, resources, replicas, and the time a service may take to be Ready."
    )

    cluster: KubernetesCluster = Field(
        default_factory=KubernetesCluster,
        title="Cluster",
        description="Where the InferenceServices run (with KServe installed).",
    )
    namespace: str | None = Field(
        default=None,
        title="Namespace",
        description="Where the InferenceServices go (default: the cluster's default namespace).",
    )
    runtime: str | None = Field(
        default="kserve-mlserver",
        title="Serving runtime",
        description="The ClusterServingRuntime; empty lets KServe choose by format and protocol.",
    )
    model_format: str = Field(
        default="mlflow",
        title="Model format",
        description="The KServe model format (mlflow, sklearn, pytorch).",
    )
    protocol: Literal["v1", "v2", "grpc-v1", "grpc-v2"] = Field(
        default="v2", title="Protocol", description="The inference protocol (MLflow: v2)."
    )
    deployment_mode: Literal["Standard", "Knative"] = Field(
        default="Standard",
        title="Deployment mode",
        description="Standard (a Deployment) or Knative (revisions, canary traffic).",
    )
    service_account: str | None = Field(
        default=None,
        title="Service account",
        description="The ServiceAccount whose secrets hold the storage credentials.",
    )
    cpu: str | None = Field(
        default=None,
        title="CPU per replica",
        description="CPU per predictor replica, requests equal limits (1, 500m).",
    )
    memory: str | None = Field(
        default=None,
        title="Memory per replica",
        description="Memory per predictor replica, requests equal limits (2Gi).",
    )
    gpus: int = Field(
        default=0,
        ge=0,
        title="GPUs per replica",
        description="nvidia.com/gpu per predictor replica (requests equal limits).",
    )
    min_replicas: int | None = Field(
        default=None,
        ge=0,
        title="Fewest replicas",
        description="The fewest predictor replicas (default: KServe's; 0 scales to zero).",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        title="Most replicas",
        description="The most predictor replicas (default: KServe's).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        title="Node selector",
        description=(
            "Labels the predictor's nodes must have (on the test bed, "
            "testbed.kubedl-prefect.io/process-node: true is the process node)."
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        title="Tolerations",
        description="Taints the predictor's pods tolerate (as in a pod spec).",
    )
    check_compatibility: bool = Field(
        default=True,
        title="Check compatibility",
        description="Refuse a version the kserve-mlserver runtime cannot load, before applying.",
    )
    ready_timeout_s: float = Field(
        default=600.0, gt=0, title="Ready (s)", description="How long a new spec may take."
    )
    rollback_timeout_s: float = Field(
        default=300.0,
        gt=0,
        title="Rollback ready (s)",
        description="How long the restored spec may take to be Ready again.",
    )

    def resolved_namespace(self) -> str:
        """The namespace services go to: this block's, else its cluster's default."""
        return self.namespace or self.cluster.namespace

    def service(
        self,
        name: str,
        storage_uri: str,
        *,
        link: ModelLink | None = None,
        **changes: Any,
    ) -> InferenceServiceSpec:
        """The InferenceService of a model location with this block's settings (pure).

        Args:
            name: The service's name (also the v2 model name).
            storage_uri: Where the model's files are (a resolved location, never ``models:/``).
            link: The registry version and training job it serves.
            **changes: Other :class:`~kubedl_prefect.serving.InferenceServiceSpec` fields.

        Example:
            >>> spec = KServeServing(namespace="ml").service("fraud", "s3://b/m-1/artifacts")
            >>> spec.namespace, spec.runtime, str(spec.protocol)
            ('ml', 'kserve-mlserver', 'v2')
        """
        fields: dict[str, Any] = {
            "name": name,
            "storage_uri": storage_uri,
            "namespace": self.resolved_namespace(),
            "model_format": self.model_format,
            "runtime": self.runtime or None,
            "protocol": Protocol(self.protocol),
            "deployment_mode": DeploymentMode(self.deployment_mode),
            "service_account": self.service_account,
            "resources": ServingResources(cpu=self.cpu, memory=self.memory, gpus=self.gpus),
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "node_selector": dict(self.node_selector),
            "tolerations": tuple(self.tolerations),
            "link": link,
        }
        fields.update(changes)
        return InferenceServiceSpec(**fields)

    def deployer(self) -> InferenceServiceDeployer:
        """A deployer on this block's cluster and namespace (close it when done)."""
        from kubedl_prefect.serving.deploy import InferenceServiceDeployer

        return InferenceServiceDeployer(
            namespace=self.resolved_namespace(), credentials=self.cluster.credentials()
        )


def as_registry_block(registry: MlflowRegistry | str) -> MlflowRegistry:
    """A registry block from itself or from the name it was saved under."""
    return block_from(registry, MlflowRegistry, "an MLflow registry block")


async def aregistry_block(registry: MlflowRegistry | str) -> MlflowRegistry:
    """Async :func:`as_registry_block` (loads a saved block without blocking the loop)."""
    return await ablock_from(registry, MlflowRegistry, "an MLflow registry block")


def as_serving_block(serving: KServeServing | str) -> KServeServing:
    """A serving block from itself or from the name it was saved under."""
    return block_from(serving, KServeServing, "a KServe serving block")


async def aserving_block(serving: KServeServing | str) -> KServeServing:
    """Async :func:`as_serving_block` (loads a saved block without blocking the loop)."""
    return await ablock_from(serving, KServeServing, "a KServe serving block")
