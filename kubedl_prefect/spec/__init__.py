"""Training-job specs: the framework-neutral model, its validation, and rendering.

Pure: no cluster access, no I/O beyond reading and writing YAML text.

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

from kubedl_prefect.spec.hashing import spec_hash
from kubedl_prefect.spec.io import (
    dump_manifests,
    dump_spec,
    dump_yaml,
    load_spec,
    loads_spec,
    spec_to_data,
)
from kubedl_prefect.spec.kube_types import (
    Affinity,
    ContainerPort,
    EmptyDir,
    EnvValue,
    HostPath,
    MetricSpec,
    MetricTarget,
    Resources,
    Toleration,
    Volume,
)
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

__all__ = [
    "ATTEMPT_SUFFIX_MAX_LENGTH",
    "CHECKPOINT_ENV",
    "GPU_RESOURCE",
    "MAX_ATTEMPT",
    "MAX_MANIFEST_BYTES",
    "MAX_SPEC_BYTES",
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
    "loads_spec",
    "max_spec_name_length",
    "operator_view",
    "parse_spec",
    "render",
    "spec_hash",
    "spec_to_data",
    "validate",
]
