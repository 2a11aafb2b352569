"""Prefect blocks: a Kubernetes cluster, and a training job in Prefect's JobBlock shape.

:class:`KubernetesCluster` says how to reach a cluster (one of: the content of a kubeconfig, a
kubeconfig file and context, the pod's own ServiceAccount, or a server URL with a bearer token)
and the default namespace. Secrets are :class:`pydantic.SecretStr` fields: Prefect stores them
encrypted, shows them as ``********`` in the UI and the API, and they reach the Kubernetes layer
only as :mod:`kubedl_prefect.kube.credentials` objects, whose ``repr`` hides them too.

:class:`LocalCluster` is its local twin, the embedded default: this machine, whose backend runs
each replica as a local process (:class:`~kubedl_prefect.lifecycle.local.LocalBackend`). Both
have ``backend()``, the one method the training job block and the tasks call, so a flow runs on
either with only the block changed.

:class:`TrainingJob` is a :class:`prefect.blocks.abstract.JobBlock`: the spec (inline, or a spec
file read where the flow runs), the cluster, the operator dialect, the retry policy and the wait
timeouts. :meth:`TrainingJob.trigger` returns a :class:`~kubedl_prefect.prefect.runs.TrainingJobRun`
whose reference is plain data, so another process re-attaches to the same job.

They register with a Prefect server, with the model chain's blocks, through
:mod:`kubedl_prefect.prefect.collection`: the ``prefect.collections`` entry point (a self-hosted
server registers them at start-up) or ``prefect block register -m
kubedl_prefect.prefect.collection`` (Prefect Cloud, or a running server).
"""

from __future__ import annotations

import base64
import binascii
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias, TypeVar

from prefect.blocks.abstract import JobBlock
from prefect.blocks.core import Block
from prefect.types import SecretDict
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    SecretStr,
    field_validator,
    model_validator,
)

from kubedl_prefect.errors import KubeDLPrefectError, has_user_info
from kubedl_prefect.lifecycle.backend import TrainingBackend, WaitTimeouts
from kubedl_prefect.lifecycle.retry import RetryPolicy
from kubedl_prefect.prefect.results import TrainingResult
from kubedl_prefect.spec import (
    Dialect,
    PodSecurityFinding,
    TrainingJobSpec,
    load_spec,
    load_untrusted_spec,
    parse_spec,
    pod_security_warnings,
    spec_to_data,
    validate,
)

if TYPE_CHECKING:
    from kubedl_prefect.kube.credentials import Credentials
    from kubedl_prefect.prefect.runs import SyncTrainingJobRun, TrainingJobRun

DOCUMENTATION_URL: HttpUrl | None = None
"""Where the blocks' documentation lives on the web: nowhere yet.

The documentation ships with the sources (``docs/prefect.md``), not at a URL; the block pages
of the Prefect UI show no link rather than a guessed one. Set it when the documentation is
published at an address that resolves.
"""

LOGO_URL = (
    "https://cdn.sanity.io/images/3ugk85nk/production/"
    "2d0b896006ad463b49c28aaac14f31e00e32cfab-250x250.png"
)
"""The Kubernetes logo, as Prefect's own Kubernetes blocks show it."""

_PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


def normalize_ca(text: str) -> str:
    """PEM text from what a form field holds: PEM, PEM whose line breaks were lost, or base64.

    A one-line form field drops the line breaks of pasted PEM, and kubeconfigs carry the CA as
    base64 (``certificate-authority-data``); both become proper PEM.

    Example:
        >>> pem = normalize_ca("-----BEGIN CERTIFICATE----- QUJD -----END CERTIFICATE-----")
        >>> pem.splitlines()
        ['-----BEGIN CERTIFICATE-----', 'QUJD', '-----END CERTIFICATE-----']
        >>> normalize_ca(base64.b64encode(pem.encode()).decode()) == pem
        True
    """
    stripped = text.strip()
    if "-----BEGIN" not in stripped:
        try:
            stripped = base64.b64decode(stripped, validate=True).decode("ascii").strip()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise ValueError("the CA certificate is neither PEM nor base64-encoded PEM") from exc
    blocks = _PEM.findall(stripped)
    if not blocks:
        raise ValueError("the CA certificate holds no -----BEGIN CERTIFICATE----- block")
    out = []
    for body in blocks:
        data = "".join(body.split())
        lines = [data[i : i + 64] for i in range(0, len(data), 64)]
        out.append("\n".join(["-----BEGIN CERTIFICATE-----", *lines, "-----END CERTIFICATE-----"]))
    return "\n".join(out) + "\n"


class KubernetesCluster(Block):
    """A Kubernetes cluster that runs training jobs, and how to authenticate to it.

    Give exactly one way in: ``kubeconfig`` (the content of a kubeconfig, kept secret),
    ``kubeconfig_path`` (a file on the machine where the flow runs; with ``context``),
    ``in_cluster`` (the ServiceAccount of the pod the flow runs in), or ``server`` + ``token``
    (a bearer token, kept secret; with ``ca_cert`` or ``ca_file``). With none of them the
    process's default applies: ``$KUBECONFIG`` or ``~/.kube/config``, else the pod's account.

    Whoever can edit a block must not thereby run commands on the machine where flows run.
    So ``kubeconfig`` content may hold only embedded credentials (a token, a client certificate
    and key as ``*-data``, the CA as ``certificate-authority-data``): ``exec`` and
    ``auth-provider`` users and file references (``tokenFile``, ``client-certificate``,
    ``client-key``, ``certificate-authority``) are refused, unless ``trust_kubeconfig`` is set,
    which trusts the block's editors with the worker. ``kubeconfig_path`` names a file of the
    worker, written by the worker's administrator: it is used as kubectl would, ``exec`` and
    files included (a block can choose among the worker's kubeconfigs, not write one).

    Every backend made from blocks with the same credentials shares one client and one watch per
    kind and namespace in a process, however many tasks use them.

    Example:
        Save a cluster once, load it by name in flows::

            from kubedl_prefect.prefect import KubernetesCluster

            KubernetesCluster(kubeconfig_path="~/.kube/config", context="gpu", namespace="ml").save(
                "gpu-cluster", overwrite=True
            )
            cluster = KubernetesCluster.load("BLOCK_NAME")  # here: "gpu-cluster"
            backend = cluster.backend(dialect="kubedl")
    """

    # Validation errors never quote the input: it may hold the token or the kubeconfig.
    model_config = ConfigDict(hide_input_in_errors=True)

    _block_type_name: ClassVar[str] = "KubeDL Kubernetes Cluster"
    _block_type_slug: ClassVar[str] = "kubedl-kubernetes-cluster"
    _logo_url: ClassVar[HttpUrl] = HttpUrl(LOGO_URL)
    _documentation_url: ClassVar[HttpUrl | None] = DOCUMENTATION_URL
    _description: ClassVar[str] = (
        "A Kubernetes cluster with the KubeDL or Kubeflow training operator: how to reach it "
        "(kubeconfig content or file, in-cluster, or a bearer token) and the default namespace."
    )

    namespace: str = Field(
        default="default",
        title="Default namespace",
        description="Where training jobs run unless a training job block names another.",
    )
    kubeconfig: SecretStr | None = Field(
        default=None,
        title="Kubeconfig content",
        description=(
            "The whole kubeconfig, as YAML or JSON (kept secret). In the UI paste the output of "
            "`kubectl config view --raw --minify --flatten -o json`: JSON survives a one-line "
            "field."
        ),
    )
    trust_kubeconfig: bool = Field(
        default=False,
        title="Trust the kubeconfig content",
        description=(
            "Let the kubeconfig content run commands (exec, auth-provider) and read files "
            "(tokenFile, certificate files) on the machine where the flow runs. This trusts "
            "the block's editors with the worker: they can run commands as the worker."
        ),
    )
    kubeconfig_path: str | None = Field(
        default=None,
        title="Kubeconfig path",
        description=(
            "A kubeconfig file on the machine where the flow runs, used as kubectl uses it "
            "(exec plugins included): the worker's own file."
        ),
    )
    context: str | None = Field(
        default=None,
        title="Context",
        description="The kubeconfig context to use (default: its current-context).",
    )
    in_cluster: bool = Field(
        default=False,
        title="In-cluster",
        description="Use the ServiceAccount of the pod the flow runs in.",
    )
    server: str | None = Field(
        default=None,
        title="API server URL",
        description=(
            "For token authentication: https://host:port of the API server (http:// only to a "
            "loopback address: the token would travel in clear text)."
        ),
    )
    token: SecretStr | None = Field(
        default=None,
        title="Bearer token",
        description="For token authentication: a ServiceAccount or OIDC token (kept secret).",
    )
    ca_cert: str | None = Field(
        default=None,
        title="CA certificate",
        description=(
            "For token authentication: the API server's CA, as PEM or as base64 "
            "(certificate-authority-data). Empty: the system's trusted CAs."
        ),
    )
    ca_file: str | None = Field(
        default=None,
        title="CA file",
        description="For token authentication: the CA as a file on the machine of the flow.",
    )
    insecure_skip_tls_verify: bool = Field(
        default=False,
        title="Skip TLS verification",
        description=(
            "For token authentication: do not check the server's certificate (test clusters "
            "only; not with a CA). The flow logs a warning."
        ),
    )

    @model_validator(mode="after")
    def _one_way_in(self) -> KubernetesCluster:
        ways = [
            name
            for name, given in (
                ("kubeconfig", self.kubeconfig is not None),
                ("kubeconfig_path", self.kubeconfig_path is not None),
                ("in_cluster", self.in_cluster),
                ("token", self.token is not None or self.server is not None),
            )
            if given
        ]
        if len(ways) > 1:
            raise ValueError(
                f"give one way to reach the cluster, not {len(ways)}: {', '.join(ways)}"
            )
        if ways == ["token"] and (self.server is None or self.token is None):
            raise ValueError("token authentication needs both server and token")
        if self.ca_cert is not None and self.ca_file is not None:
            raise ValueError("give ca_cert or ca_file, not both")
        if ways != ["token"] and (self.ca_cert is not None or self.ca_file is not None):
            raise ValueError("ca_cert and ca_file go with server + token only")
        if ways != ["kubeconfig"] and self.trust_kubeconfig:
            raise ValueError("trust_kubeconfig goes with kubeconfig (its content) only")
        if ways != ["token"] and self.insecure_skip_tls_verify:
            raise ValueError(
                "insecure_skip_tls_verify goes with server + token only (a kubeconfig says "
                "insecure-skip-tls-verify itself)"
            )
        if self.insecure_skip_tls_verify and (self.ca_cert is not None or self.ca_file is not None):
            raise ValueError(
                "give a CA to check the server against, or insecure_skip_tls_verify, not both"
            )
        if self.server is not None and has_user_info(self.server):
            raise ValueError("the server URL holds user info: pass the credentials as the token")
        if self.ca_cert is not None:
            self.ca_cert = normalize_ca(self.ca_cert)
        return self

    @classmethod
    def from_kubeconfig_file(
        cls, path: str | Path, *, context: str | None = None, namespace: str = "default"
    ) -> KubernetesCluster:
        """A block holding the *content* of a kubeconfig file (kept secret once saved).

        Use it to save a cluster whose flows run on other machines; refer to the file with
        ``KubernetesCluster(kubeconfig_path=...)`` when they run here. As content, it may hold
        only embedded credentials: a file with ``exec`` users or file references is refused
        when the flow connects, unless the block is given ``trust_kubeconfig=True``.
        """
        text = Path(path).expanduser().read_text(encoding="utf-8")
        return cls(kubeconfig=SecretStr(text), context=context, namespace=namespace)

    def credentials(self) -> Credentials:
        """The Kubernetes layer's credentials for this block (their ``repr`` hides secrets)."""
        # Imported here: the Kubernetes client is slow to import, and Prefect imports this module
        # (its block registry) at the start of every command.
        from kubedl_prefect.kube.credentials import (
            BearerToken,
            InCluster,
            KubeconfigContent,
            KubeconfigFile,
        )
        from kubedl_prefect.kube.session import default_credentials

        if self.kubeconfig is not None:
            return KubeconfigContent(
                self.kubeconfig.get_secret_value(), self.context, trusted=self.trust_kubeconfig
            )
        if self.in_cluster:
            return InCluster()
        if self.token is not None and self.server is not None:
            return BearerToken(
                server=self.server,
                token=self.token.get_secret_value(),
                ca_cert=self.ca_cert,
                ca_file=self.ca_file,
                insecure_skip_tls_verify=self.insecure_skip_tls_verify,
            )
        if self.kubeconfig_path is not None or self.context is not None:
            return KubeconfigFile(self.kubeconfig_path, self.context)
        return default_credentials()

    def backend(
        self,
        *,
        dialect: Dialect | str = Dialect.KUBEDL,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> TrainingBackend:
        """A training backend for this cluster (light: backends share the process's session).

        A local twin of this block (the embedded backend) returns its own backend here; the
        training job block and the tasks only ever call this method.

        Args:
            dialect: The operator that runs the jobs (``kubedl`` or ``kubeflow``).
            namespace: Where jobs are submitted (default: :attr:`namespace`).
            labels: Extra labels on the jobs it creates (the flow run that made them).
        """
        from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend

        return KubernetesBackend(
            namespace=namespace or self.namespace,
            dialect=dialect,
            credentials=self.credentials(),
            labels=labels,
        )

    def cleanup_reference(self) -> dict[str, Any] | None:
        """How a clean-up in another process finds this cluster again, without any secret.

        A saved block is found by its document id; an unsaved one only when its credentials
        hold no secret (a kubeconfig path, in-cluster, the default). ``None`` otherwise.
        """
        document_id = getattr(self, "_block_document_id", None)
        if document_id is not None:
            return {"blockDocumentId": str(document_id)}
        if self.kubeconfig is not None or self.token is not None:
            return None
        return {
            "kubeconfigPath": self.kubeconfig_path,
            "context": self.context,
            "inCluster": self.in_cluster,
        }

    @classmethod
    async def from_cleanup_reference(cls, data: dict[str, Any]) -> ClusterBlock:
        """The block a :meth:`cleanup_reference` names (loaded from the server when saved).

        Either kind of cluster block: a saved block loads as the type it was saved as, and a
        :class:`LocalCluster`'s reference names its workspace.
        """
        document_id = data.get("blockDocumentId")
        if document_id:
            loaded = await Block.aload_from_ref(str(document_id))
            if not isinstance(loaded, KubernetesCluster | LocalCluster):
                raise KubeDLPrefectError(
                    f"block document {document_id} is a {type(loaded).__name__}, not a cluster"
                )
            return loaded
        if "localWorkspace" in data:
            return LocalCluster(workspace=data["localWorkspace"])
        return cls(
            kubeconfig_path=data.get("kubeconfigPath"),
            context=data.get("context"),
            in_cluster=bool(data.get("inCluster")),
        )


class LocalCluster(Block):
    """This machine as a cluster: the embedded default, no Kubernetes needed.

    Its :meth:`backend` is a :class:`~kubedl_prefect.lifecycle.local.LocalBackend`: every replica
    of a training job runs as a process of the machine where the flow runs, under the
    environment the operators give replicas (``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``,
    ``TF_CONFIG``...), with the same lifecycle as on a cluster (adoption, run records, admission
    with a reason, labelled logs, diagnosed failures, retries that resume from the checkpoint).
    Use it where a :class:`KubernetesCluster` goes: a :class:`TrainingJob`'s ``cluster``, the
    tasks and the flows take either, so a flow debugged here runs on GPUs with only the block
    changed. See ``docs/local.md``.

    The workspace (jobs, logs, checkpoints, run records) stands where a cluster has a
    namespace: a training job block's ``namespace``, when set, is the workspace its jobs use.

    Example:
        Load a saved one by name in a flow::

            from kubedl_prefect.prefect import LocalCluster

            cluster = LocalCluster.load("BLOCK_NAME")
            backend = cluster.backend()

        Or make one in code:

        >>> cluster = LocalCluster(workspace="/tmp/kubedl-ws", max_processes=2)
        >>> cluster.backend().namespace
        '/tmp/kubedl-ws'
        >>> cluster.namespace
        '/tmp/kubedl-ws'
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    _block_type_name: ClassVar[str] = "KubeDL Local Cluster"
    _block_type_slug: ClassVar[str] = "kubedl-local-cluster"
    _logo_url: ClassVar[HttpUrl] = HttpUrl(LOGO_URL)
    _documentation_url: ClassVar[HttpUrl | None] = DOCUMENTATION_URL
    _description: ClassVar[str] = (
        "This machine as a training cluster (the embedded default): each replica of a training "
        "job runs as a local process under the operators' environment contract."
    )

    workspace: str | None = Field(
        default=None,
        title="Workspace",
        description=(
            "Where jobs, logs, checkpoints and run records live on the machine of the flow "
            "(default: ~/.cache/kubedl-prefect/local)."
        ),
    )
    working_dir: str | None = Field(
        default=None,
        title="Working directory",
        description="The replicas' working directory (default: the flow process's).",
    )
    max_processes: int | None = Field(
        default=None,
        ge=1,
        title="Processes",
        description="Replicas at once (default: the CPUs this process may use).",
    )
    cpus: float | None = Field(
        default=None, gt=0, title="CPUs", description="CPU to admit (default: this machine's)."
    )
    memory_bytes: int | None = Field(
        default=None,
        gt=0,
        title="Memory (bytes)",
        description="Memory to admit (default: this machine's total).",
    )
    gpus: int | None = Field(
        default=None, ge=0, title="GPUs", description="GPUs to admit (default: those found)."
    )
    # A SecretDict, not dict[str, SecretStr]: Prefect's API masks every value of a SecretDict
    # ("env.*" in the schema's secret_fields), but not the values of a dict of SecretStr.
    env: SecretDict = Field(
        default_factory=lambda: SecretDict({}),
        title="Environment",
        description=(
            "Variables every replica gets over the spec's (kept secret); they stand in for the "
            "spec's Secret and ConfigMap references, which have no local value."
        ),
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_of_strings(cls, value: Any) -> Any:
        """Names and values as strings (``SecretStr`` values accepted), never quoting a value."""
        if isinstance(value, SecretDict):
            value = value.get_secret_value()
        if value == "":  # how an empty SecretDict is dumped to JSON
            return {}
        if isinstance(value, str):
            raise ValueError(
                "env holds a masked value, not the variables: load the block with its secrets"
            )
        if not isinstance(value, dict):
            raise ValueError("env must map variable names to values")
        variables: dict[str, str] = {}
        for name, item in value.items():
            plain = item.get_secret_value() if isinstance(item, SecretStr) else item
            if not isinstance(name, str) or not isinstance(plain, str):
                raise ValueError(f"env variable {str(name)!r}: its name and value must be strings")
            variables[name] = plain
        return variables

    @property
    def namespace(self) -> str:
        """The workspace, resolved: what stands for a namespace on this machine."""
        from kubedl_prefect.prefect.settings import local_workspace

        return str(Path(self.workspace or local_workspace()).expanduser().resolve())

    def backend(
        self,
        *,
        dialect: Dialect | str = Dialect.KUBEDL,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> TrainingBackend:
        """The local backend of this machine (light: it holds no connection).

        Args:
            dialect: Not used: the local backend runs every framework the same way (accepted
                so that callers pass the same arguments as to :meth:`KubernetesCluster.backend`).
            namespace: The workspace to use (a job reference's ``namespace``; default:
                :attr:`namespace`).
            labels: Extra labels on the jobs it creates (the flow run that made them).
        """
        from kubedl_prefect.lifecycle.local import LocalBackend, LocalCapacity
        from kubedl_prefect.lifecycle.local.capacity import machine_capacity

        capacity = None
        limits = (self.max_processes, self.cpus, self.memory_bytes, self.gpus)
        if any(limit is not None for limit in limits):
            machine = machine_capacity()
            capacity = LocalCapacity(
                processes=self.max_processes or machine.processes,
                cpus=self.cpus or machine.cpus,
                memory_bytes=self.memory_bytes or machine.memory_bytes,
                gpus=machine.gpus if self.gpus is None else self.gpus,
            )
        return LocalBackend(
            namespace or self.namespace,
            capacity=capacity,
            env=dict(self.env.get_secret_value()),
            working_dir=self.working_dir,
            labels=labels,
        )

    def cleanup_reference(self) -> dict[str, Any] | None:
        """How a clean-up in another process finds this machine's workspace again."""
        document_id = getattr(self, "_block_document_id", None)
        if document_id is not None:
            return {"blockDocumentId": str(document_id)}
        return {"localWorkspace": self.namespace}

    @classmethod
    async def from_cleanup_reference(cls, data: dict[str, Any]) -> ClusterBlock:
        """The block a :meth:`cleanup_reference` names (see :meth:`KubernetesCluster`'s)."""
        return await KubernetesCluster.from_cleanup_reference(data)


ClusterBlock: TypeAlias = KubernetesCluster | LocalCluster
"""Where training jobs run: a Kubernetes cluster, or this machine (the embedded default)."""


class RetrySettings(BaseModel):
    """How often and how soon a retryable failure (eviction, preemption...) is run again.

    Example:
        >>> RetrySettings(max_attempts=2).policy().max_attempts
        2
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(
        default=3,
        ge=1,
        le=99,
        title="Attempts",
        description="Attempts in all, the first included; each is a job of its own.",
    )
    backoff_s: float = Field(
        default=10.0, ge=0, title="First pause (s)", description="Before the second attempt."
    )
    backoff_factor: float = Field(
        default=2.0, ge=1, title="Pause factor", description="Each further pause is this longer."
    )
    max_backoff_s: float = Field(
        default=300.0,
        ge=0,
        title="Longest pause (s)",
        description="No pause between attempts is longer than this.",
    )

    def policy(self) -> RetryPolicy:
        """The lifecycle's :class:`~kubedl_prefect.lifecycle.retry.RetryPolicy`."""
        return RetryPolicy(
            max_attempts=self.max_attempts,
            backoff_s=self.backoff_s,
            backoff_factor=self.backoff_factor,
            max_backoff_s=self.max_backoff_s,
        )


class WaitSettings(BaseModel):
    """Time limits for each waiting phase, in seconds (empty: no limit).

    Example:
        >>> WaitSettings(admission_s=60).timeouts().admission_s
        60.0
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    admission_s: float | None = Field(
        default=600.0,
        gt=0,
        title="Admission (s)",
        description="From submission until every replica is scheduled; the job is deleted then.",
    )
    startup_s: float | None = Field(
        default=600.0, gt=0, title="Start-up (s)", description="From admission until Running."
    )
    completion_s: float | None = Field(
        default=None, gt=0, title="Completion (s)", description="From Running until the end."
    )
    cancel_s: float = Field(
        default=120.0,
        gt=0,
        title="Cancellation (s)",
        description="How long a cancellation waits for pods and PodGroups to be gone.",
    )

    def timeouts(self) -> WaitTimeouts:
        """The lifecycle's :class:`~kubedl_prefect.lifecycle.backend.WaitTimeouts`."""
        return WaitTimeouts(
            admission_s=self.admission_s,
            startup_s=self.startup_s,
            completion_s=self.completion_s,
            cancel_s=self.cancel_s,
        )


class TrainingJob(JobBlock[TrainingResult]):
    """A distributed training job: the spec, the cluster, the operator, retries and timeouts.

    The spec is given inline (``spec``: the spec's fields, as in its YAML file; a
    :class:`~kubedl_prefect.spec.TrainingJobSpec` is accepted too) or as ``spec_file``, read on
    the machine where the flow runs. It is validated for the dialect when the block is made.

    :meth:`astart` submits the job (or adopts it: the same key never makes a second job) and
    returns a run; its ``wait_for_completion()`` follows the job through admission and every
    attempt, with events, artifacts and labelled logs of every replica in the Prefect run.

    Example:
        Load a saved one by name::

            from kubedl_prefect.prefect import TrainingJob

            job = TrainingJob.load("BLOCK_NAME")

        In an async flow::

            from prefect import flow
            from kubedl_prefect.prefect import KubernetesCluster, TrainingJob

            @flow
            async def train() -> None:
                job = TrainingJob.from_spec_file(
                    "examples/pytorch-mnist.yaml", cluster=KubernetesCluster(namespace="ml")
                )
                run = await job.astart()
                await run.wait_for_completion()
                result = await run.fetch_result()
                print(result.phase, result.attempts)

        Sync flows use ``job.start()``, whose run has the same methods, blocking.
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    _block_type_name: ClassVar[str] = "KubeDL Training Job"
    _block_type_slug: ClassVar[str] = "kubedl-training-job"
    _logo_url: ClassVar[HttpUrl] = HttpUrl(LOGO_URL)
    _documentation_url: ClassVar[HttpUrl | None] = DOCUMENTATION_URL
    _description: ClassVar[str] = (
        "A distributed training job (PyTorch, TensorFlow, MPI, XGBoost) run by the KubeDL or "
        "Kubeflow operator: gang admission, watched phases, classified retries, adoption."
    )

    spec: dict[str, Any] | None = Field(
        default=None,
        title="Spec",
        description="The training-job spec's fields, as in its YAML file (name, image, replicas).",
    )
    spec_file: str | None = Field(
        default=None,
        title="Spec file",
        description=(
            "Or: a spec YAML file, read on the machine where the flow runs: a .yaml, .yml or "
            ".json file inside the flow's working directory (or the folder the worker's "
            "PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT names)."
        ),
    )
    cluster: KubernetesCluster | LocalCluster = Field(
        default_factory=KubernetesCluster,
        title="Cluster",
        description="Where the job runs: a Kubernetes cluster, or this machine (local).",
    )
    dialect: Literal["kubedl", "kubeflow", "trainer"] = Field(
        default="kubedl",
        title="Operator",
        description=(
            "kubedl (training.kubedl.io), kubeflow (kubeflow.org training operator) or trainer "
            "(Kubeflow Trainer v2 TrainJob)."
        ),
    )
    namespace: str | None = Field(
        default=None,
        title="Namespace",
        description="Where the job runs (default: the cluster's default namespace).",
    )
    key: str | None = Field(
        default=None,
        title="Key",
        description=(
            "The idempotency key: the same key adopts the same job, never a second one. Default: "
            "the flow run's id and the task's name, stable across retries of either."
        ),
    )
    retry: RetrySettings = Field(
        default_factory=RetrySettings,
        title="Retries",
        description=(
            "How often and how soon a retryable failure (eviction, preemption) runs again: "
            "each attempt is a job of its own, from the same checkpoint."
        ),
    )
    timeouts: WaitSettings = Field(
        default_factory=WaitSettings,
        title="Time limits",
        description="How long each waiting phase may take, in seconds (empty: no limit).",
    )
    stream_logs: bool = Field(
        default=True,
        title="Stream logs",
        description="Forward every replica's log lines to the Prefect run, labelled worker-1...",
    )
    log_lines_per_second: float = Field(
        default=20.0,
        gt=0,
        title="Log lines per second, per replica",
        description="Beyond this (after a burst) lines are held back and counted, not sent.",
    )

    @model_validator(mode="before")
    @classmethod
    def _spec_as_data(cls, values: Any) -> Any:
        if isinstance(values, dict) and isinstance(values.get("spec"), TrainingJobSpec):
            values = {**values, "spec": spec_to_data(values["spec"])}
        return values

    @model_validator(mode="before")
    @classmethod
    def _cluster_kind(cls, values: Any) -> Any:
        # Dumps name their block type; hand-written data without it is told apart by its fields
        # (both blocks accept unknown keys, so the union alone would take any dict as the first).
        cluster = values.get("cluster") if isinstance(values, dict) else None
        if isinstance(cluster, dict) and "block_type_slug" not in cluster:
            local = set(LocalCluster.model_fields) - set(KubernetesCluster.model_fields)
            if local & set(cluster):
                values = {**values, "cluster": LocalCluster.model_validate(cluster)}
        return values

    @model_validator(mode="after")
    def _check_spec(self) -> TrainingJob:
        if (self.spec is None) == (self.spec_file is None):
            raise ValueError("give the spec inline (spec) or as a file (spec_file), one of them")
        if self.spec is not None:
            validate(parse_spec(self.spec, source="the block's spec"), self.dialect)
        return self

    @classmethod
    def from_spec_file(cls, path: str | Path, *, inline: bool = True, **fields: Any) -> TrainingJob:
        """A block from a spec file: its content inline (default), or a reference to the file.

        Args:
            path: The spec YAML file.
            inline: Keep the spec's fields in the block (saved with it), rather than the path.
            **fields: The block's other fields (``cluster``, ``dialect``...).
        """
        if inline:
            return cls(spec=spec_to_data(load_spec(path)), **fields)
        return cls(spec_file=str(path), **fields)

    def training_spec(self) -> TrainingJobSpec:
        """The typed spec (read from :attr:`spec_file` when that is how it was given).

        A block is untrusted input: its ``spec_file`` is read only if it is a ``.yaml``,
        ``.yml`` or ``.json`` file inside the flow's working directory (or the folder of the
        setting ``PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT``), and the file's lines are quoted in
        errors only once it parsed as a spec (:func:`~kubedl_prefect.spec.load_untrusted_spec`).

        Raises:
            SpecError: The spec or the file is invalid, with every problem's field and fix.
        """
        if self.spec is not None:
            return parse_spec(self.spec, source="the block's spec")
        assert self.spec_file is not None
        from kubedl_prefect.prefect.settings import spec_root

        return load_untrusted_spec(self.spec_file, root=spec_root())

    def pod_security_warnings(self) -> list[PodSecurityFinding]:
        """The spec's settings that break a Pod Security level; :meth:`trigger` logs them.

        The Restricted ones, and the Baseline ones the spec allows with
        ``podSecurity: privileged`` (without it, the spec is refused).

        Raises:
            SpecError: As :meth:`training_spec`.
        """
        return pod_security_warnings(self.training_spec())

    def _log_pod_security_warnings(self) -> None:
        for finding in self.pod_security_warnings():
            self.logger.warning("Pod security: %s", finding)

    def resolved_namespace(self) -> str:
        """The namespace jobs run in: this block's, else its cluster's default.

        On a :class:`LocalCluster`, the workspace.
        """
        return self.namespace or self.cluster.namespace

    async def astart(self, key: str | None = None) -> TrainingJobRun:
        """Submit (or adopt) the job's next attempt and return a handle on the run.

        A logical job that a record says has ended already (the same key ran before) is not
        submitted again: the handle returns the recorded result.

        Args:
            key: The idempotency key (default: :attr:`key`, else the flow run's id and the
                task's name).

        Raises:
            SpecError: The spec is invalid for the dialect (nothing was sent).
            AdoptionRefusedError: The key was used for another spec.
            KubeDLPrefectError: No key was given outside a Prefect run.
        """
        from kubedl_prefect.prefect.runs import TrainingJobRun

        self._log_pod_security_warnings()
        return await TrainingJobRun.start(self, key=key)

    def start(self, key: str | None = None) -> SyncTrainingJobRun:
        """Blocking :meth:`astart` for sync flows; the run's methods block too."""
        from kubedl_prefect.prefect.runs import SyncTrainingJobRun

        self._log_pod_security_warnings()
        return SyncTrainingJobRun.start(self, key=key)

    async def trigger(self, key: str | None = None) -> TrainingJobRun:
        """:meth:`astart`, under the name Prefect's ``JobBlock`` interface gives it."""
        return await self.astart(key)

    def trigger_sync(self, key: str | None = None) -> SyncTrainingJobRun:
        """Deprecated: :meth:`start`."""
        warnings.warn(
            "TrainingJob.trigger_sync is deprecated and goes in the next release; "
            "use TrainingJob.start",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.start(key)

    async def areattach(self, data: dict[str, Any] | str) -> TrainingJobRun:
        """Re-attach to a run saved with ``run.to_dict()`` (from any process, after a crash)."""
        from kubedl_prefect.prefect.runs import TrainingJobRun

        return await TrainingJobRun.attach(self, data)

    def reattach(self, data: dict[str, Any] | str) -> SyncTrainingJobRun:
        """Blocking :meth:`areattach`; the run's methods block too."""
        from kubedl_prefect.prefect.runs import SyncTrainingJobRun

        return SyncTrainingJobRun.attach(self, data)

    async def attach(self, data: dict[str, Any] | str) -> TrainingJobRun:
        """Deprecated: :meth:`areattach`."""
        warnings.warn(
            "TrainingJob.attach is deprecated and goes in the next release; "
            "use TrainingJob.areattach",
            DeprecationWarning,
            stacklevel=2,
        )
        return await self.areattach(data)


def _a_cluster(name: str, loaded: object) -> ClusterBlock:
    if not isinstance(loaded, KubernetesCluster | LocalCluster):
        raise KubeDLPrefectError(
            f"block {name!r} is a {type(loaded).__name__}, not a cluster",
            hint="name a kubedl-kubernetes-cluster or kubedl-local-cluster block",
        )
    return loaded


def _no_cluster(name: str) -> KubeDLPrefectError:
    return KubeDLPrefectError(
        f"no cluster block named {name!r}",
        hint="save one first: KubernetesCluster(...).save(name) or LocalCluster().save(name)",
    )


def load_cluster(name: str) -> ClusterBlock:
    """The saved cluster block ``name``: a :class:`KubernetesCluster` or a :class:`LocalCluster`.

    ``name`` is a block's name (a Kubernetes cluster of that name first, else a local one) or
    ``<block type slug>/<name>`` (``kubedl-local-cluster/laptop``), as Prefect names blocks.

    Raises:
        KubeDLPrefectError: No cluster block has that name, or the block is of another type.
    """
    if "/" in name:
        return _a_cluster(name, Block.load(name))
    for kind in (KubernetesCluster, LocalCluster):
        try:
            return _a_cluster(name, kind.load(name))
        except ValueError:
            continue
    raise _no_cluster(name)


async def aload_cluster(name: str) -> ClusterBlock:
    """Async :func:`load_cluster`."""
    if "/" in name:
        return _a_cluster(name, await Block.aload(name))
    for kind in (KubernetesCluster, LocalCluster):
        try:
            return _a_cluster(name, await kind.aload(name))
        except ValueError:
            continue
    raise _no_cluster(name)


_Block = TypeVar("_Block", bound=Block)


def block_from(value: _Block | str, kind: type[_Block], what: str) -> _Block:
    """``value`` itself when it is a ``kind`` block, else the one saved under the name ``value``.

    Args:
        value: A block, or the name it was saved under.
        kind: The block class wanted.
        what: What it is, for the error (``"a training job block"``).

    Raises:
        KubeDLPrefectError: ``value`` is neither a ``kind`` block nor a name.
    """
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        loaded = kind.load(value)
        assert isinstance(loaded, kind)
        return loaded
    raise KubeDLPrefectError(
        f"not {what}: {type(value).__name__}",
        hint=f"pass a {kind.__name__} block or the name it was saved under",
    )


async def ablock_from(value: _Block | str, kind: type[_Block], what: str) -> _Block:
    """Async :func:`block_from` (loads a saved block without blocking the loop)."""
    if isinstance(value, str):
        loaded = await kind.aload(value)
        assert isinstance(loaded, kind)
        return loaded
    return block_from(value, kind, what)


def as_training_job(job: TrainingJob | str) -> TrainingJob:
    """A training job block from itself or from the name it was saved under."""
    return block_from(job, TrainingJob, "a training job block")
