"""Credentials for a Kubernetes API server, and :func:`connect`, which makes a client from them.

Four kinds, one type (:data:`Credentials`):

* :class:`KubeconfigFile`: a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` by default);
* :class:`KubeconfigContent`: the YAML text of a kubeconfig, e.g. from a secret store;
* :class:`InCluster`: the ServiceAccount of the pod this process runs in;
* :class:`BearerToken`: a server URL and a token (a ServiceAccount token, an OIDC ID token).

Each is a frozen dataclass whose secrets never appear in its ``repr``, in our exceptions or in
logs. :meth:`session_key` names the cluster and identity without revealing anything, so that a
process can keep one client (one connection pool, one set of shared watches) per identity; a
client made by :func:`connect` carries it as :attr:`~kubedl_prefect.kube.client.KubeClient
.cluster_id`, and the server's URL as :attr:`~kubedl_prefect.kube.client.KubeClient.server`.

Example:
    >>> creds = BearerToken(server="https://10.0.0.1:6443", token="s3cr3t", ca_file="/ca.crt")
    >>> "s3cr3t" in repr(creds) or "s3cr3t" in creds.session_key()
    False
    >>> async def pods() -> None:  # doctest: +SKIP
    ...     async with await connect(creds) as kube:
    ...         print(len((await kube.list(PODS, "default")).items))
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import os
import re
import ssl
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException

from kubedl_prefect.errors import KubeConnectionError, SpecError
from kubedl_prefect.kube.client import KubeClient, public_url
from kubedl_prefect.spec.reader import Limits, parse_document, plain_numbers

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where Kubernetes mounts a pod's ServiceAccount token (``token``) and CA (``ca.crt``)."""

DEFAULT_KUBECONFIG = "~/.kube/config"
"""The kubeconfig read when neither a path nor ``$KUBECONFIG`` is given."""

MAX_KUBECONFIG_BYTES: Final = 1024 * 1024
"""The largest kubeconfig content accepted (1 MiB: a few hundred clusters with their CAs)."""

_KUBECONFIG_LIMITS: Final = Limits(MAX_KUBECONFIG_BYTES, what="kubeconfig")

_UNTRUSTED_KEYS: Final = {
    "user": {
        "exec": "runs a command on this machine",
        "auth-provider": "runs an authentication plugin on this machine",
        "tokenFile": "sends a file of this machine as the token",
        "client-certificate": "reads a file of this machine",
        "client-key": "reads a file of this machine",
    },
    "cluster": {"certificate-authority": "reads a file of this machine"},
}
"""What kubeconfig content may hold only when trusted, by entry kind, with what it does."""

TRUST_HINT: Final = (
    "embed the data instead (`kubectl config view --raw --minify --flatten` embeds certificates "
    "and keys) and use a token or a client certificate; or, if whoever may edit the content may "
    "also run commands as this worker, set trust_kubeconfig on the KubernetesCluster block "
    "(KubeconfigContent(..., trusted=True))"
)
"""What to do about kubeconfig content refused for running commands or reading files."""

_DIGEST_CHARS = 32


def _digest(*parts: str) -> str:
    """A short, one-way digest of ``parts`` (length-prefixed, so parts cannot run together)."""
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode()
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)
    return hasher.hexdigest()[:_DIGEST_CHARS]


@dataclass(frozen=True)
class KubeconfigFile:
    """A kubeconfig file.

    Args:
        path: The file (several joined with ``os.pathsep``, as in ``$KUBECONFIG``); ``None``
            reads ``$KUBECONFIG``, or ``~/.kube/config`` when that is unset.
        context: The context to use; ``None`` uses the file's ``current-context``.
    """

    path: str | None = None
    context: str | None = None

    def paths(self) -> tuple[str, ...]:
        """The absolute paths of the files this names, in order (``~`` expanded)."""
        spec = self.path if self.path is not None else os.environ.get("KUBECONFIG") or ""
        parts = [p for p in spec.split(os.pathsep) if p] or [DEFAULT_KUBECONFIG]
        return tuple(os.path.abspath(os.path.expanduser(p)) for p in parts)

    def session_key(self) -> str:
        """``kubeconfig-file:<absolute paths>#<context>`` (``#`` alone for the current one)."""
        return f"kubeconfig-file:{os.pathsep.join(self.paths())}#{self.context or ''}"


@dataclass(frozen=True)
class KubeconfigContent:
    """The YAML text of a kubeconfig (a secret: it usually holds a token or a client key).

    Content comes from elsewhere (a block, a secret store), so it is read as data: at most
    :data:`MAX_KUBECONFIG_BYTES`, with the bounded YAML reader (aliases, depth), in a worker
    thread. Unless ``trusted``, it may hold only embedded credentials (``token``,
    ``client-certificate-data``/``client-key-data``, ``username``/``password``,
    ``certificate-authority-data``): an ``exec`` or ``auth-provider`` user (a command run on
    this machine) and file references (``tokenFile``, ``client-certificate``, ``client-key``,
    ``certificate-authority``: files of this machine, sent to the server the content names)
    are refused.

    Args:
        content: The kubeconfig document (YAML or JSON).
        context: The context to use; ``None`` uses the document's ``current-context``.
        trusted: Let the content run commands and read files as a kubeconfig file of this
            machine does. Whoever wrote the content can then run commands as this process.
    """

    content: str = field(repr=False)
    context: str | None = None
    trusted: bool = False

    def session_key(self) -> str:
        """``kubeconfig-content:<digest of the content>#<context>`` (``-trusted`` when it is)."""
        kind = "kubeconfig-content-trusted" if self.trusted else "kubeconfig-content"
        return f"{kind}:{_digest(self.content)}#{self.context or ''}"

    def __repr__(self) -> str:
        size = len(self.content)
        return (
            f"KubeconfigContent(content=<{size} characters>, context={self.context!r}, "
            f"trusted={self.trusted})"
        )


@dataclass(frozen=True)
class InCluster:
    """The ServiceAccount of the pod this process runs in (its mounted token and CA).

    The token is read again as the kubelet rotates it.
    """

    def session_key(self) -> str:
        """``in-cluster``: a process runs in one pod, as one ServiceAccount."""
        return "in-cluster"


@dataclass(frozen=True)
class BearerToken:
    """An API server's URL and a bearer token.

    Args:
        server: The API server's URL (``https://host:port``). ``http://`` is refused (the
            token would travel in clear text) except to a loopback address (``kubectl proxy``).
        token: The bearer token (a secret).
        ca_cert: The CA certificate(s) to check the server against, as PEM text.
        ca_file: The same, as a file; give at most one of ``ca_cert`` and ``ca_file``. With
            neither, the system's trusted CAs are used.
        insecure_skip_tls_verify: Do not check the server's certificate (test clusters only;
            not with a CA). Logged as a warning, once per server and process.
    """

    server: str
    token: str = field(repr=False)
    ca_cert: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    insecure_skip_tls_verify: bool = False

    def session_key(self) -> str:
        """``bearer-token:<server>#<digest of the token and TLS settings>``."""
        tls = (self.ca_cert or "", self.ca_file or "", str(self.insecure_skip_tls_verify))
        return f"bearer-token:{public_url(self.server)}#{_digest(self.token, *tls)}"

    def __repr__(self) -> str:
        ca_cert = "<PEM>" if self.ca_cert is not None else None
        return (
            f"BearerToken(server={self.server!r}, token=<hidden>, ca_cert={ca_cert}, "
            f"ca_file={self.ca_file!r}, insecure_skip_tls_verify={self.insecure_skip_tls_verify})"
        )


Credentials = KubeconfigFile | KubeconfigContent | InCluster | BearerToken
"""Any kind of credentials :func:`connect` accepts."""


async def connect(credentials: Credentials) -> KubeClient:
    """A client for the API server and identity of ``credentials``.

    The client's ``cluster_id`` is ``credentials.session_key()``; close it when done
    (``async with await connect(...) as kube``).

    Args:
        credentials: Where the server is and who we are.

    Raises:
        KubeConnectionError: The credentials are unusable (a missing or invalid kubeconfig, an
            unknown context, not running in a pod, a malformed URL or CA); not retryable, with a
            hint. Nothing is sent to the server yet, so a wrong token is only refused (as
            :class:`~kubedl_prefect.errors.UnauthenticatedError`) by the first request.
    """
    if isinstance(credentials, KubeconfigFile):
        configuration = await _kubeconfig_file(credentials)
    elif isinstance(credentials, KubeconfigContent):
        configuration = await _kubeconfig_content(credentials)
    elif isinstance(credentials, InCluster):
        configuration = _in_cluster()
    elif isinstance(credentials, BearerToken):
        return _bearer_token_client(credentials)
    else:
        raise KubeConnectionError(
            f"not Kubernetes credentials: {type(credentials).__name__}",
            hint="pass KubeconfigFile, KubeconfigContent, InCluster or BearerToken",
            retryable=False,
        )
    return _client(configuration, credentials.session_key(), what=_describe(credentials))


def connect_incluster() -> KubeClient:
    """``connect(InCluster())`` without awaiting (loading in-cluster credentials does no I/O).

    Raises:
        KubeConnectionError: Not running in a pod with a ServiceAccount.
    """
    return _client(_in_cluster(), InCluster().session_key(), what="in-cluster credentials")


def _describe(credentials: Credentials) -> str:
    if isinstance(credentials, KubeconfigFile):
        return f"kubeconfig {os.pathsep.join(credentials.paths())}"
    if isinstance(credentials, KubeconfigContent):
        return "kubeconfig content"
    if isinstance(credentials, InCluster):
        return "in-cluster credentials"
    return f"token credentials for {public_url(credentials.server)}"


def _unusable(what: str, problem: str, hint: str) -> KubeConnectionError:
    return KubeConnectionError(f"cannot use {what}: {problem}", hint=hint, retryable=False)


def _client(configuration: k8s_client.Configuration, session_key: str, *, what: str) -> KubeClient:
    try:
        return KubeClient._from_configuration(configuration, cluster_id=session_key)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise _unusable(
            what,
            f"its TLS material cannot be loaded ({type(exc).__name__}: {_first_line(exc)})",
            "check the CA certificate and the client certificate and key",
        ) from None


_LOAD_ERRORS = (ConfigException, OSError, ValueError, KeyError, TypeError, AttributeError)


_FILE_HINT = (
    "pass the path of a kubeconfig or set KUBECONFIG; or use KubeconfigContent, InCluster or "
    "BearerToken credentials"
)


def _read_kubeconfigs(credentials: KubeconfigFile) -> dict[str, dict[str, Any]]:
    """The documents of the files that exist, by path (small files: read without a thread)."""
    documents: dict[str, dict[str, Any]] = {}
    for path in credentials.paths():
        if not os.path.isfile(path):
            continue
        try:
            document = yaml.safe_load(Path(path).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise _unusable(f"kubeconfig {path}", _yaml_problem(exc), _FILE_HINT) from None
        if not isinstance(document, dict):
            raise _unusable(f"kubeconfig {path}", "it is not a kubeconfig document", _FILE_HINT)
        documents[path] = document
    if not documents:
        raise _unusable(_describe(credentials), "no such file", _FILE_HINT)
    return documents


async def _kubeconfig_file(credentials: KubeconfigFile) -> k8s_client.Configuration:
    documents = _read_kubeconfigs(credentials)
    configuration = k8s_client.Configuration()
    try:
        await k8s_config.load_kube_config(
            config_file=os.pathsep.join(documents),
            context=credentials.context,
            client_configuration=configuration,
            persist_config=False,
        )
    except _LOAD_ERRORS as exc:
        contexts = {
            c.get("name")
            for d in documents.values()
            for c in (d.get("contexts") or [])
            if isinstance(c, dict)
        }
        raise _unusable(
            _describe(credentials),
            _load_problem(exc, _secrets(documents.values())),
            _context_hint(contexts, _FILE_HINT),
        ) from None
    return configuration


_CONTENT_HINT: Final = "pass the YAML text of a kubeconfig (apiVersion: v1, kind: Config)"


def _read_kubeconfig_content(content: str) -> dict[str, Any]:
    """The document of kubeconfig content, read with the bounded reader (run it in a thread).

    Raises:
        KubeConnectionError: Too large, not YAML, over the reader's limits, not a kubeconfig.
    """
    what = "kubeconfig content"
    try:
        _, document = parse_document(content, source=what, limits=_KUBECONFIG_LIMITS)
    except SpecError as exc:
        issue = exc.issues[0]
        if issue.path == "(file)":  # too large
            raise _unusable(
                what, issue.problem, "keep only the context in use (`kubectl config view --minify`)"
            ) from None
        # The reader may quote a scalar it found ambiguous: a password, maybe. Hide quoted text.
        problem = _QUOTED.sub("<...>", issue.problem)
        raise _unusable(what, f"invalid YAML: {problem}", _QUOTED.sub("<...>", issue.fix)) from None
    if not isinstance(document, dict) or not document.get("clusters"):
        raise _unusable(what, "it is not a kubeconfig document (no clusters)", _CONTENT_HINT)
    data = plain_numbers(document)
    assert isinstance(data, dict)
    return data


_QUOTED: Final = re.compile(r"'[^']*'")


def untrusted_entries(document: dict[str, Any]) -> list[str]:
    """What in a kubeconfig document runs commands or reads files of this machine. Pure.

    Returns:
        One line per key found, naming the entry: ``user 'eks' has exec (runs a command...)``.

    Example:
        >>> untrusted_entries({"users": [{"name": "eks", "user": {"exec": {"command": "aws"}}}]})
        ["user 'eks' has exec (runs a command on this machine)"]
    """
    found: list[str] = []
    for kind, keys in _UNTRUSTED_KEYS.items():
        entries = document.get(f"{kind}s")
        for index, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, dict) or not isinstance(entry.get(kind), dict):
                continue
            name = entry.get("name")
            label = repr(str(name)[:80]) if name is not None else f"#{index + 1}"
            found += [
                f"{kind} {label} has {key} ({does})"
                for key, does in keys.items()
                if key in entry[kind]
            ]
    return found


async def _kubeconfig_content(credentials: KubeconfigContent) -> k8s_client.Configuration:
    what = "kubeconfig content"
    hint = _CONTENT_HINT
    # Reading is bounded, but a large document still takes a while: not on the event loop.
    document = await asyncio.to_thread(_read_kubeconfig_content, credentials.content)
    refused = [] if credentials.trusted else untrusted_entries(document)
    if refused:
        raise _unusable(
            what,
            "it would run commands or read files of this machine, which content may do only "
            f"when trusted: {'; '.join(refused)}",
            TRUST_HINT,
        )
    configuration = k8s_client.Configuration()
    try:
        await k8s_config.load_kube_config_from_dict(
            document, context=credentials.context, client_configuration=configuration
        )
    except _LOAD_ERRORS as exc:
        contexts = {c.get("name") for c in document.get("contexts") or [] if isinstance(c, dict)}
        raise _unusable(
            what,
            _load_problem(exc, _secrets([document, credentials.content])),
            _context_hint(contexts, hint),
        ) from None
    return configuration


def _in_cluster() -> k8s_client.Configuration:
    configuration = k8s_client.Configuration()
    directory = Path(SERVICE_ACCOUNT_DIR)
    try:
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration,
            token_filename=str(directory / "token"),
            cert_filename=str(directory / "ca.crt"),
        )
    except (ConfigException, OSError) as exc:
        raise _unusable(
            "in-cluster credentials",
            f"not running in a Kubernetes pod with a ServiceAccount ({_first_line(exc)})",
            "outside a cluster, use KubeconfigFile, KubeconfigContent or BearerToken credentials",
        ) from None
    return configuration


def _bearer_token_client(credentials: BearerToken) -> KubeClient:
    what = _describe(credentials)
    server = credentials.server.strip().rstrip("/")
    parts = urlsplit(server)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise _unusable(
            what, "the server is not an http(s) URL", "pass the API server's URL: https://host:port"
        )
    if parts.username is not None or parts.password is not None:
        raise _unusable(
            what, "the server URL holds user info", "pass the credentials as the token only"
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise _unusable(
            what,
            "the server is an http:// URL, and the token would be sent in clear text",
            "pass the API server's https:// URL (http:// is accepted only for a loopback "
            "address, such as kubectl proxy's http://127.0.0.1:8001)",
        )
    if not credentials.token.strip():
        raise _unusable(what, "the token is empty", "pass a bearer token")
    if credentials.ca_cert is not None and credentials.ca_file is not None:
        raise _unusable(what, "both ca_cert and ca_file are given", "pass one of them")
    if credentials.insecure_skip_tls_verify and (
        credentials.ca_cert is not None or credentials.ca_file is not None
    ):
        raise _unusable(
            what,
            "both insecure_skip_tls_verify and a CA are given",
            "pass the CA to check the server against, or insecure_skip_tls_verify, not both",
        )
    if credentials.ca_file is not None and not os.path.isfile(credentials.ca_file):
        raise _unusable(
            what, f"CA file {credentials.ca_file} does not exist", "pass the path of a PEM file"
        )
    if credentials.ca_cert is not None:
        try:
            ssl.create_default_context(cadata=credentials.ca_cert)
        except (ssl.SSLError, ValueError) as exc:
            raise _unusable(
                what,
                f"ca_cert is not a PEM certificate ({_first_line(exc)})",
                "pass the CA certificate as PEM text (-----BEGIN CERTIFICATE-----...)",
            ) from None
    if credentials.insecure_skip_tls_verify and parts.scheme == "https":
        _warn_insecure_once(public_url(server))
    configuration = k8s_client.Configuration(host=server)
    configuration.api_key = {"BearerToken": f"Bearer {credentials.token.strip()}"}
    configuration.verify_ssl = not credentials.insecure_skip_tls_verify
    with _ca_file(credentials) as ca_file:
        configuration.ssl_ca_cert = ca_file
        # The TLS context is built (and the CA file read) when the client is made.
        client = _client(configuration, credentials.session_key(), what=what)
    configuration.ssl_ca_cert = credentials.ca_file
    return client


def _is_loopback(host: str | None) -> bool:
    """Whether ``host`` names this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_warned_insecure: set[str] = set()
"""The servers whose skipped TLS verification was logged already (once per process each)."""


def _warn_insecure_once(server: str) -> None:
    if server in _warned_insecure:
        return
    _warned_insecure.add(server)
    logger.warning(
        "TLS verification is off for %s (insecure_skip_tls_verify): the bearer token goes to "
        "whoever answers at that address. Use it for test clusters only; pass the server's CA "
        "(ca_cert or ca_file) otherwise.",
        server,
    )


@contextmanager
def _ca_file(credentials: BearerToken) -> Iterator[str | None]:
    """The CA file to build the TLS context from: ``ca_file``, or ``ca_cert`` written out."""
    if credentials.ca_cert is None:
        yield credentials.ca_file
        return
    with tempfile.TemporaryDirectory(prefix="kubedl-prefect-ca-") as directory:
        path = Path(directory) / "ca.crt"
        path.write_text(credentials.ca_cert)
        yield str(path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _yaml_problem(exc: BaseException) -> str:
    """What is wrong with a YAML text, without quoting it (it may hold secrets)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if isinstance(exc, yaml.YAMLError):
        return "invalid YAML"
    return _first_line(exc)


def _secrets(sources: Iterable[Any]) -> set[str]:
    """Strings of the ``users`` entries of kubeconfig documents (tokens, keys, passwords)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and len(value) >= 4:
            found.add(value)

    for source in sources:
        if isinstance(source, str):
            found.add(source)
        elif isinstance(source, dict):
            walk([user.get("user") for user in source.get("users") or [] if isinstance(user, dict)])
    return found


def _load_problem(exc: BaseException, secrets: set[str]) -> str:
    """The loader's complaint, with any secret it might quote masked."""
    text = f"{type(exc).__name__}: {_first_line(exc)}"
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "<hidden>")
    return text


def _context_hint(contexts: set[Any], hint: str) -> str:
    names = sorted(str(c) for c in contexts if c)
    if names:
        return f"{hint}; its contexts are: {', '.join(names)}"
    return hint
