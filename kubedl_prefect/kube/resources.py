"""Kinds of Kubernetes objects we talk to, and their REST paths.

Objects travel as plain JSON dictionaries (``KubeObject``): custom resources of two operators in
several versions have no generated classes worth their weight, and the spec layer already renders
exact manifests. What needs a type is the *kind*: its group, version and plural fix every URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

KubeObject = dict[str, Any]
"""A Kubernetes object as the API serves it (``apiVersion``, ``kind``, ``metadata``, ...)."""


@dataclass(frozen=True)
class ResourceKind:
    """A kind of Kubernetes object: where it lives in the API.

    Args:
        group: API group (``""`` for the core group).
        version: API version within the group.
        kind: The ``kind`` field of its objects.
        plural: The resource name used in URLs.
        namespaced: Whether its objects live in namespaces.
    """

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` field of its objects (``v1``, ``training.kubedl.io/v1alpha1``)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """REST path of the collection, or of one object (and its subresource)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            prefix += f"/namespaces/{quote(namespace, safe='')}"
        path = f"{prefix}/{self.plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
            if subresource:
                path += f"/{subresource}"
        return path

    @classmethod
    def of(cls, manifest: KubeObject) -> ResourceKind:
        """The kind of a manifest, for the kinds whose plural is the lowercase kind plus ``s``.

        That holds for every training kind (``PyTorchJob`` → ``pytorchjobs``), PodGroups and
        InferenceServices; pass an explicit kind for anything irregular.
        """
        api_version: str = manifest["apiVersion"]
        kind: str = manifest["kind"]
        group, _, version = api_version.rpartition("/")
        return cls(group=group, version=version, kind=kind, plural=f"{kind.lower()}s")

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NAMESPACES = ResourceKind("", "v1", "Namespace", "namespaces", namespaced=False)
PODS = ResourceKind("", "v1", "Pod", "pods")
EVENTS = ResourceKind("", "v1", "Event", "events")
CONFIG_MAPS = ResourceKind("", "v1", "ConfigMap", "configmaps")
SERVICES = ResourceKind("", "v1", "Service", "services")
PERSISTENT_VOLUME_CLAIMS = ResourceKind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
VOLCANO_PODGROUPS = ResourceKind("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups")
NODES = ResourceKind("", "v1", "Node", "nodes", namespaced=False)
SERVICE_ACCOUNTS = ResourceKind("", "v1", "ServiceAccount", "serviceaccounts")
SECRETS = ResourceKind("", "v1", "Secret", "secrets")
LEASES = ResourceKind("coordination.k8s.io", "v1", "Lease", "leases")
ROLES = ResourceKind("rbac.authorization.k8s.io", "v1", "Role", "roles")
ROLE_BINDINGS = ResourceKind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings")
CLUSTER_ROLES = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False
)
CLUSTER_ROLE_BINDINGS = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", namespaced=False
)
CUSTOM_RESOURCE_DEFINITIONS = ResourceKind(
    "apiextensions.k8s.io",
    "v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    namespaced=False,
)
VOLCANO_QUEUES = ResourceKind(
    "scheduling.volcano.sh", "v1beta1", "Queue", "queues", namespaced=False
)
INFERENCE_SERVICES = ResourceKind(
    "serving.kserve.io", "v1beta1", "InferenceService", "inferenceservices"
)
MUTATING_WEBHOOK_CONFIGURATIONS = ResourceKind(
    "admissionregistration.k8s.io",
    "v1",
    "MutatingWebhookConfiguration",
    "mutatingwebhookconfigurations",
    namespaced=False,
)
VALIDATING_WEBHOOK_CONFIGURATIONS = ResourceKind(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)
KUEUE_WORKLOADS = ResourceKind("kueue.x-k8s.io", "v1beta2", "Workload", "workloads")
"""Kueue's record of one job's admission (v1beta2, Kueue's storage version since v0.15)."""
KUEUE_LOCAL_QUEUES = ResourceKind("kueue.x-k8s.io", "v1beta2", "LocalQueue", "localqueues")
KUEUE_CLUSTER_QUEUES = ResourceKind(
    "kueue.x-k8s.io", "v1beta2", "ClusterQueue", "clusterqueues", namespaced=False
)
