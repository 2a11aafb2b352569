"""RBAC objects the test bed writes for the operators it runs (identities, upstream roles).

Example:
    >>> cluster_role_binding("trainer", "trainer", "kubeflow-trainer")["subjects"][0]["name"]
    'kubeflow-trainer'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubedl_prefect.errors import TestbedError


def upstream_cluster_role(path: Path, name: str) -> dict[str, Any]:
    """The one ClusterRole of an upstream manifest file, under ``name`` (its rules as they are)."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    roles = [d for d in documents if d.get("kind") == "ClusterRole"]
    if len(roles) != 1:
        raise TestbedError(f"expected one ClusterRole in {path}, found {len(roles)}")
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": roles[0]["rules"],
    }


def cluster_role_binding(name: str, role: str, user: str) -> dict[str, Any]:
    """A ClusterRoleBinding of ``role`` to the test bed identity (a client-certificate user)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
