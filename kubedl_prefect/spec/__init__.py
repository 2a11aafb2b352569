"""Training-job specs: the framework-neutral model, its validation, and rendering.

Pure: no cluster access, no I/O beyond reading and writing YAML text.

The names below are loaded on first use, so that a program importing one module of the
spec layer (the ``kubedl-prefect validate`` command) does not import them all: the importer
(:mod:`.porting`), the operators' semantics and the renderers are not needed to validate.

Example:
    >>> from kubedl_prefect.spec import loads_spec, render
    >>> spec = loads_spec('''
    ... name: mnist
    ... image: ghcr.io/example/mnist:1.0
    ... replicas:
    ...   master: 1
    ...   worker: {count: 2, resources: {gpus: 1}}
    ... ''')
    >>> manifest = render(spec, "kubedl")
    >>> manifest["kind"], sorted(manifest["spec"]["pytorchReplicaSpecs"])
    ('PyTorchJob', ['Master', 'Worker'])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kubedl_prefect.spec.printable import share_with_pyyaml as _share_with_pyyaml

# Before any module of the layer imports PyYAML: its import then skips a costly compile
# (kubedl_prefect.spec.printable says which and why).
_share_with_pyyaml()

_EXPORTS: dict[str, str] = {
    "spec_hash": "kubedl_prefect.spec.hashing",
    "SPEC_ROOT_ENV": "kubedl_prefect.spec.io",
    "dump_manifests": "kubedl_prefect.spec.io",
    "dump_spec": "kubedl_prefect.spec.io",
    "dump_yaml": "kubedl_prefect.spec.io",
    "load_spec": "kubedl_prefect.spec.io",
    "load_untrusted_spec": "kubedl_prefect.spec.io",
    "loads_spec": "kubedl_prefect.spec.io",
    "loads_spec_with_warnings": "kubedl_prefect.spec.io",
    "spec_root": "kubedl_prefect.spec.io",
    "spec_to_data": "kubedl_prefect.spec.io",
    "Affinity": "kubedl_prefect.spec.affinity",
    "ContainerPort": "kubedl_prefect.spec.kube_types",
    "EmptyDir": "kubedl_prefect.spec.kube_types",
    "EnvValue": "kubedl_prefect.spec.kube_types",
    "HostPath": "kubedl_prefect.spec.kube_types",
    "MetricSpec": "kubedl_prefect.spec.metrics",
    "MetricTarget": "kubedl_prefect.spec.metrics",
    "Resources": "kubedl_prefect.spec.kube_types",
    "Toleration": "kubedl_prefect.spec.kube_types",
    "Volume": "kubedl_prefect.spec.kube_types",
    "Checkpoint": "kubedl_prefect.spec.model",
    "ContainerSettings": "kubedl_prefect.spec.model",
    "Elastic": "kubedl_prefect.spec.model",
    "Gang": "kubedl_prefect.spec.model",
    "Network": "kubedl_prefect.spec.model",
    "ResolvedRole": "kubedl_prefect.spec.model",
    "RoleSpec": "kubedl_prefect.spec.model",
    "TrainingJobSpec": "kubedl_prefect.spec.model",
    "ATTEMPT_SUFFIX_MAX_LENGTH": "kubedl_prefect.spec.naming",
    "MAX_ATTEMPT": "kubedl_prefect.spec.naming",
    "job_name": "kubedl_prefect.spec.naming",
    "key_hash": "kubedl_prefect.spec.naming",
    "max_spec_name_length": "kubedl_prefect.spec.naming",
    "PodSecurityFinding": "kubedl_prefect.spec.pod_security",
    "PodSecurityLevel": "kubedl_prefect.spec.pod_security",
    "pod_security_findings": "kubedl_prefect.spec.pod_security",
    "pod_security_warnings": "kubedl_prefect.spec.pod_security",
    "ImportedSpec": "kubedl_prefect.spec.porting",
    "import_manifest": "kubedl_prefect.spec.porting",
    "import_manifests": "kubedl_prefect.spec.porting",
    "MAX_SPEC_BYTES": "kubedl_prefect.spec.reader",
    "MAX_MANIFEST_BYTES": "kubedl_prefect.spec.renderers",
    "Manifest": "kubedl_prefect.spec.renderers",
    "RenderOptions": "kubedl_prefect.spec.renderers",
    "render": "kubedl_prefect.spec.renderers",
    "differences": "kubedl_prefect.spec.semantics",
    "operator_view": "kubedl_prefect.spec.semantics",
    "CHECKPOINT_ENV": "kubedl_prefect.spec.types",
    "GPU_RESOURCE": "kubedl_prefect.spec.types",
    "CleanPodPolicy": "kubedl_prefect.spec.types",
    "Dialect": "kubedl_prefect.spec.types",
    "Framework": "kubedl_prefect.spec.types",
    "ImagePullPolicy": "kubedl_prefect.spec.types",
    "JobResource": "kubedl_prefect.spec.types",
    "RestartPolicy": "kubedl_prefect.spec.types",
    "Role": "kubedl_prefect.spec.types",
    "job_resource": "kubedl_prefect.spec.types",
    "as_dialect": "kubedl_prefect.spec.validation",
    "parse_spec": "kubedl_prefect.spec.validation",
    "validate": "kubedl_prefect.spec.validation",
}

__all__ = [
    "ATTEMPT_SUFFIX_MAX_LENGTH",
    "CHECKPOINT_ENV",
    "GPU_RESOURCE",
    "MAX_ATTEMPT",
    "MAX_MANIFEST_BYTES",
    "MAX_SPEC_BYTES",
    "SPEC_ROOT_ENV",
    "Affinity",
    "Checkpoint",
    "CleanPodPolicy",
    "ContainerPort",
    "ContainerSettings",
    "Dialect",
    "Elastic",
    "EmptyDir",
    "EnvValue",
    "Framework",
    "Gang",
    "HostPath",
    "ImagePullPolicy",
    "ImportedSpec",
    "JobResource",
    "Manifest",
    "MetricSpec",
    "MetricTarget",
    "Network",
    "PodSecurityFinding",
    "PodSecurityLevel",
    "RenderOptions",
    "ResolvedRole",
    "Resources",
    "RestartPolicy",
    "Role",
    "RoleSpec",
    "Toleration",
    "TrainingJobSpec",
    "Volume",
    "as_dialect",
    "differences",
    "dump_manifests",
    "dump_spec",
    "dump_yaml",
    "import_manifest",
    "import_manifests",
    "job_name",
    "job_resource",
    "key_hash",
    "load_spec",
    "load_untrusted_spec",
    "loads_spec",
    "loads_spec_with_warnings",
    "max_spec_name_length",
    "operator_view",
    "parse_spec",
    "pod_security_findings",
    "pod_security_warnings",
    "render",
    "spec_hash",
    "spec_root",
    "spec_to_data",
    "validate",
]

if TYPE_CHECKING:
    from kubedl_prefect.spec.affinity import Affinity
    from kubedl_prefect.spec.hashing import spec_hash
    from kubedl_prefect.spec.io import (
        SPEC_ROOT_ENV,
        dump_manifests,
        dump_spec,
        dump_yaml,
        load_spec,
        load_untrusted_spec,
        loads_spec,
        loads_spec_with_warnings,
        spec_root,
        spec_to_data,
    )
    from kubedl_prefect.spec.kube_types import (
        ContainerPort,
        EmptyDir,
        EnvValue,
        HostPath,
        Resources,
        Toleration,
        Volume,
    )
    from kubedl_prefect.spec.metrics import MetricSpec, MetricTarget
    from kubedl_prefect.spec.model import (
        Checkpoint,
        ContainerSettings,
        Elastic,
        Gang,
        Network,
        ResolvedRole,
        RoleSpec,
        TrainingJobSpec,
    )
    from kubedl_prefect.spec.naming import (
        ATTEMPT_SUFFIX_MAX_LENGTH,
        MAX_ATTEMPT,
        job_name,
        key_hash,
        max_spec_name_length,
    )
    from kubedl_prefect.spec.pod_security import (
        PodSecurityFinding,
        PodSecurityLevel,
        pod_security_findings,
        pod_security_warnings,
    )
    from kubedl_prefect.spec.porting import ImportedSpec, import_manifest, import_manifests
    from kubedl_prefect.spec.reader import MAX_SPEC_BYTES
    from kubedl_prefect.spec.renderers import MAX_MANIFEST_BYTES, Manifest, RenderOptions, render
    from kubedl_prefect.spec.semantics import differences, operator_view
    from kubedl_prefect.spec.types import (
        CHECKPOINT_ENV,
        GPU_RESOURCE,
        CleanPodPolicy,
        Dialect,
        Framework,
        ImagePullPolicy,
        JobResource,
        RestartPolicy,
        Role,
        job_resource,
    )
    from kubedl_prefect.spec.validation import as_dialect, parse_spec, validate


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
