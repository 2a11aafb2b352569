"""Porting operator manifests to specs: what ``kubedl-prefect import`` does.

:func:`import_manifests` reads KubeDL (``training.kubedl.io/v1alpha1``) or Kubeflow
(``kubeflow.org/v1``) PyTorchJobs, TFJobs, MPIJobs and XGBoostJobs and returns one spec per
document. The spec keeps the job's behaviour:

- every field with a typed home in the spec goes there (``docs/porting.md`` maps them); a field
  is typed only when the spec renders it back to the same value, else it stays raw;
- what has no typed home goes to the escape hatch, the role's ``podTemplate`` (or the top-level
  one when every role has the same), and a comment says so;
- where the operator's default differs from the spec's (restart policies, ``cleanPodPolicy``,
  KubeDL's XGBoost TTL...), the operator's value is written out, with a comment;
- settings every role shares go to the top level, the others under their role;
- pods that break the Baseline Pod Security level (privileged, host namespaces, hostPath...)
  keep their settings: the spec gets ``podSecurity: privileged`` and a comment saying so, and
  :attr:`ImportedSpec.warnings` lists them with the Restricted ones.

Job-level fields with no place in a spec (KubeDL's ``modelVersion``, ``cacheBackend``,
``cronPolicy``; Kubeflow's ``suspend: true``...) are refused with the field named, since there
is no job-level escape hatch. Before returning, the importer renders each spec in the
manifest's own dialect and compares the result with the manifest as the operator sees it
(:func:`~kubedl_prefect.spec.semantics.operator_view`): an import never silently changes a job.

Example:
    >>> (imported,) = import_manifests('''
    ... apiVersion: kubeflow.org/v1
    ... kind: TFJob
    ... metadata: {name: mnist}
    ... spec:
    ...   tfReplicaSpecs:
    ...     Worker:
    ...       replicas: 2
    ...       template:
    ...         spec:
    ...           containers: [{name: tensorflow, image: "tf:2.15"}]
    ... ''')
    >>> imported.spec.replicas["worker"].restart_policy.value, imported.spec.clean_pod_policy.value
    ('Never', 'None')
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import TypeAdapter, ValidationError

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.checks import CHECKPOINT_VOLUME
from kubedl_prefect.spec.io import dump_spec
from kubedl_prefect.spec.kube_types import EnvValue, Resources, Volume
from kubedl_prefect.spec.kueue import PRIORITY_CLASS_LABEL, QUEUE_LABEL
from kubedl_prefect.spec.model import ContainerSettings, TrainingJobSpec
from kubedl_prefect.spec.pod_security import (
    PRIVILEGED,
    PodSecurityFinding,
    PodSecurityLevel,
    pod_security_findings,
    pod_security_warnings,
)
from kubedl_prefect.spec.reader import (
    MANIFEST_LIMITS,
    data_issue,
    parse_documents,
    read_text_file,
    source_text,
)
from kubedl_prefect.spec.renderers import RenderOptions, render
from kubedl_prefect.spec.renderers.common import (
    dump_model,
    env_var,
    render_resources,
    volume_mount,
    volume_source,
)
from kubedl_prefect.spec.renderers.trainer import (
    DEFAULT_RUNTIMES,
    MPI_LAUNCHER_JOB,
    NODE_JOB,
    RUNTIME_KINDS,
    RUNTIME_PATCH_MANAGER,
    TRAINER_API_GROUP,
    TRAINER_CONTAINER,
    VOLCANO_QUEUE_ANNOTATION,
    trainer_issues,
    trainer_notes,
)
from kubedl_prefect.spec.semantics import (
    KUBEFLOW_MANAGER,
    LAST_APPLIED_ANNOTATION,
    NETWORK_MODE_ANNOTATION,
    TRAINER_RUNTIME_IMAGES,
    dialect_of,
    differences,
    framework_of,
    normal_form,
    operator_defaults,
    operator_view,
    replica_type_role,
    resources_view,
)
from kubedl_prefect.spec.types import (
    CHECKPOINT_ENV,
    FRAMEWORKS,
    GPU_RESOURCE,
    NCCL_IFNAME_ENV,
    TRAINJOB_KIND,
    Dialect,
    Framework,
    Role,
    default_restart_policy,
    job_resource,
)
from kubedl_prefect.spec.validation import issues_from_validation_error, parse_path

__all__ = [
    "DialectChoice",
    "ImportedSpec",
    "Note",
    "dump_imported",
    "import_file",
    "import_manifest",
    "import_manifests",
    "import_path",
]


class DialectChoice(StrEnum):
    """The dialect of the manifests to import: ``auto`` reads it from each ``apiVersion``."""

    AUTO = "auto"
    KUBEDL = "kubedl"
    KUBEFLOW = "kubeflow"
    TRAINER = "trainer"


@dataclass(frozen=True)
class Note:
    """A comment the importer puts into the spec it writes.

    Attributes:
        path: The spec field it is about (``replicas.worker.restartPolicy``); ``""``: the spec.
        text: The comment.
    """

    path: str
    text: str


@dataclass(frozen=True)
class ImportedSpec:
    """A spec made from one manifest, with the importer's comments.

    Attributes:
        spec: The spec.
        dialect: The dialect of the manifest (render it for this one to get the same job).
        kind: The manifest's kind.
        name: The manifest's job name.
        namespace: The manifest's namespace (not part of a spec), if it had one.
        notes: What the importer changed, defaulted, or kept raw, per spec field.
        warnings: The spec's settings that break a Pod Security Standards level (see
            :func:`~kubedl_prefect.spec.pod_security.pod_security_warnings`): the Restricted
            ones, and the Baseline ones the import allowed with ``podSecurity: privileged``.
    """

    spec: TrainingJobSpec
    dialect: Dialect
    kind: str
    name: str
    namespace: str | None
    notes: tuple[Note, ...] = ()
    warnings: tuple[PodSecurityFinding, ...] = ()

    def to_yaml(self) -> str:
        """The spec as YAML, each note a comment above the field it is about.

        A v1 job's spec also says what rendering it for Kubeflow Trainer v2 (``--dialect
        trainer``) changes, or why Trainer cannot run it (:meth:`trainer_migration`).
        """
        header = [
            f"# Imported from the {self.dialect.value} {self.kind} {self.name!r} by "
            "kubedl-prefect import."
        ]
        header.append(
            f"# Render it with --dialect {self.dialect.value} for the same job"
            + (f" (and --namespace {self.namespace})." if self.namespace else ".")
        )
        if self.dialect is not Dialect.TRAINER:
            for line in self.trainer_migration():
                indent = "  " if line.startswith("  ") else ""
                wrapped = textwrap.wrap(line.strip(), width=94 - len(indent))
                header += [f"# {indent}{wrapped[0]}", *(f"# {indent}  {w}" for w in wrapped[1:])]
        return _with_comments(dump_spec(self.spec), self.notes, header)

    def trainer_migration(self) -> list[str]:
        """What ``--dialect trainer`` (a Kubeflow Trainer v2 ``TrainJob``) does with this spec.

        The settings a TrainJob runs differently (:func:`~.renderers.trainer.trainer_notes`),
        or, when Trainer cannot run it, each refusal with its fix.
        """
        issues = trainer_issues(self.spec)
        if issues:
            return [
                "With --dialect trainer (Kubeflow Trainer v2) this job is refused until:",
                *(f"  {issue.path}: {issue.problem} (fix: {issue.fix})" for issue in issues),
            ]
        return [
            "With --dialect trainer (Kubeflow Trainer v2) it renders as a TrainJob; what changes:",
            *(f"  {path}: {text}" for path, text in trainer_notes(self.spec)),
        ]


def dump_imported(imported: Iterable[ImportedSpec]) -> str:
    """Several imported specs as one YAML stream, with their comments."""
    return "".join(f"---\n{item.to_yaml()}" for item in imported)


def import_file(path: str | Path, dialect: DialectChoice | Dialect | str = "auto") -> str:
    """Import the manifests in the file at ``path`` and return the specs as YAML.

    Raises:
        SpecError: If the file cannot be read, holds no training job, or a job cannot be
            ported; each issue names the manifest field.
    """
    return dump_imported(import_path(path, dialect))


def import_path(
    path: str | Path, dialect: DialectChoice | Dialect | str = "auto"
) -> list[ImportedSpec]:
    """The specs of the manifests in the file at ``path`` (:func:`import_file`, not dumped).

    Raises:
        SpecError: As :func:`import_file`.
    """
    file = Path(path)
    text = read_text_file(file, MANIFEST_LIMITS)
    return import_manifests(text, dialect=dialect, source=str(file))


def import_manifests(
    text: str, *, dialect: DialectChoice | Dialect | str | None = None, source: str | None = None
) -> list[ImportedSpec]:
    """One spec per manifest in the YAML ``text`` (``kind: List`` documents are expanded).

    Args:
        text: One or several YAML documents.
        dialect: ``kubedl``, ``kubeflow``, or ``auto``/``None`` (from each ``apiVersion``).
        source: Where the text came from, for error messages.

    Raises:
        SpecError: If the text holds no manifest, or one cannot be ported.
    """
    documents = parse_documents(text, source=source, limits=MANIFEST_LIMITS)
    manifests: list[tuple[str, Any]] = []
    for index, (_, data) in enumerate(documents, 1):
        if data is None:
            continue
        where = f"document {index}" if len(documents) > 1 else "the document"
        if isinstance(data, dict) and data.get("kind") == "List":
            for number, item in enumerate(data.get("items") or [], 1):
                manifests.append((f"{where}, item {number}", item))
        else:
            manifests.append((where, data))
    if not manifests:
        raise SpecError(
            [SpecIssue("(document)", "no manifest found", "give a PyTorchJob, TFJob, MPIJob...")],
            source=source,
        )
    runtimes = {
        (str(data.get("kind")), str((data.get("metadata") or {}).get("name"))): data
        for _, data in manifests
        if isinstance(data, dict) and data.get("kind") in RUNTIME_KINDS
    }
    imported: list[ImportedSpec] = []
    for where, data in manifests:
        if isinstance(data, dict) and data.get("kind") in RUNTIME_KINDS:
            continue  # a TrainJob of the same file reads it (its image, its framework)
        label = f"{source}: {where}" if source else where
        if isinstance(data, dict) and data.get("kind") == TRAINJOB_KIND:
            choice = DialectChoice(dialect) if dialect is not None else DialectChoice.AUTO
            hint = None if choice is DialectChoice.AUTO else Dialect(choice.value)
            imported.append(_TrainJobImporter(data, hint, label, runtimes).run())
        else:
            imported.append(import_manifest(data, dialect=dialect, source=label))
    if not imported:
        raise SpecError(
            [SpecIssue("(document)", "no job found, only runtimes", "give a TrainJob too")],
            source=source,
        )
    return imported


def import_manifest(
    manifest: Any,
    *,
    dialect: DialectChoice | Dialect | str | None = None,
    source: str | None = None,
) -> ImportedSpec:
    """The spec of one manifest (see the module docstring).

    Raises:
        SpecError: If the manifest is not a training job of a supported kind, or has fields
            the spec cannot hold; each issue's path is the manifest field.
    """
    choice = DialectChoice(dialect) if dialect is not None else DialectChoice.AUTO
    hint = None if choice is DialectChoice.AUTO else Dialect(choice.value)
    if isinstance(manifest, dict) and manifest.get("kind") == TRAINJOB_KIND:
        return _TrainJobImporter(manifest, hint, source).run()
    return _Importer(manifest, hint, source).run()


# --- the importer ------------------------------------------------------------------------------

_MISSING: Final = object()
_MANIFEST_DATA_LIMITS: Final = dataclasses.replace(MANIFEST_LIMITS, what="manifest")
_SERVER_FIELDS: Final = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
)
_RUN_POLICY: Final = ("cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds")
_CONTAINER_FIELDS: Final = {  # container key -> spec field
    "image": "image",
    "imagePullPolicy": "imagePullPolicy",
    "command": "command",
    "args": "args",
    "workingDir": "workingDir",
}
_POD_FIELDS: Final = {  # pod key -> spec field
    "nodeSelector": "nodeSelector",
    "priorityClassName": "priorityClassName",
    "serviceAccountName": "serviceAccountName",
}
_SPLIT_FIELDS: Final = (
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "workingDir",
    "resources",
    "ports",
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "serviceAccountName",
    "imagePullSecrets",
    "containerName",
)
_HOST_DNS: Final = "ClusterFirstWithHostNet"


@functools.cache
def _adapter(spec_field: str) -> TypeAdapter[Any]:
    for name, info in ContainerSettings.model_fields.items():
        if spec_field in (name, info.alias):
            return TypeAdapter(info.annotation) if info.annotation is not None else TypeAdapter(Any)
    raise KeyError(spec_field)


def _typed(spec_field: str, value: Any) -> Any:
    """``value`` as the spec field's type, or ``_MISSING`` when the field cannot hold it."""
    try:
        return _adapter(spec_field).validate_python(value)
    except ValidationError:
        return _MISSING


def _same(left: Any, right: Any) -> bool:
    return bool(normal_form(left) == normal_form(right))


@dataclass
class _Role:
    """One replica of the manifest, taken apart."""

    role: Role
    path: str  # manifest path of the replica spec
    count: int
    restart_policy: str | None
    settings: dict[str, Any] = field(default_factory=dict)  # typed, YAML spelling
    env: list[tuple[str, Any]] | None = None  # typed env; None: none or raw
    main_name: str = ""
    main_rest: dict[str, Any] = field(default_factory=dict)  # main container, no typed home
    pod_rest: dict[str, Any] = field(default_factory=dict)  # pod fields, no typed home
    sidecars: list[Any] = field(default_factory=list)
    labels: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)
    volumes: list[Any] = field(default_factory=list)
    mounts: list[Any] = field(default_factory=list)
    raw_notes: list[str] = field(default_factory=list)  # what went to the escape hatch


class _Importer:
    def __init__(self, manifest: Any, hint: Dialect | None, source: str | None) -> None:
        self.manifest = manifest
        self.hint = hint
        self.source = source
        self.issues: list[SpecIssue] = []
        self.notes: list[Note] = []
        self.kueue_queued = False  # Kueue's labels: a suspended job is Kueue's to resume

    # -- helpers --

    def fail(self, path: str, problem: str, fix: str) -> None:
        self.issues.append(SpecIssue(path, problem, fix))

    def note(self, path: str, text: str) -> None:
        self.notes.append(Note(path, text))

    def fatal(self, path: str, problem: str, fix: str) -> SpecError:
        return SpecError([SpecIssue(path, problem, fix)], source=self.source)

    # -- the steps --

    def run(self) -> ImportedSpec:
        manifest = self.manifest
        bounded = data_issue(manifest, _MANIFEST_DATA_LIMITS)  # Python data has no text bound
        if bounded is not None:
            raise SpecError([bounded], source=self.source)
        if not isinstance(manifest, dict):
            raise self.fatal(
                "(document)",
                f"a manifest is a mapping, not {type(manifest).__name__}",
                "give a job manifest (apiVersion, kind, metadata, spec)",
            )
        self.dialect, self.framework = self._kind(manifest)
        self.info = FRAMEWORKS[self.framework]
        self.defaults = operator_defaults(self.dialect, self.framework)
        for key in manifest:
            if key == "status":
                self.note("", "The manifest's status was left out.")
            elif key not in ("apiVersion", "kind", "metadata", "spec"):
                self.fail(str(key), f"{key!r} is not a field of a job", "remove it")
        name, namespace, labels, annotations = self._metadata(manifest.get("metadata"))
        body = manifest.get("spec")
        if not isinstance(body, dict):
            raise self.fatal("spec", "the manifest has no spec", "give the job's spec")
        data: dict[str, Any] = {"name": name, "framework": self.framework.value}
        kueue = self._kueue_labels(labels)
        self.kueue_queued = bool(kueue)
        if kueue:
            data["kueue"] = kueue
        self._job_fields(body, data)
        roles = self._roles(body)
        if self.issues:
            raise SpecError(self.issues, source=self.source)
        self._combine(roles, data, labels, annotations)
        if self.issues:
            raise SpecError(self.issues, source=self.source)
        spec = self._spec(data)
        self._check_round_trip(spec, namespace)
        return ImportedSpec(
            spec=spec,
            dialect=self.dialect,
            kind=self.info.kind,
            name=name,
            namespace=namespace,
            notes=tuple(self.notes),
            warnings=tuple(pod_security_warnings(spec)),
        )

    def _kind(self, manifest: dict[str, Any]) -> tuple[Dialect, Framework]:
        api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            raise self.fatal(
                "apiVersion",
                "the manifest needs apiVersion and kind",
                "give e.g. apiVersion: kubeflow.org/v1 and kind: PyTorchJob",
            )
        dialect = dialect_of(api_version)
        framework = framework_of(kind)
        kinds = ", ".join(info.kind for info in FRAMEWORKS.values())
        if dialect is None:
            raise self.fatal(
                "apiVersion",
                f"{api_version!r} is neither KubeDL's training.kubedl.io/v1alpha1 nor "
                "Kubeflow's kubeflow.org/v1",
                f"import a KubeDL or Kubeflow {kinds}",
            )
        if framework is None:
            raise self.fatal("kind", f"kind {kind!r} cannot be imported", f"import one of: {kinds}")
        expected = job_resource(dialect, framework).api_version
        if api_version != expected:
            raise self.fatal(
                "apiVersion",
                f"{api_version!r} is not the version this operator serves",
                f"port the manifest to {expected} first",
            )
        if self.hint is not None and self.hint is not dialect:
            raise self.fatal(
                "apiVersion",
                f"--dialect {self.hint.value} was asked for, but {api_version} is "
                f"{dialect.value}'s API",
                f"use --dialect {dialect.value} or --dialect auto",
            )
        return dialect, framework

    def _metadata(self, metadata: Any) -> tuple[str, str | None, dict[str, Any], dict[str, Any]]:
        if not isinstance(metadata, dict):
            raise self.fatal("metadata", "the manifest has no metadata", "give metadata.name")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            fix = "name the job (metadata.name); generateName has no place in a spec"
            raise self.fatal("metadata.name", "the job has no name", fix)
        namespace = metadata.get("namespace")
        dropped = [key for key in _SERVER_FIELDS if key in metadata]
        if dropped:
            self.note("", f"Fields set by the API server were left out: {', '.join(dropped)}.")
        for key in metadata:
            if key in ("name", "namespace", "labels", "annotations", *_SERVER_FIELDS):
                continue
            self.fail(
                f"metadata.{key}",
                f"metadata.{key} has no place in a spec (kubedl-prefect creates the job itself)",
                f"remove metadata.{key}",
            )
        labels = dict(metadata.get("labels") or {})
        annotations = dict(metadata.get("annotations") or {})
        if annotations.pop(LAST_APPLIED_ANNOTATION, None) is not None:
            self.note("", f"The {LAST_APPLIED_ANNOTATION} annotation was left out.")
        return name, namespace if isinstance(namespace, str) else None, labels, annotations

    def _job_fields(self, body: dict[str, Any], data: dict[str, Any]) -> None:
        dialect, framework = self.dialect, self.framework
        known = {self.info.replica_specs_field}
        inline = dialect is Dialect.KUBEDL and framework is not Framework.MPI
        if inline:
            policy = body
            known |= {*_RUN_POLICY, "backoffLimit", "schedulingPolicy"}
            prefix = "spec"
        else:
            raw = body.get("runPolicy")
            policy = raw if isinstance(raw, dict) else {}
            known.add("runPolicy")
            prefix = "spec.runPolicy"
            if framework is Framework.MPI and body.get("cleanPodPolicy") is not None:
                known.add("cleanPodPolicy")  # legacy, still read by both operators
                if dialect is Dialect.KUBEDL or policy.get("cleanPodPolicy") is None:
                    policy = {**policy, "cleanPodPolicy": body["cleanPodPolicy"]}
            if framework is Framework.MPI and dialect is Dialect.KUBEDL:
                # KubeDL's inline legacy copy of the run policy (rendered beside the nested one,
                # see renderers/kubedl.py): accepted where it agrees with the nested one.
                for key in (
                    "ttlSecondsAfterFinished",
                    "activeDeadlineSeconds",
                    "backoffLimit",
                    "schedulingPolicy",
                ):
                    if key not in body:
                        continue
                    known.add(key)
                    if key not in policy:
                        policy = {**policy, key: body[key]}
                    elif policy[key] != body[key]:
                        self.fail(
                            f"spec.{key}",
                            f"spec.{key} differs from spec.runPolicy.{key}",
                            "give the same value in both places, or only in spec.runPolicy",
                        )
            self._run_policy_extras(policy, prefix)
        for key in ("backoffLimit", *_RUN_POLICY):
            if policy.get(key) is not None:
                data[key] = policy[key]
        if "cleanPodPolicy" not in data:
            operator = self.defaults.clean_pod_policy.value
            if operator != TrainingJobSpec.model_fields["clean_pod_policy"].default.value:
                data["cleanPodPolicy"] = operator
                self.note(
                    "cleanPodPolicy",
                    f"cleanPodPolicy {operator} is the operator's default for {_a(self.info.kind)} "
                    "(the spec's is Running): written out so that the job behaves the same.",
                )
        ttl = self.defaults.ttl_seconds_after_finished
        if "ttlSecondsAfterFinished" not in data and ttl is not None:
            data["ttlSecondsAfterFinished"] = ttl
            self.note(
                "ttlSecondsAfterFinished",
                f"KubeDL deletes a finished {self.info.kind} after {ttl} s when no TTL is set: "
                "written out.",
            )
        self._scheduling(policy.get("schedulingPolicy"), f"{prefix}.schedulingPolicy", data)
        known |= self._framework_fields(body, data)
        for key in body:
            if key not in known:
                self.fail(
                    f"spec.{key}",
                    f"spec.{key} has no place in a spec (kubedl-prefect has no job-level escape "
                    "hatch)",
                    f"remove spec.{key} from the manifest, or run this job without kubedl-prefect",
                )

    def _kueue_labels(self, labels: dict[str, Any]) -> dict[str, Any]:
        """The spec's ``kueue`` from Kueue's labels on a v1 job (taken out of ``labels``)."""
        kueue: dict[str, Any] = {}
        if QUEUE_LABEL in labels:
            kueue["queue"] = labels.pop(QUEUE_LABEL)
            if PRIORITY_CLASS_LABEL in labels:
                kueue["priorityClass"] = labels.pop(PRIORITY_CLASS_LABEL)
        return kueue

    def _run_policy_extras(self, policy: dict[str, Any], prefix: str) -> None:
        for key, value in policy.items():
            if key in (*_RUN_POLICY, "backoffLimit", "schedulingPolicy"):
                continue
            if key == "suspend" and value is True and self.kueue_queued:
                self.note(
                    "kueue", "runPolicy.suspend: true is Kueue's: the job waits for its admission."
                )
            elif key == "suspend" and value is False:
                self.note("", "runPolicy.suspend: false (the default) was left out.")
            elif key == "managedBy" and value == KUBEFLOW_MANAGER:
                self.note(
                    "", f"runPolicy.managedBy: {KUBEFLOW_MANAGER} (the default) was left out."
                )
            else:
                self.fail(
                    f"{prefix}.{key}",
                    f"{prefix}.{key} has no place in a spec",
                    f"remove {key} (kubedl-prefect submits, suspends and cancels jobs itself)",
                )

    def _scheduling(self, scheduling: Any, path: str, data: dict[str, Any]) -> None:
        if scheduling is None:
            return
        if not isinstance(scheduling, dict):
            self.fail(path, "schedulingPolicy must be a mapping", "fix the manifest")
            return
        priority = "priorityClassName" if self.dialect is Dialect.KUBEDL else "priorityClass"
        gang: dict[str, Any] = {}
        for key, value in scheduling.items():
            if key == "minAvailable":
                gang["minAvailable"] = value
            elif key == "queue":
                gang["queue"] = value
            elif key == priority:
                gang["priorityClass"] = value
            else:
                self.fail(
                    f"{path}.{key}",
                    f"schedulingPolicy.{key} has no place in a spec",
                    f"remove {key}; the spec's gang has minAvailable, queue and priorityClass",
                )
        if gang:
            data["gang"] = gang

    def _framework_fields(self, body: dict[str, Any], data: dict[str, Any]) -> set[str]:
        framework, dialect = self.framework, self.dialect
        known: set[str] = set()
        if framework is Framework.TENSORFLOW and "successPolicy" in body:
            known.add("successPolicy")
            data["successPolicy"] = body["successPolicy"]
        if framework is Framework.MPI:
            known |= {"slotsPerWorker", "mainContainer"}
            if body.get("slotsPerWorker") is not None:
                data["slotsPerWorker"] = body["slotsPerWorker"]
        if framework is Framework.PYTORCH and dialect is Dialect.KUBEFLOW:
            known |= {"elasticPolicy", "nprocPerNode"}
            if body.get("nprocPerNode") is not None:
                data["nprocPerNode"] = body["nprocPerNode"]
            if body.get("elasticPolicy") is not None:
                self._elastic(body["elasticPolicy"], body, data)
        return known

    def _elastic(self, policy: Any, body: dict[str, Any], data: dict[str, Any]) -> None:
        path = "spec.elasticPolicy"
        if not isinstance(policy, dict):
            self.fail(path, "elasticPolicy must be a mapping", "fix the manifest")
            return
        elastic: dict[str, Any] = {}
        for key, value in policy.items():
            if key in ("minReplicas", "maxReplicas", "maxRestarts", "rdzvBackend", "metrics"):
                elastic[key] = value
            elif key == "nProcPerNode":
                self.fail(
                    f"{path}.nProcPerNode",
                    "elasticPolicy.nProcPerNode is deprecated and has no place in a spec",
                    "move it to spec.nprocPerNode (as a string)",
                )
            else:
                self.fail(
                    f"{path}.{key}",
                    f"elasticPolicy.{key} has no place in a spec",
                    "remove it; the spec's elastic has minReplicas, maxReplicas, maxRestarts, "
                    "rdzvBackend and metrics",
                )
        if "rdzvBackend" not in elastic:
            self.fail(
                f"{path}.rdzvBackend",
                "elasticPolicy has no rdzvBackend; the spec always sets one",
                "add rdzvBackend: c10d (torchrun's usual backend) to the manifest",
            )
        workers = self._worker_count(body)
        for bound, other in (("minReplicas", "maxReplicas"), ("maxReplicas", "minReplicas")):
            if elastic.get(bound) is None:
                value = elastic.get(other, workers)
                elastic[bound] = value
                self.note(
                    f"elastic.{bound}",
                    f"elastic.{bound} {value}: the operator's default when the manifest gives "
                    "none.",
                )
        data["elastic"] = elastic

    def _worker_count(self, body: dict[str, Any]) -> Any:
        for key, replica in (body.get(self.info.replica_specs_field) or {}).items():
            if replica_type_role(str(key), self.framework) is Role.WORKER and isinstance(
                replica, dict
            ):
                return replica.get("replicas", self.defaults.worker_replicas)
        return None

    # -- replicas --

    def _roles(self, body: dict[str, Any]) -> list[_Role]:
        field_name = self.info.replica_specs_field
        specs = body.get(field_name)
        path = f"spec.{field_name}"
        if not isinstance(specs, dict) or not specs:
            self.fail(path, "the job has no replicas", f"give {field_name}")
            return []
        roles: list[_Role] = []
        seen: set[Role] = set()
        allowed = ", ".join(r.replica_type for r in self.info.roles)
        for key, replica in specs.items():
            where = f"{path}.{key}"
            role = replica_type_role(str(key), self.framework)
            if role is None:
                self.fail(where, f"{key!r} is not a replica type of a {self.info.kind}", allowed)
                continue
            if role in seen:
                self.fail(where, f"replica type {role.replica_type} is given twice", "keep one")
                continue
            seen.add(role)
            if not isinstance(replica, dict):
                self.fail(where, "a replica spec must be a mapping", "fix the manifest")
                continue
            parsed = self._replica(role, replica, where)
            if parsed is not None:
                roles.append(parsed)
        order = self.info.roles
        return sorted(roles, key=lambda r: order.index(r.role))

    def _replica(self, role: Role, replica: dict[str, Any], path: str) -> _Role | None:
        for key in replica:
            if key not in ("replicas", "restartPolicy", "template"):
                self.fail(f"{path}.{key}", f"{key} has no place in a spec", f"remove {key}")
        count = replica.get("replicas")
        if count is None:
            count = self.defaults.worker_replicas if role is Role.WORKER else 1
            if count == 0:
                self.fail(
                    f"{path}.replicas",
                    "the operator runs no workers when replicas is unset; a spec role has at "
                    "least one replica",
                    "set replicas",
                )
        elif isinstance(count, int) and not isinstance(count, bool) and count < 1:
            self.fail(
                f"{path}.replicas",
                f"replicas is {count}; a spec role has at least one replica",
                "remove the replica type, or give it replicas",
            )
        restart = replica.get("restartPolicy") or None
        spec_path = f"replicas.{role.value}.restartPolicy"
        if restart is None:
            operator = self.defaults.restart_policies.get(role)
            if operator is None:
                self.fail(
                    f"{path}.restartPolicy",
                    f"the manifest gives no restart policy and KubeDL sets none for "
                    f"{_a(self.info.kind)}, so its pods restart with Kubernetes' Always, which the "
                    "spec refuses (a crashing replica would restart forever)",
                    "set restartPolicy (OnFailure restarts in place, bounded by backoffLimit)",
                )
            else:
                restart = operator.value
                if operator is not default_restart_policy(role):
                    self.note(
                        spec_path,
                        f"restartPolicy {operator.value} is the operator's default for a "
                        f"{role.replica_type} of {_a(self.info.kind)} (the spec's is "
                        f"{default_restart_policy(role).value}): written out.",
                    )
        elif restart == "Always":
            self.fail(
                f"{path}.restartPolicy",
                "restartPolicy Always restarts a failing replica forever, so the job never fails; "
                "the spec refuses it",
                "use OnFailure (restarts in place, bounded by backoffLimit) or ExitCode",
            )
        template = replica.get("template")
        if not isinstance(template, dict):
            self.fail(f"{path}.template", "the replica has no pod template", "give template")
            return None
        parsed = _Role(role, path, count, restart)
        self._template(parsed, template, f"{path}.template")
        return parsed

    def _template(self, parsed: _Role, template: dict[str, Any], path: str) -> None:
        for key in template:
            if key not in ("metadata", "spec"):
                self.note(
                    f"replicas.{parsed.role.value}",
                    f"{path}.{key} was left out: a pod template has only metadata and spec, and "
                    "the API server drops the rest.",
                )
        metadata = template.get("metadata") or {}
        if isinstance(metadata, dict):
            parsed.labels = dict(metadata.get("labels") or {})
            parsed.annotations = dict(metadata.get("annotations") or {})
            for key in metadata:
                if key not in ("labels", "annotations"):
                    self.note(
                        f"replicas.{parsed.role.value}",
                        f"{path}.metadata.{key} was left out: the operator names the pods.",
                    )
        pod = template.get("spec")
        if not isinstance(pod, dict):
            self.fail(f"{path}.spec", "the pod template has no spec", "give template.spec")
            return
        pod = copy.deepcopy(pod)
        containers = pod.pop("containers", None)
        if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
            self.fail(f"{path}.spec.containers", "the pod has no containers", "add the container")
            return
        main_index = self._main_index(parsed, containers, f"{path}.spec.containers")
        if main_index is None:
            return
        if main_index:
            parsed.raw_notes.append("the training container now comes first in the pod")
        main = dict(containers[main_index])
        parsed.sidecars = [c for i, c in enumerate(containers) if i != main_index]
        parsed.main_name = str(main.pop("name"))
        self._container(parsed, main)
        pod.pop("restartPolicy", None)
        self._pod(parsed, pod)

    def _main_index(self, parsed: _Role, containers: list[Any], path: str) -> int | None:
        wanted = self.info.container_name(self.dialect)
        for index, container in enumerate(containers):
            if container.get("name") == wanted:
                return index
        if self.framework is Framework.MPI and containers and containers[0].get("name"):
            name = containers[0]["name"]
            parsed.settings["containerName"] = name
            return 0
        names = ", ".join(repr(c.get("name")) for c in containers)
        self.fail(
            path,
            f"no container is named {wanted!r} ({names}): the {self.dialect.value} operator "
            f"configures the container of that name ({self.info.kind}'s training container)",
            f"name the training container {wanted}",
        )
        return None

    def _container(self, parsed: _Role, main: dict[str, Any]) -> None:
        for key, spec_field in _CONTAINER_FIELDS.items():
            if key in main:
                value = main.pop(key)
                if _typed(spec_field, value) is _MISSING or value is None:
                    parsed.main_rest[key] = value
                else:
                    parsed.settings[spec_field] = value
        if "resources" in main:
            resources = self._resources(main["resources"])
            if resources is not _MISSING:
                main.pop("resources")
                if resources:
                    parsed.settings["resources"] = resources
        if "ports" in main:
            typed = _typed("ports", main["ports"])
            if (
                typed is not _MISSING
                and typed
                and _same([dump_model(port) for port in typed], main["ports"])
            ):
                parsed.settings["ports"] = main.pop("ports")
        if "env" in main:
            env = self._env(main["env"])
            if env is not None:
                parsed.env = env
                main.pop("env")
        if "volumeMounts" in main:
            mounts = main.pop("volumeMounts")
            if isinstance(mounts, list):
                parsed.mounts = list(mounts)
            else:
                parsed.main_rest["volumeMounts"] = mounts
        parsed.main_rest.update(main)

    def _resources(self, raw: Any) -> Any:
        if not isinstance(raw, dict) or set(raw) - {"limits", "requests"}:
            return _MISSING
        limits, requests = dict(raw.get("limits") or {}), dict(raw.get("requests") or {})
        data: dict[str, Any] = {}
        gpus = limits.pop(GPU_RESOURCE, None)
        if gpus is not None:
            count = _whole(gpus)
            if count is None:
                return _MISSING
            data["gpus"] = count
            if _whole(requests.get(GPU_RESOURCE)) == count:
                requests.pop(GPU_RESOURCE)
        for name in ("cpu", "memory"):
            if name in limits and name in requests and _text(limits[name]) == _text(requests[name]):
                data[name] = _text(limits.pop(name))
                requests.pop(name)
        if limits:
            data["limits"] = limits
        if requests:
            data["requests"] = requests
        try:
            typed = Resources.model_validate(data)
        except ValidationError:
            return _MISSING
        if resources_view(render_resources(typed)) != resources_view(raw):
            return _MISSING
        return data

    def _env(self, items: Any) -> list[tuple[str, Any]] | None:
        if not isinstance(items, list):
            return None
        names = [item.get("name") if isinstance(item, dict) else None for item in items]
        if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            return None
        env: list[tuple[str, Any]] = []
        for item in items:
            keys = set(item) - {"name"}
            if keys <= {"value"}:
                value: Any = item.get("value", "")
            elif keys == {"valueFrom"} and isinstance(item["valueFrom"], dict):
                value = item["valueFrom"]
            else:
                return None
            try:
                typed = EnvValue.model_validate(
                    {"value": value} if isinstance(value, str) else value
                )
            except ValidationError:
                return None
            if not _same(env_var(item["name"], typed), item):
                return None
            env.append((item["name"], value))
        return env

    def _pod(self, parsed: _Role, pod: dict[str, Any]) -> None:
        for key, spec_field in _POD_FIELDS.items():
            if key in pod and _typed(spec_field, pod[key]) not in (_MISSING, None):
                parsed.settings[spec_field] = pod.pop(key)
        if "tolerations" in pod:
            typed = _typed("tolerations", pod["tolerations"])
            if (
                typed not in (_MISSING, None)
                and typed
                and _same([dump_model(t) for t in typed], pod["tolerations"])
            ):
                parsed.settings["tolerations"] = pod.pop("tolerations")
        if "affinity" in pod:
            typed = _typed("affinity", pod["affinity"])
            if (
                typed not in (_MISSING, None)
                and dump_model(typed)
                and _same(dump_model(typed), pod["affinity"])
            ):
                parsed.settings["affinity"] = pod.pop("affinity")
        secrets = pod.get("imagePullSecrets")
        if (
            isinstance(secrets, list)
            and secrets
            and all(isinstance(s, dict) and set(s) == {"name"} for s in secrets)
        ):
            names = [s["name"] for s in secrets]
            if _typed("imagePullSecrets", names) is not _MISSING:
                parsed.settings["imagePullSecrets"] = names
                pod.pop("imagePullSecrets")
        volumes = pod.pop("volumes", None)
        if isinstance(volumes, list):
            parsed.volumes = volumes
        elif volumes is not None:
            pod["volumes"] = volumes
        parsed.pod_rest = pod

    # -- putting the roles together --

    def _combine(
        self,
        roles: list[_Role],
        data: dict[str, Any],
        labels: dict[str, Any],
        annotations: dict[str, Any],
    ) -> None:
        host_network = self._host_network(roles, annotations)
        if host_network:
            data["network"] = {"hostNetwork": True}
            if self.dialect is Dialect.KUBEDL:
                annotations.pop(NETWORK_MODE_ANNOTATION, None)
        scheduler = self._shared_pod_value(roles, "schedulerName")
        if isinstance(scheduler, str) and scheduler:
            data.setdefault("gang", {})["scheduler"] = scheduler
            for parsed in roles:
                parsed.pod_rest.pop("schedulerName")
        self._reserved_env(roles, data)
        self._volumes(roles, data)
        self._settings(roles, data)
        if labels:
            data["labels"] = labels
        if annotations:
            data["annotations"] = annotations
        fragments = [self._fragment(parsed, labels, annotations) for parsed in roles]
        replicas: dict[str, Any] = {role.role.value: {"count": role.count} for role in roles}
        for parsed in roles:
            if parsed.restart_policy and parsed.restart_policy != default_restart_policy(
                parsed.role
            ):
                replicas[parsed.role.value]["restartPolicy"] = parsed.restart_policy
        shared = len(roles) > 1 and all(f == fragments[0] for f in fragments)
        if len(roles) == 1 or shared:
            if fragments[0]:
                data["podTemplate"] = fragments[0]
                self._raw_note("podTemplate", roles[0])
        else:
            for parsed, fragment in zip(roles, fragments, strict=True):
                if fragment:
                    replicas[parsed.role.value]["podTemplate"] = fragment
                    self._raw_note(f"replicas.{parsed.role.value}.podTemplate", parsed)
        data["replicas"] = {
            role: fields["count"] if set(fields) == {"count"} else fields
            for role, fields in replicas.items()
        }

    def _raw_note(self, path: str, parsed: _Role) -> None:
        extra = "; ".join(dict.fromkeys(parsed.raw_notes))
        self.note(
            path,
            "No typed home in the spec for these fields of the manifest's pod template: kept "
            "as written (the escape hatch)" + (f"; {extra}." if extra else "."),
        )

    def _host_network(self, roles: list[_Role], annotations: dict[str, Any]) -> bool:
        flags = [(r.pod_rest.get("hostNetwork"), r.pod_rest.get("dnsPolicy")) for r in roles]
        pods = all(f == (True, _HOST_DNS) for f in flags)
        if self.dialect is Dialect.KUBEDL:
            annotated = annotations.get(NETWORK_MODE_ANNOTATION) == "host"
            # KubeDL sets the pod fields itself for annotated jobs.
            pods_ok = pods or all(f in ((None, None), (True, _HOST_DNS)) for f in flags)
            typed = annotated and pods_ok
        else:
            typed = pods
        if typed:
            for parsed in roles:
                parsed.pod_rest.pop("hostNetwork", None)
                parsed.pod_rest.pop("dnsPolicy", None)
        return typed

    @staticmethod
    def _shared_pod_value(roles: list[_Role], key: str) -> Any:
        values = [r.pod_rest.get(key, _MISSING) for r in roles]
        if values and all(v == values[0] for v in values) and values[0] is not _MISSING:
            return values[0]
        return _MISSING

    def _reserved_env(self, roles: list[_Role], data: dict[str, Any]) -> None:
        """``KUBEDL_PREFECT_CHECKPOINT_DIR`` and ``NCCL_SOCKET_IFNAME`` where the spec puts them."""
        location = self._env_tail(roles, CHECKPOINT_ENV)
        if location is not None:
            checkpoint: dict[str, Any] = {"location": location}
            claim = self._checkpoint_claim(roles)
            if claim is not None:
                checkpoint |= claim
            data["checkpoint"] = checkpoint
        interface = self._env_tail(roles, NCCL_IFNAME_ENV)
        if interface is not None:
            data["network"] = {**data.get("network", {}), "ncclSocketIfname": interface}
        for parsed in roles:
            names = {name for name, _ in parsed.env or []}
            if CHECKPOINT_ENV in names:  # set by hand: the spec keeps it raw
                parsed.main_rest["env"] = [
                    _env_item(name, value) for name, value in parsed.env or []
                ]
                parsed.env = None

    def _env_tail(self, roles: list[_Role], name: str) -> str | None:
        values = []
        for parsed in roles:
            env = parsed.env
            if not env or env[-1][0] != name or not isinstance(env[-1][1], str):
                return None
            values.append(env[-1][1])
        if len(set(values)) != 1:
            return None
        for parsed in roles:
            assert parsed.env is not None
            parsed.env = parsed.env[:-1]
        return values[0]

    def _checkpoint_claim(self, roles: list[_Role]) -> dict[str, Any] | None:
        found = []
        for parsed in roles:
            volume = next((v for v in parsed.volumes if _named(v, CHECKPOINT_VOLUME)), None)
            mount = next((m for m in parsed.mounts if _named(m, CHECKPOINT_VOLUME)), None)
            claim = (volume or {}).get("persistentVolumeClaim") or {}
            if (
                volume is None
                or mount is None
                or set(volume) != {"name", "persistentVolumeClaim"}
                or set(claim) != {"claimName"}
                or set(mount) != {"name", "mountPath"}
            ):
                return None
            found.append((claim["claimName"], mount["mountPath"]))
        if len(set(found)) != 1:
            return None
        for parsed in roles:
            parsed.volumes = [v for v in parsed.volumes if not _named(v, CHECKPOINT_VOLUME)]
            parsed.mounts = [m for m in parsed.mounts if not _named(m, CHECKPOINT_VOLUME)]
        claim_name, mount_path = found[0]
        result: dict[str, Any] = {"pvc": claim_name}
        if mount_path != "/checkpoints":
            result["mountPath"] = mount_path
        return result

    def _volumes(self, roles: list[_Role], data: dict[str, Any]) -> None:
        typed_per_role = [self._typed_volumes(parsed) for parsed in roles]
        first = typed_per_role[0]
        common = [
            name
            for name in first
            if all(name in other and other[name][0] == first[name][0] for other in typed_per_role)
        ]
        if common:
            data["volumes"] = [first[name][0] for name in common]
        for parsed in roles:
            rest_volumes = [v for v in parsed.volumes if not _named_in(v, common)]
            rest_mounts = [m for m in parsed.mounts if not _named_in(m, common)]
            if rest_volumes:
                parsed.pod_rest["volumes"] = rest_volumes
            if rest_mounts:
                parsed.main_rest["volumeMounts"] = rest_mounts

    def _typed_volumes(self, parsed: _Role) -> dict[str, tuple[dict[str, Any], Any]]:
        typed: dict[str, tuple[dict[str, Any], Any]] = {}
        mounts: dict[str, list[Any]] = {}
        for mount in parsed.mounts:
            if isinstance(mount, dict) and isinstance(mount.get("name"), str):
                mounts.setdefault(mount["name"], []).append(mount)
        for volume in parsed.volumes:
            if not isinstance(volume, dict) or not isinstance(volume.get("name"), str):
                continue
            name = volume["name"]
            if name == CHECKPOINT_VOLUME or len(mounts.get(name, [])) != 1:
                continue
            mount = mounts[name][0]
            candidate = _volume_data(volume, mount)
            if candidate is None:
                continue
            try:
                model = Volume.model_validate(candidate)
            except ValidationError:
                continue
            if _same(volume_source(model), volume) and _same(volume_mount(model), mount):
                typed[name] = (candidate, model)
        return typed

    def _settings(self, roles: list[_Role], data: dict[str, Any]) -> None:
        for spec_field in _SPLIT_FIELDS:
            values = [parsed.settings.get(spec_field, _MISSING) for parsed in roles]
            if all(v is not _MISSING for v in values) and all(_same(v, values[0]) for v in values):
                data[spec_field] = values[0]
                for parsed in roles:
                    parsed.settings.pop(spec_field)
        for parsed in roles:
            if "image" not in data and "image" not in parsed.settings:
                self.fail(
                    f"{parsed.path}.template.spec.containers",
                    f"the {parsed.role.replica_type} training container has no image",
                    "give it an image",
                )
        envs = [parsed.env for parsed in roles]
        if all(env is not None for env in envs):
            prefix = _common_prefix([env or [] for env in envs])
        else:
            prefix = []
        if prefix:
            data["env"] = dict(prefix)
        for parsed in roles:
            rest = (parsed.env or [])[len(prefix) :]
            if rest:
                parsed.settings["env"] = dict(rest)
        self._role_settings = {parsed.role: dict(parsed.settings) for parsed in roles}

    def _fragment(
        self, parsed: _Role, labels: dict[str, Any], annotations: dict[str, Any]
    ) -> dict[str, Any]:
        fragment: dict[str, Any] = {}
        metadata: dict[str, Any] = {}
        for part, job, pod in (
            ("labels", labels, parsed.labels),
            ("annotations", annotations, parsed.annotations),
        ):
            diff: dict[str, Any] = {k: v for k, v in pod.items() if job.get(k, _MISSING) != v}
            diff |= {k: None for k in job if k not in pod}
            if diff:
                metadata[part] = diff
        if metadata:
            fragment["metadata"] = metadata
        pod = dict(parsed.pod_rest)
        containers = []
        if parsed.main_rest:
            containers.append({"name": parsed.main_name, **parsed.main_rest})
        containers += parsed.sidecars
        if containers:
            pod["containers"] = containers
        if pod:
            fragment["spec"] = pod
        return fragment

    def _spec(self, data: dict[str, Any]) -> TrainingJobSpec:
        for role, settings in self._role_settings.items():
            entry = data["replicas"][role.value]
            if settings:
                if not isinstance(entry, dict):
                    entry = {"count": entry}
                entry.update(settings)
                data["replicas"][role.value] = entry
        # An import keeps the job as it is: pods that break the Baseline Pod Security level
        # keep their settings, and the spec says so (podSecurity: privileged, and a note).
        spec = self._validated({**data, "podSecurity": PRIVILEGED})
        breakers = [
            f.path for f in pod_security_findings(spec) if f.level is PodSecurityLevel.BASELINE
        ]
        if not breakers:
            return self._validated(data)
        shown = ", ".join(breakers[:5]) + (
            f" and {len(breakers) - 5} more" if len(breakers) > 5 else ""
        )
        self.note(
            "podSecurity",
            f"The manifest's pods break the Baseline Pod Security level ({shown}): "
            f"podSecurity: {PRIVILEGED} keeps them, so the job runs as before, in a namespace "
            "that allows privileged pods. Remove them (and this line) to run under Baseline.",
        )
        return spec

    def _validated(self, data: dict[str, Any]) -> TrainingJobSpec:
        try:
            return TrainingJobSpec.model_validate(data)
        except ValidationError as exc:
            issues = issues_from_validation_error(exc)
            raise SpecError(
                [
                    SpecIssue(
                        f"(spec) {issue.path}",
                        f"the imported spec is invalid: {issue.problem}",
                        f"fix the manifest: {issue.fix}",
                    )
                    for issue in issues
                ],
                source=self.source,
            ) from exc

    def _check_round_trip(self, spec: TrainingJobSpec, namespace: str | None) -> None:
        try:
            rendered = render(spec, self.dialect, RenderOptions(namespace=namespace))
        except SpecError as exc:
            raise SpecError(
                [
                    SpecIssue(
                        f"(spec) {issue.path}",
                        f"the imported spec does not render for {self.dialect.value}: "
                        f"{issue.problem}",
                        f"fix the manifest: {issue.fix}",
                    )
                    for issue in exc.issues
                ],
                source=self.source,
            ) from exc
        found = differences(
            operator_view(self.manifest, self.dialect), operator_view(rendered, self.dialect)
        )
        if found:
            shown = "; ".join(found[:5]) + (
                f" (and {len(found) - 5} more)" if len(found) > 5 else ""
            )
            raise SpecError(
                [
                    SpecIssue(
                        "(import)",
                        "the imported spec would not run the same job: " + shown,
                        "this is a bug of kubedl-prefect import: report it with the manifest, "
                        "and port this job by hand meanwhile",
                    )
                ],
                source=self.source,
            )


# --- Kubeflow Trainer v2 TrainJobs -----------------------------------------------------------

_TRAINJOB_SPEC_FIELDS: Final = (
    "runtimeRef",
    "trainer",
    "runtimePatches",
    "activeDeadlineSeconds",
    "suspend",
    "managedBy",
)
_TRAINER_FIELDS: Final = (
    "image",
    "command",
    "args",
    "env",
    "numNodes",
    "numProcPerNode",
    "resourcesPerNode",
)
_RUNTIME_WORDS: Final = (  # a runtime of one's own, told by its name
    ("deepspeed", Framework.MPI),
    ("mpi", Framework.MPI),
    ("mlx", Framework.MPI),
    ("xgboost", Framework.XGBOOST),
    ("torch", Framework.PYTORCH),
)


class _TrainJobImporter(_Importer):
    """A ``TrainJob`` to a spec: the trainer, the runtime, the runtime patches' pod settings.

    Trainer runs every node from one template, so the spec has one role (PyTorch ``worker``,
    XGBoost ``master`` and workers, MPI ``launcher`` and workers, as the renderer reads them).
    A TrainJob without an image runs its runtime's: the spec writes it out, read from a runtime
    given in the same file or from the ones Trainer v2.3.0 installs.
    """

    def __init__(
        self,
        manifest: Any,
        hint: Dialect | None,
        source: str | None,
        runtimes: Mapping[tuple[str, str], Any] | None = None,
    ) -> None:
        super().__init__(manifest, hint, source)
        self.runtimes = dict(runtimes or {})
        self.runtime_image: str | None = None

    def run(self) -> ImportedSpec:
        manifest = self.manifest
        bounded = data_issue(manifest, _MANIFEST_DATA_LIMITS)
        if bounded is not None:
            raise SpecError([bounded], source=self.source)
        self.dialect = Dialect.TRAINER
        api_version = manifest.get("apiVersion")
        expected = job_resource(Dialect.TRAINER, Framework.PYTORCH).api_version
        if api_version != expected:
            raise self.fatal(
                "apiVersion",
                f"{api_version!r} is not the TrainJob version Trainer v2.3 serves",
                f"port the manifest to {expected} first",
            )
        if self.hint is not None and self.hint is not Dialect.TRAINER:
            raise self.fatal(
                "apiVersion",
                f"--dialect {self.hint.value} was asked for, but a TrainJob is Kubeflow Trainer's",
                "use --dialect trainer or --dialect auto",
            )
        for key in manifest:
            if key == "status":
                self.note("", "The manifest's status was left out.")
            elif key not in ("apiVersion", "kind", "metadata", "spec"):
                self.fail(str(key), f"{key!r} is not a field of a TrainJob", "remove it")
        name, namespace, labels, annotations = self._metadata(manifest.get("metadata"))
        body = manifest.get("spec")
        if not isinstance(body, dict):
            raise self.fatal("spec", "the manifest has no spec", "give the TrainJob's spec")
        kueue = self._kueue(labels, body)
        self.kueue_queued = bool(kueue)
        self._job_spec_fields(body)
        runtime = self._runtime(body.get("runtimeRef"))
        self.framework = self._framework(runtime)
        self.info = FRAMEWORKS[self.framework]
        self.defaults = operator_defaults(Dialect.KUBEFLOW, self.framework)
        data: dict[str, Any] = {"name": name, "framework": self.framework.value}
        if kueue:
            data["kueue"] = kueue
        if runtime != {"name": DEFAULT_RUNTIMES[self.framework]}:
            data["runtime"] = runtime
        if body.get("activeDeadlineSeconds") is not None:
            data["activeDeadlineSeconds"] = body["activeDeadlineSeconds"]
        parsed, nodes, procs = self._trainer(body.get("trainer"))
        queue = self._patches(body.get("runtimePatches"), parsed)
        if queue is not None:
            data["gang"] = {"queue": queue}
        if self.issues:
            raise SpecError(self.issues, source=self.source)
        self._combine([parsed], data, labels, annotations)
        self._shape(data, nodes, procs)
        if self.issues:
            raise SpecError(self.issues, source=self.source)
        spec = self._spec(data)
        self._check_round_trip(spec, namespace)
        return ImportedSpec(
            spec=spec,
            dialect=Dialect.TRAINER,
            kind=TRAINJOB_KIND,
            name=name,
            namespace=namespace,
            notes=tuple(self.notes),
            warnings=tuple(pod_security_warnings(spec)),
        )

    kueue_queued = False

    def _kueue(self, labels: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """The spec's ``kueue`` from Kueue's labels; ``suspend: true`` is then Kueue's."""
        kueue: dict[str, Any] = {}
        if QUEUE_LABEL in labels:
            kueue["queue"] = labels.pop(QUEUE_LABEL)
            if PRIORITY_CLASS_LABEL in labels:
                kueue["priorityClass"] = labels.pop(PRIORITY_CLASS_LABEL)
            if body.get("suspend") is True:
                self.note("kueue", "suspend: true is Kueue's: the job waits for its admission.")
        return kueue

    def _job_spec_fields(self, body: dict[str, Any]) -> None:
        for key, value in body.items():
            if key == "suspend" and value is True and self.kueue_queued:
                continue
            if key in ("suspend", "managedBy"):
                default = False if key == "suspend" else "trainer.kubeflow.org/trainjob-controller"
                if value == default:
                    self.note("", f"spec.{key}: {value!r} (the default) was left out.")
                else:
                    self.fail(
                        f"spec.{key}",
                        f"spec.{key} has no place in a spec",
                        f"remove {key} (kubedl-prefect submits, suspends and cancels jobs itself)",
                    )
            elif key == "initializer":
                self.fail(
                    "spec.initializer",
                    "the dataset and model initializers have no place in a spec",
                    "remove spec.initializer (download in the training program, or from an init "
                    "container of a runtime of your own)",
                )
            elif key not in _TRAINJOB_SPEC_FIELDS:
                what = (
                    "podTemplateOverrides was replaced by runtimePatches in Trainer v2.2"
                    if key == "podTemplateOverrides"
                    else f"spec.{key} is not a field of a TrainJob of Trainer v2.3"
                )
                self.fail(f"spec.{key}", what, f"remove spec.{key}, or port it to runtimePatches")

    def _runtime(self, ref: Any) -> dict[str, Any]:
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref["name"]:
            raise self.fatal("spec.runtimeRef", "the TrainJob names no runtime", "give runtimeRef")
        runtime: dict[str, Any] = {"name": ref["name"]}
        for key, value in ref.items():
            if key == "apiGroup" and value != TRAINER_API_GROUP:
                self.fail(
                    "spec.runtimeRef.apiGroup",
                    f"runtimeRef.apiGroup {value!r} is not Trainer's",
                    f"use {TRAINER_API_GROUP} (or leave it out)",
                )
            elif key == "kind":
                if value not in RUNTIME_KINDS:
                    self.fail(
                        "spec.runtimeRef.kind",
                        f"runtimeRef.kind {value!r} is not a runtime kind",
                        f"use one of: {', '.join(RUNTIME_KINDS)}",
                    )
                elif value != RUNTIME_KINDS[0]:
                    runtime["kind"] = value
            elif key not in ("name", "apiGroup"):
                self.fail(f"spec.runtimeRef.{key}", f"runtimeRef.{key} is unknown", "remove it")
        return runtime

    def _given_runtime(self, runtime: dict[str, Any]) -> Any:
        kind = runtime.get("kind", RUNTIME_KINDS[0])
        return self.runtimes.get((str(kind), str(runtime["name"])))

    def _framework(self, runtime: dict[str, Any]) -> Framework:
        name = str(runtime["name"])
        given = self._given_runtime(runtime)
        if isinstance(given, dict):
            policy = (given.get("spec") or {}).get("mlPolicy") or {}
            for key, framework in (
                ("torch", Framework.PYTORCH),
                ("mpi", Framework.MPI),
                ("xgboost", Framework.XGBOOST),
            ):
                if key in policy:
                    self.note("framework", f"The framework is the ML policy of runtime {name!r}.")
                    return framework
        for framework, default in DEFAULT_RUNTIMES.items():
            if name == default:
                return framework
        for word, framework in _RUNTIME_WORDS:
            if word in name:
                self.note(
                    "framework",
                    f"The framework is read from the runtime's name {name!r}: check it.",
                )
                return framework
        self.note(
            "framework",
            f"The runtime {name!r} does not say its framework: pytorch is assumed; set "
            "framework to the runtime's ML policy.",
        )
        return Framework.PYTORCH

    def _trainer(self, trainer: Any) -> tuple[_Role, int, Any]:
        path = "spec.trainer"
        role = {Framework.MPI: Role.LAUNCHER, Framework.XGBOOST: Role.MASTER}.get(
            self.framework, Role.WORKER
        )
        parsed = _Role(role, path, 1, None)
        parsed.main_name = self.info.container_name(Dialect.KUBEFLOW)
        if not isinstance(trainer, dict):
            self.fail(path, "the TrainJob has no trainer", "give spec.trainer (image, command...)")
            return parsed, 1, None
        for key in trainer:
            if key not in _TRAINER_FIELDS:
                self.fail(f"{path}.{key}", f"trainer.{key} is unknown", "remove it")
        if "image" not in trainer:
            image = self._runtime_image()
            if image is None:
                self.fail(
                    f"{path}.image",
                    "the TrainJob runs its runtime's image, which the spec cannot know (the "
                    "runtime is neither in this file nor one Trainer installs)",
                    "give trainer.image, or import the runtime in the same file",
                )
            else:
                parsed.settings["image"] = image
                self.runtime_image = image
                self.note("image", "The runtime's image, which the TrainJob runs: written out.")
        for key in ("image", "command", "args"):
            if key in trainer:
                if _typed(key, trainer[key]) in (_MISSING, None):
                    self.fail(f"{path}.{key}", f"trainer.{key} is not valid", "fix it")
                else:
                    parsed.settings[key] = trainer[key]
        if "env" in trainer:
            env = self._env(trainer["env"])
            if env is None:
                self.fail(f"{path}.env", "trainer.env is not a list of variables", "fix it")
            else:
                parsed.env = env
        if "resourcesPerNode" in trainer:
            resources = self._resources(trainer["resourcesPerNode"])
            if resources is _MISSING:
                self.fail(
                    f"{path}.resourcesPerNode",
                    "resourcesPerNode has no typed home in a spec",
                    "give limits and requests of cpu, memory, nvidia.com/gpu...",
                )
            elif resources:
                parsed.settings["resources"] = resources
        nodes = trainer.get("numNodes", 1)
        if "numNodes" not in trainer:
            self.note("replicas", "numNodes 1: the default of Trainer's own runtimes.")
        if not (isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1):
            self.fail(f"{path}.numNodes", f"numNodes {nodes!r} is not a node count", "give one")
            nodes = 1
        return parsed, nodes, trainer.get("numProcPerNode")

    def _runtime_image(self) -> str | None:
        ref = (self.manifest.get("spec") or {}).get("runtimeRef") or {}
        runtime = {"name": ref.get("name"), **({"kind": ref["kind"]} if "kind" in ref else {})}
        given = self._given_runtime(runtime)
        if isinstance(given, dict):
            template = ((given.get("spec") or {}).get("template") or {}).get("spec") or {}
            for job in template.get("replicatedJobs") or []:
                labels = ((job.get("template") or {}).get("metadata") or {}).get("labels") or {}
                if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
                    continue
                pod = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
                for container in (pod.get("spec") or {}).get("containers") or []:
                    if container.get("name") == TRAINER_CONTAINER and container.get("image"):
                        return str(container["image"])
            return None
        if runtime.get("kind", RUNTIME_KINDS[0]) != RUNTIME_KINDS[0]:
            return None
        return TRAINER_RUNTIME_IMAGES.get(str(runtime["name"]))

    def _check_round_trip(self, spec: TrainingJobSpec, namespace: str | None) -> None:
        if self.runtime_image is not None:  # compare with the image the runtime gives
            manifest = copy.deepcopy(self.manifest)
            manifest["spec"]["trainer"]["image"] = self.runtime_image
            self.manifest = manifest
        super()._check_round_trip(spec, namespace)

    def _patches(self, patches: Any, parsed: _Role) -> str | None:
        """The runtime patches, merged, into ``parsed``; the Volcano queue if one is named."""
        if patches is None:
            return None
        path = "spec.runtimePatches"
        if not isinstance(patches, list):
            self.fail(path, "runtimePatches must be a list", "fix the manifest")
            return None
        queue = None
        pods: list[tuple[str, Any]] = []
        for index, patch in enumerate(patches):
            where = f"{path}[{index}]"
            if not isinstance(patch, dict):
                self.fail(where, "a runtime patch must be a mapping", "fix the manifest")
                continue
            manager = patch.get("manager")
            if manager != RUNTIME_PATCH_MANAGER:
                self.note(
                    "",
                    f"The runtime patch of manager {manager!r} is kept in the spec; "
                    f"kubedl-prefect writes it back under its own ({RUNTIME_PATCH_MANAGER}).",
                )
            if "time" in patch:
                self.note("", f"{where}.time (set by Trainer's webhook) was left out.")
            for key in patch:
                if key not in ("manager", "time", "trainingRuntimeSpec"):
                    self.fail(f"{where}.{key}", f"{key} is not a field of a patch", "remove it")
            template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
            for key in template:
                if key not in ("metadata", "spec"):
                    self.fail(f"{where}.trainingRuntimeSpec.template.{key}", "unknown", "remove")
            metadata = template.get("metadata") or {}
            for key, value in metadata.items():
                if key == "annotations" and set(value or {}) <= {VOLCANO_QUEUE_ANNOTATION}:
                    queue = (value or {}).get(VOLCANO_QUEUE_ANNOTATION, queue)
                else:
                    self.fail(
                        f"{where}.trainingRuntimeSpec.template.metadata.{key}",
                        "the JobSet's labels and annotations have no place in a spec (but the "
                        f"Volcano queue, {VOLCANO_QUEUE_ANNOTATION})",
                        "remove them, or put them on the TrainJob",
                    )
            jobs = (template.get("spec") or {}).get("replicatedJobs") or []
            for job_index, job in enumerate(jobs):
                job_path = f"{where}.trainingRuntimeSpec.template.spec.replicatedJobs[{job_index}]"
                pods.append((job_path, job))
        self._pod_patches(pods, parsed)
        return queue

    def _pod_patches(self, jobs: list[tuple[str, Any]], parsed: _Role) -> None:
        wanted = [NODE_JOB] if self.framework is not Framework.MPI else [MPI_LAUNCHER_JOB, NODE_JOB]
        merged: dict[str, Any] = {}
        for path, job in jobs:
            name = job.get("name") if isinstance(job, dict) else None
            if name not in wanted:
                self.fail(
                    f"{path}.name",
                    f"a patch of replicated Job {name!r}: the spec patches {', '.join(wanted)}",
                    "remove it, or run this job without kubedl-prefect",
                )
                continue
            template = job.get("template") or {}
            if set(template) - {"spec"} or set(template.get("spec") or {}) - {"template"}:
                self.fail(
                    f"{path}.template", "a Job's own fields have no place in a spec", "remove"
                )
                continue
            pod = ((template.get("spec") or {}).get("template")) or {}
            merged[name] = pod if name not in merged else _merge_pod(merged[name], pod)
        pods = [merged.get(name, {}) for name in wanted]
        if any(not _same(pod, pods[0]) for pod in pods):
            self.fail(
                "spec.runtimePatches",
                "the launcher's and the nodes' pods are patched differently; a spec gives every "
                "pod the same settings",
                "patch both alike",
            )
            return
        pod_patch = copy.deepcopy(pods[0])
        metadata = pod_patch.get("metadata") or {}
        parsed.labels = dict(metadata.get("labels") or {})
        parsed.annotations = dict(metadata.get("annotations") or {})
        pod = dict(pod_patch.get("spec") or {})
        containers = pod.pop("containers", None) or []
        for item in containers:
            if not isinstance(item, dict) or item.get("name") != TRAINER_CONTAINER:
                self.fail(
                    "spec.runtimePatches",
                    f"a patch of container {item.get('name') if isinstance(item, dict) else item!r}"
                    ": the spec patches only the training container, node",
                    "remove it",
                )
                continue
            rest = {k: v for k, v in item.items() if k != "name"}
            mounts = rest.pop("volumeMounts", None)
            if isinstance(mounts, list):
                parsed.mounts = list(mounts)
            elif mounts is not None:
                rest["volumeMounts"] = mounts
            parsed.main_rest.update(rest)
        if pod.get("initContainers"):
            self.fail(
                "spec.runtimePatches", "init container patches have no place in a spec", "remove"
            )
            pod.pop("initContainers")
        self._pod(parsed, pod)

    def _shape(self, data: dict[str, Any], nodes: int, procs: Any) -> None:
        framework = self.framework
        if framework is Framework.PYTORCH:
            data["replicas"] = {"worker": nodes}
        elif framework is Framework.XGBOOST:
            data["replicas"] = {"master": 1, **({"worker": nodes - 1} if nodes > 1 else {})}
        else:
            if nodes < 2:
                self.fail(
                    "spec.trainer.numNodes",
                    f"an MPI TrainJob of {nodes} node: the spec's MPI jobs have a launcher and "
                    "at least one worker (numNodes 2 or more)",
                    "set numNodes to 2 or more",
                )
                return
            launcher: dict[str, Any] = {"count": 1}
            for key in ("command", "args"):
                if key in data:
                    launcher[key] = data.pop(key)
            data["replicas"] = {"launcher": launcher, "worker": nodes - 1}
        if procs is None:
            return
        if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
            self.fail("spec.trainer.numProcPerNode", f"{procs!r} is not a count", "give one")
        elif framework is Framework.PYTORCH:
            data["nprocPerNode"] = str(procs)
        elif framework is Framework.MPI:
            data["slotsPerWorker"] = procs
        else:
            self.fail(
                "spec.trainer.numProcPerNode",
                "numProcPerNode has no place in an XGBoost spec",
                "remove it",
            )


def _merge_pod(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge_pod(merged[key], value) if key in merged else value
        return merged
    return override


# --- small helpers ---------------------------------------------------------------------------


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "AEIMX" else f"a {kind}"


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _text(value: Any) -> str:
    return source_text(value) if isinstance(value, int | float) else str(value)


def _named(item: Any, name: str) -> bool:
    return isinstance(item, dict) and item.get("name") == name


def _named_in(item: Any, names: Sequence[str]) -> bool:
    return isinstance(item, dict) and item.get("name") in names


def _env_item(name: str, value: Any) -> dict[str, Any]:
    return (
        {"name": name, "value": value}
        if isinstance(value, str)
        else {"name": name, "valueFrom": value}
    )


def _common_prefix(envs: list[list[tuple[str, Any]]]) -> list[tuple[str, Any]]:
    prefix: list[tuple[str, Any]] = []
    for items in zip(*envs, strict=False):
        if all(item == items[0] for item in items):
            prefix.append(items[0])
        else:
            break
    return prefix


_SOURCES: Final[Mapping[str, Callable[[dict[str, Any]], dict[str, Any] | None]]] = {
    "persistentVolumeClaim": lambda s: {"pvc": s.get("claimName")},
    "emptyDir": lambda s: {"emptyDir": s},
    "hostPath": lambda s: {"hostPath": s},
    "configMap": lambda s: {"configMap": s.get("name")},
    "secret": lambda s: {"secret": s.get("secretName")},
}


def _volume_data(volume: dict[str, Any], mount: Any) -> dict[str, Any] | None:
    sources = [key for key in volume if key != "name"]
    if len(sources) != 1 or sources[0] not in _SOURCES or not isinstance(mount, dict):
        return None
    source = volume[sources[0]]
    if not isinstance(source, dict):
        return None
    data: dict[str, Any] = {"name": volume["name"], "mountPath": mount.get("mountPath")}
    converted = _SOURCES[sources[0]](source)
    if converted is None:
        return None
    data |= converted
    if "readOnly" in mount:
        data["readOnly"] = mount["readOnly"]
    if "subPath" in mount:
        data["subPath"] = mount["subPath"]
    return data


# --- comments ----------------------------------------------------------------------------------


def _with_comments(text: str, notes: Sequence[Note], header: list[str]) -> str:
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    above: dict[int, list[str]] = {}
    head = list(header)
    for note in notes:
        where = _key_line(node, note.path) if note.path else None
        if where is None:
            head.append(f"# {note.text}" if not note.path else f"# {note.path}: {note.text}")
        else:
            above.setdefault(where, []).append(note.text)
    lines = text.splitlines()
    out = [*head]
    for number, line in enumerate(lines):
        indent = line[: len(line) - len(line.lstrip())]
        for comment in above.get(number, []):
            out.append(f"{indent}# {comment}")
        out.append(line)
    return "\n".join(out) + "\n"


def _key_line(node: yaml.Node | None, path: str) -> int | None:
    current = node
    line = None
    for part in parse_path(path):
        if not isinstance(current, yaml.MappingNode):
            return None
        for key, value in current.value:
            if key.value == part:
                line, current = key.start_mark.line, value
                break
        else:
            return None
    return line
