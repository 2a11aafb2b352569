"""Kubeconfig files for the test bed: certificates embedded, so a file can be copied anywhere."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render_kubeconfig(
    *,
    cluster: str,
    server: str,
    ca_file: Path,
    user: str,
    client_cert: tuple[Path, Path] | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A kubeconfig document with one cluster, one user and one current context.

    Args:
        cluster: Name of the cluster (and of the context).
        server: URL of the API server.
        ca_file: CA certificate the server's certificate is checked against.
        user: Name of the user entry.
        client_cert: Client certificate and key files (embedded).
        token: Bearer token (service accounts).
        namespace: Default namespace of the context.
    """
    credentials: dict[str, str] = {}
    if client_cert is not None:
        credentials["client-certificate-data"] = _b64(client_cert[0])
        credentials["client-key-data"] = _b64(client_cert[1])
    if token is not None:
        credentials["token"] = token
    context: dict[str, str] = {"cluster": cluster, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_file)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": cluster, "context": context}],
        "current-context": cluster,
        "preferences": {},
    }


def write_kubeconfig(path: Path, document: dict[str, Any]) -> Path:
    """Write ``document`` to ``path`` readable by the owner only; return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(document, handle, sort_keys=False)
    os.replace(partial, path)
    return path
