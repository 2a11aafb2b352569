"""What to serve, and how: the typed description of one KServe InferenceService. Pure.

:class:`InferenceServiceSpec` holds what a user decides (the model's location and format, the
runtime and protocol, resources, replicas, the deployment mode, canary traffic) and what links the
service to its origin (:class:`ModelLink`: the registry version and the training job).
:meth:`InferenceServiceSpec.issues` checks it as KServe would, and more strictly where KServe is
silent: a setting KServe would ignore in the chosen mode is refused, not dropped. The manifest is
made by :func:`~kubedl_prefect.serving.render.render_inference_service`.

Example:
    >>> service = InferenceServiceSpec(name="fraud", namespace="ml",
    ...                                storage_uri="s3://ml/3/models/m-ab/artifacts")
    >>> service.issues()
    []
    >>> InferenceServiceSpec(name="fraud", storage_uri="models:/fraud/3").issues()[0].path
    'storageUri'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from pydantic import TypeAdapter, ValidationError

from kubedl_prefect.errors import InferenceServiceSpecError, SpecIssue
from kubedl_prefect.spec.fields import LabelValue, QualifiedName
from kubedl_prefect.spec.kube_types import Toleration
from kubedl_prefect.spec.quantity import is_quantity

PREDICTOR_SUFFIX: Final = "-predictor"
"""What KServe appends to the service's name for the predictor's Deployment and Service."""
MAX_NAME_LENGTH: Final = 63 - len(PREDICTOR_SUFFIX)
"""The longest name whose predictor objects still fit a DNS label (63)."""
MAX_HOST_LABEL: Final = 63
"""The longest DNS label: KServe's predictor host ``<name>-predictor-<namespace>`` is one."""

_DNS1035: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
_ENV_NAME: Final = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_REGISTRY_SCHEMES: Final = ("models:/", "runs:/", "mlflow-artifacts:")

_NODE_SELECTOR: Final = TypeAdapter(dict[QualifiedName, LabelValue])

MODEL_SERVER_PORT: Final = 8080
"""The HTTP port of KServe's model server container (``kserve-container``) in every runtime."""

_IssueSink = Callable[[str, str, str], None]
"""The ``issue(path, problem, fix)`` collector of :meth:`InferenceServiceSpec.issues`."""


class DeploymentMode(StrEnum):
    """KServe's deployment mode, always written as an annotation.

    ``serving.kserve.io/deploymentMode`` is set on every service: the controller's default is
    Knative, which most clusters without Knative lack.
    """

    STANDARD = "Standard"
    """A Deployment, Service and HPA (KServe's former ``RawDeployment``)."""
    KNATIVE = "Knative"
    """A Knative Service with revisions and traffic splitting (formerly ``Serverless``)."""


class Protocol(StrEnum):
    """The inference protocol of the predictor (``protocolVersion``)."""

    V1 = "v1"
    V2 = "v2"
    GRPC_V1 = "grpc-v1"
    GRPC_V2 = "grpc-v2"


@dataclass(frozen=True)
class ServingResources:
    """Compute resources of each predictor replica; requests equal limits.

    Args:
        cpu: CPU, e.g. ``"1"`` or ``"500m"``.
        memory: Memory, e.g. ``"2Gi"``.
        gpus: ``nvidia.com/gpu`` per replica.
    """

    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0


@dataclass(frozen=True)
class ModelLink:
    """Where the served model came from: the registry version and the job that trained it.

    Args:
        model_name: The registered model.
        version: Its version.
        job_namespace: The training job's namespace.
        job_name: The training job (attempt) that produced it.
        job_uid: Its uid.
    """

    model_name: str
    version: str
    job_namespace: str | None = None
    job_name: str | None = None
    job_uid: str | None = None

    @property
    def model_uri(self) -> str:
        """``models:/name/version``."""
        return f"models:/{self.model_name}/{self.version}"


CANARY_NAME: Final = "canary"
"""Default ``predictor.name`` of a Standard-mode canary (its Deployment:
``<service>-canary-predictor``)."""


@dataclass(frozen=True)
class Canary:
    """A candidate model served next to the stable one: KServe's ``spec.canary`` (v0.20+).

    Standard mode only. KServe runs the candidate in a Deployment of its own,
    ``<service>-<name>-predictor``, with fixed replicas: ``ceil(min_replicas x traffic_percent /
    100)`` of the stable predictor's ``min_replicas`` (1 when unset), which loses as many; the
    service's traffic is split by that ratio of pods. The candidate predictor is the stable one
    with this model's location (and link) in place: same format, runtime, protocol and resources.
    To promote it, deploy the candidate as the stable model without a canary; to roll it back,
    deploy the stable one without a canary.

    Args:
        storage_uri: Where the candidate model's files are (like
            :attr:`InferenceServiceSpec.storage_uri`).
        traffic_percent: Share of the service's replicas, hence of its traffic (0: deployed,
            no traffic).
        name: The candidate's ``predictor.name`` (a DNS-1035 label).
        link: The registry version and training job of the candidate (labels of its pods).
    """

    storage_uri: str
    traffic_percent: int
    name: str = CANARY_NAME
    link: ModelLink | None = None


@dataclass(frozen=True)
class InferenceServiceSpec:
    """One InferenceService: the model, its runtime, resources, replicas and rollout.

    Args:
        name: The service's name (a DNS-1035 label of at most 53 characters: KServe appends
            ``-predictor``); it is also the v2 model name (``/v2/models/<name>/infer``).
        storage_uri: Where the model's files are (``s3://``, ``gs://``, ``pvc://``,
            ``file://``...), never a registry URI: resolve those first.
        namespace: Its namespace (default: the deployer's).
        model_format: The KServe model format (``mlflow``, ``sklearn``, ``pytorch``...).
        model_format_version: The format's version; leave it out for ``mlflow`` (the stock
            runtime declares only "1" and "2").
        runtime: The serving runtime to use; ``None`` lets KServe choose by format and protocol.
        protocol: The inference protocol; MLflow models need ``v2``.
        deployment_mode: Standard (Deployment) or Knative.
        service_account: The ServiceAccount whose secrets hold the storage credentials.
        resources: Per-replica resources.
        min_replicas: Fewest replicas (0 scales to zero, Knative only).
        max_replicas: Most replicas.
        canary_traffic_percent: Percent of traffic for this revision during a rollout
            (Knative mode; refused in Standard mode, where KServe would ignore it: use
            ``canary`` there).
        canary: A candidate model next to this one (Standard mode: KServe's ``spec.canary``).
        env: Environment of the model server.
        node_selector: Labels the predictor's nodes must have (``spec.predictor.nodeSelector``;
            a canary's pods get them too).
        tolerations: Taints the predictor's pods tolerate (``spec.predictor.tolerations``).
            On the test bed, ``node_selector={"testbed.kubedl-prefect.io/process-node":
            "true"}`` with the ``Exists`` toleration of that key puts the predictor on the
            process node, where it really runs (docs/serving.md).
        model_ready_probe: In Standard mode with protocol ``v2``, give the model server a
            readiness probe on the model's own endpoint, ``GET /v2/models/<name>/ready`` on
            port 8080, so a pod is Ready once its model loaded. KServe's default (no probe in
            the runtime) is a TCP probe of that port, which MLServer passes as soon as it
            listens: before the model loads, and between a failed load and its exit. False
            keeps KServe's default; other modes and protocols always do.
        labels: Extra labels of the service and its predictor pods.
        annotations: Extra annotations of the service.
        link: The registry version and training job it serves (labels and annotations).
    """

    name: str
    storage_uri: str
    namespace: str | None = None
    model_format: str = "mlflow"
    model_format_version: str | None = None
    runtime: str | None = None
    protocol: Protocol = Protocol.V2
    deployment_mode: DeploymentMode = DeploymentMode.STANDARD
    service_account: str | None = None
    resources: ServingResources = field(default_factory=ServingResources)
    min_replicas: int | None = None
    max_replicas: int | None = None
    canary_traffic_percent: int | None = None
    canary: Canary | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    tolerations: tuple[Toleration, ...] = ()
    model_ready_probe: bool = True
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    link: ModelLink | None = None

    def issues(self, namespace: str | None = None) -> list[SpecIssue]:
        """Every problem of this description, with its field and fix (empty: none).

        Args:
            namespace: Where it goes when :attr:`namespace` is unset (the deployer's): the
                host names KServe derives must fit a DNS label.
        """
        found: list[SpecIssue] = []

        def issue(path: str, problem: str, fix: str) -> None:
            found.append(SpecIssue(path, problem, fix))

        if not _DNS1035.match(self.name) or len(self.name) > MAX_NAME_LENGTH:
            issue(
                "name",
                f"{self.name!r} is not a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
                f"(KServe names the predictor <name>{PREDICTOR_SUFFIX})",
                "use lower-case letters, digits and '-', starting with a letter",
            )
        if self.namespace is not None and not _DNS1123_SUBDOMAIN.match(self.namespace):
            issue("namespace", f"{self.namespace!r} is not a namespace name", "fix the name")
        _storage_issues("storageUri", self.storage_uri, issue)
        if not self.model_format:
            issue("modelFormat", "the model format is empty", "use mlflow, sklearn, pytorch...")
        if self.model_format == "mlflow":
            if self.protocol is not Protocol.V2:
                issue(
                    "protocolVersion",
                    f"MLflow models are served over v2 only (KServe's kserve-mlserver), not "
                    f"{self.protocol}; KServe would find no runtime",
                    "use Protocol.V2",
                )
            if self.model_format_version is not None:
                issue(
                    "modelFormat.version",
                    "a version for the mlflow format narrows the runtimes KServe may pick "
                    "(kserve-mlserver declares only '1' and '2')",
                    "leave model_format_version out",
                )
        self._resource_issues(issue)
        self._replica_issues(issue)
        self._canary_issues(issue)
        self._host_issues(self.namespace or namespace, issue)
        for name in self.env:
            if not _ENV_NAME.match(name):
                issue(f"env.{name}", "not an environment variable name", "fix the name")
        if self.service_account is not None and not _DNS1123_SUBDOMAIN.match(self.service_account):
            issue("serviceAccount", f"{self.service_account!r} is not a name", "fix the name")
        self._placement_issues(issue)
        return found

    @property
    def ready_path(self) -> str | None:
        """The path of the model server's readiness probe, or ``None`` for KServe's default.

        Example:
            >>> InferenceServiceSpec(name="fraud", storage_uri="s3://b/m").ready_path
            '/v2/models/fraud/ready'
        """
        if (
            self.model_ready_probe
            and self.deployment_mode is DeploymentMode.STANDARD
            and self.protocol is Protocol.V2
        ):
            return f"/v2/models/{self.name}/ready"
        return None

    def _placement_issues(self, issue: _IssueSink) -> None:
        try:
            _NODE_SELECTOR.validate_python(dict(self.node_selector))
        except ValidationError as exc:
            issue(
                "predictor.nodeSelector",
                f"{len(exc.errors())} key(s) or value(s) are not label keys or values",
                "use label keys (prefix/name) and values of at most 63 characters [A-Za-z0-9._-]",
            )
        for index, toleration in enumerate(self.tolerations):
            if not isinstance(toleration, Toleration):
                issue(
                    f"predictor.tolerations[{index}]",
                    f"a {type(toleration).__name__}, not a Toleration",
                    "give kubedl_prefect.spec.Toleration(key=..., operator=..., effect=...)",
                )

    def _resource_issues(self, issue: _IssueSink) -> None:
        for label, amount in (("cpu", self.resources.cpu), ("memory", self.resources.memory)):
            if amount is not None and not is_quantity(amount):
                issue(f"resources.{label}", f"{amount!r} is not a quantity", "e.g. 500m, 2Gi")
        if self.resources.gpus < 0:
            issue("resources.gpus", "a negative GPU count", "use 0 or more")

    def _replica_issues(self, issue: _IssueSink) -> None:
        low, high = self.min_replicas, self.max_replicas
        if low is not None and low < 0:
            issue("minReplicas", f"{low} is negative", "use 0 or more")
        if high is not None and high < 1:
            issue("maxReplicas", f"{high} is below 1", "use 1 or more")
        if low is not None and high is not None and high < low:
            issue("maxReplicas", f"{high} is below minReplicas ({low})", "raise maxReplicas")
        if low == 0 and self.deployment_mode is DeploymentMode.STANDARD:
            issue(
                "minReplicas",
                "scaling to zero needs Knative; in Standard mode the HPA keeps at least one",
                "use min_replicas >= 1, or DeploymentMode.KNATIVE",
            )
        percent = self.canary_traffic_percent
        if percent is None:
            return
        if not 0 <= percent <= 100:
            issue("canaryTrafficPercent", f"{percent} is not a percentage", "use 0 to 100")
        if self.deployment_mode is DeploymentMode.STANDARD:
            issue(
                "canaryTrafficPercent",
                "KServe ignores canaryTrafficPercent in Standard mode (all traffic would go to "
                "the new model at once)",
                "in Standard mode, keep the serving model and give the candidate as "
                "canary=Canary(storage_uri, traffic_percent) (KServe's spec.canary); or deploy "
                "with DeploymentMode.KNATIVE",
            )

    def _host_issues(self, namespace: str | None, issue: _IssueSink) -> None:
        """KServe's predictor host name ``<name>-predictor-<namespace>`` is one DNS label.

        Its default domain template makes the predictor's URL host from that label; one longer
        than 63 characters fails every reconcile (``ReconcileFailed``, "must be no more than 63
        characters"), so it is refused here instead.
        """
        if namespace is None:
            return
        names = [self.name] + ([f"{self.name}-{self.canary.name}"] if self.canary else [])
        for name in names:
            host = f"{name}{PREDICTOR_SUFFIX}-{namespace}"
            if len(host) > MAX_HOST_LABEL:
                issue(
                    "name",
                    f"KServe's predictor host name {host!r} is {len(host)} characters, more "
                    f"than a DNS label's {MAX_HOST_LABEL}",
                    "use a shorter service (or canary) name or namespace",
                )

    def _canary_issues(self, issue: _IssueSink) -> None:
        canary = self.canary
        if canary is None:
            return
        if self.deployment_mode is not DeploymentMode.STANDARD:
            issue(
                "canary",
                "KServe's spec.canary exists in Standard mode only (its validation refuses it "
                "in Knative mode)",
                "in Knative mode, deploy the candidate with canary_traffic_percent",
            )
        if self.canary_traffic_percent is not None:
            issue(
                "canary",
                "canary and canary_traffic_percent are two ways to split traffic; give one",
                "drop canary_traffic_percent",
            )
        if not 0 <= canary.traffic_percent <= 100:
            issue(
                "canary.trafficPercent",
                f"{canary.traffic_percent} is not a percentage",
                "use 0 to 100",
            )
        longest = 63 - len(self.name) - len(PREDICTOR_SUFFIX) - 1
        if not _DNS1035.match(canary.name) or len(canary.name) > longest:
            issue(
                "canary.predictor.name",
                f"{canary.name!r} is not a DNS-1035 label of at most {max(longest, 0)} characters "
                f"(KServe names its Deployment {self.name}-<name>{PREDICTOR_SUFFIX})",
                "use a short lower-case name such as 'canary'",
            )
        _storage_issues("canary.predictor.model.storageUri", canary.storage_uri, issue)

    def check(self, namespace: str | None = None) -> None:
        """Raise unless :meth:`issues` is empty.

        Args:
            namespace: As for :meth:`issues`.

        Raises:
            InferenceServiceSpecError: Every problem found.
        """
        problems = self.issues(namespace)
        if problems:
            raise InferenceServiceSpecError(problems, name=self.name)


def _storage_issues(path: str, uri: str, issue: _IssueSink) -> None:
    if uri.startswith(_REGISTRY_SCHEMES):
        issue(
            path,
            f"{uri!r} is an MLflow location, which KServe cannot read",
            "resolve it first: ModelRegistry.resolve(uri).storage_uri",
        )
    elif "://" not in uri:
        issue(
            path,
            f"{uri!r} is not a URI",
            "give s3://, gs://, pvc://, file:// or another scheme KServe reads",
        )
