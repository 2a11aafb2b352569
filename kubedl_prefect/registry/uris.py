"""From registry URIs to a ``storageUri`` KServe can load. Pure.

KServe's storage initializer reads object stores and volumes (``s3://``, ``gs://``, ``pvc://``,
``file://``, ``http(s)://``, ...); it cannot read the MLflow registry. So a registered version is
resolved, in two steps:

1. the registry turns ``models:/name@alias`` or ``models:/name/version`` into the version's
   download URI (MLflow 3 keeps a logged model under
   ``<experiment artifact root>/models/m-<id>/artifacts``): see
   :meth:`~kubedl_prefect.registry.ModelRegistry.resolve`;
2. :func:`storage_uri` maps that URI to a location the cluster can read: ``mlflow-artifacts:/``
   (the server proxies its artifact store) to the server's configured artifact destination,
   known schemes passed through, anything else refused with an explanation.

A version registered from ``runs:/<run>/<path>`` is refused: that URI names a run's artifacts,
which MLflow 3 no longer resolves to the logged model, and registering the logged model
(``models:/m-<id>``) is the fix.

No URI here may carry credentials (``https://user:password@host``): a tracking or registry URI
is refused by :func:`refuse_user_info` (its password would show wherever the URI does), and so
is a ``storageUri``, which would be written into the InferenceService.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from kubedl_prefect.errors import (
    ModelSourceRefusedError,
    RegistryError,
    has_user_info,
    redact_url,
)

PASSED_SCHEMES: Final = frozenset(
    {"s3", "gs", "pvc", "file", "http", "https", "hdfs", "webhdfs", "oci", "hf"}
)
"""Schemes KServe's storage initializer reads, passed through as they are."""

CREDENTIALS_HINT: Final = (
    "remove user:password@ from the URI: this process authenticates with MLFLOW_TRACKING_USERNAME "
    "and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN (the MlflowRegistry block sets them "
    "from its username and password (kept secret) or token), and the pods with "
    "TrackingCredentials (a Kubernetes Secret)"
)
"""What to do instead of putting credentials into a tracking or registry URI."""

_AZURE_BLOB: Final = re.compile(r"^https://[^/]+\.blob\.core\.windows\.net/")
_NAME: Final = r"(?P<name>[^/@]+)"
_VERSION_URI: Final = re.compile(rf"^models:/{_NAME}/(?P<version>\d+)/?\Z")
_ALIAS_URI: Final = re.compile(rf"^models:/{_NAME}@(?P<alias>[^/\r\n]+)/?\Z")
_LOGGED_MODEL_URI: Final = re.compile(r"^models:/(?P<model_id>m-[0-9a-f]+)/?\Z")


@dataclass(frozen=True)
class ModelUri:
    """A parsed ``models:/`` URI: a registered model's version or alias, or a logged model.

    Attributes:
        name: The registered model (``None`` for a logged model).
        version: The version, for ``models:/name/3``.
        alias: The alias, for ``models:/name@champion``.
        model_id: The logged model, for ``models:/m-<id>``.
    """

    name: str | None = None
    version: str | None = None
    alias: str | None = None
    model_id: str | None = None

    def __str__(self) -> str:
        if self.model_id is not None:
            return f"models:/{self.model_id}"
        if self.alias is not None:
            return f"models:/{self.name}@{self.alias}"
        return f"models:/{self.name}/{self.version}"


def refuse_user_info(uri: str, what: str) -> None:
    """Refuse a tracking or registry URI that carries credentials.

    Args:
        uri: The URI.
        what: What it is, for the message (``tracking URI``).

    Raises:
        RegistryError: ``uri`` has user info; the message shows it without.

    Example:
        >>> try:
        ...     refuse_user_info("https://ci:pw@mlflow", "tracking URI")
        ... except RegistryError as error:
        ...     print(error.message)
        the tracking URI 'https://***@mlflow' holds user info (user:password@ before the host)
    """
    if has_user_info(uri):
        raise RegistryError(
            f"the {what} {redact_url(uri)!r} holds user info (user:password@ before the host)",
            hint=CREDENTIALS_HINT,
        )


def parse_model_uri(uri: str) -> ModelUri:
    """Parse ``models:/name/version``, ``models:/name@alias`` or ``models:/m-<id>``.

    Raises:
        ModelSourceRefusedError: A ``runs:/`` URI (with why and what to do instead).
        RegistryError: Any other URI.

    Example:
        >>> parse_model_uri("models:/fraud@champion").alias
        'champion'
        >>> parse_model_uri("models:/fraud/3").version
        '3'
    """
    if uri.startswith("runs:/"):
        raise runs_uri_refused(uri)
    if match := _LOGGED_MODEL_URI.match(uri):
        return ModelUri(model_id=match["model_id"])
    if match := _VERSION_URI.match(uri):
        return ModelUri(name=match["name"], version=match["version"])
    if match := _ALIAS_URI.match(uri):
        return ModelUri(name=match["name"], alias=match["alias"])
    raise RegistryError(
        f"{uri!r} is not a registry URI kubedl-prefect resolves",
        hint="use models:/<name>/<version> or models:/<name>@<alias>",
    )


def runs_uri_refused(uri: str) -> ModelSourceRefusedError:
    """The refusal of a ``runs:/`` location, with the reason and the fix."""
    return ModelSourceRefusedError(
        f"{uri!r} is a runs:/ URI: it names artifacts of a run, not a logged model, and MLflow 3 "
        "keeps it unresolved in the registry, so there is no location to serve from",
        uri=uri,
        hint="register the logged model instead: mlflow.<flavor>.log_model(..., name=...) "
        "returns model_info.model_uri (models:/m-<id>); pass that to register_model",
    )


def storage_uri(
    location: str,
    *,
    artifact_destination: str | None = None,
    rewrites: Mapping[str, str] | None = None,
) -> str:
    """The ``storageUri`` KServe loads ``location`` (a version's download URI) from.

    Args:
        location: Where the registry says the model's files are.
        artifact_destination: The tracking server's ``--artifacts-destination`` (what
            ``mlflow-artifacts:/`` stands for), e.g. ``s3://bucket/mlartifacts``.
        rewrites: Prefixes to replace once resolved, longest first: where the server's store is
            mounted for the cluster, e.g. ``{"file:///mnt/mlflow": "pvc://mlflow-store"}``.

    Raises:
        ModelSourceRefusedError: A ``runs:/`` or unresolved ``models:/`` location, an
            ``mlflow-artifacts:/`` one without ``artifact_destination``, an unknown scheme, or
            a result with user info.

    Example:
        >>> storage_uri("mlflow-artifacts:/3/models/m-ab/artifacts",
        ...             artifact_destination="s3://ml/artifacts/")
        's3://ml/artifacts/3/models/m-ab/artifacts'
        >>> storage_uri("s3://ml/3/models/m-ab/artifacts/")
        's3://ml/3/models/m-ab/artifacts'
        >>> storage_uri("file:///mnt/mlflow/3/models/m-ab/artifacts",
        ...             rewrites={"file:///mnt/mlflow": "pvc://mlflow-store"})
        'pvc://mlflow-store/3/models/m-ab/artifacts'
    """
    resolved = _resolve(location, artifact_destination)
    for prefix in sorted(rewrites or {}, key=len, reverse=True):
        stem = prefix.rstrip("/")
        if resolved == stem or resolved.startswith(f"{stem}/"):
            resolved = (rewrites or {})[prefix].rstrip("/") + resolved[len(stem) :]
            break
    if has_user_info(resolved):
        public = redact_url(resolved)
        raise ModelSourceRefusedError(
            f"the storage location {public!r} holds user info (user:password@ before the host), "
            "which would be written into the InferenceService for anyone who reads it",
            uri=public,
            hint="give KServe the storage credentials through the Secrets of the service's "
            "ServiceAccount (KServeServing.service_account), not in the URI",
        )
    return resolved


def _resolve(location: str, artifact_destination: str | None) -> str:
    if location.startswith("runs:/"):
        raise runs_uri_refused(location)
    if location.startswith("models:/"):
        raise ModelSourceRefusedError(
            f"{location!r} is a registry URI; KServe cannot read the MLflow registry",
            uri=location,
            hint="resolve it first (ModelRegistry.resolve) to the version's artifact location",
        )
    if location.startswith("/"):
        return f"file://{location.rstrip('/')}"
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme == "mlflow-artifacts":
        if not artifact_destination:
            raise ModelSourceRefusedError(
                f"{location!r} is served by the tracking server's artifact proxy, which KServe "
                "cannot read, and no artifact destination is configured",
                uri=location,
                hint="pass artifact_destination= the server's --artifacts-destination "
                "(e.g. s3://bucket/mlartifacts), or run the server with --no-serve-artifacts",
            )
        path = parts.path.lstrip("/")
        return f"{artifact_destination.rstrip('/')}/{path}".rstrip("/")
    if scheme in PASSED_SCHEMES or _AZURE_BLOB.match(location):
        return location.rstrip("/")
    raise ModelSourceRefusedError(
        f"{location!r} has a scheme ({scheme or 'none'}) that KServe's storage initializer "
        "does not read",
        uri=location,
        hint="store the experiment's artifacts on s3://, gs://, a PVC or another location "
        f"KServe supports ({', '.join(sorted(PASSED_SCHEMES))})",
    )
