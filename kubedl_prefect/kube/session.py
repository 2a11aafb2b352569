"""One Kubernetes session per cluster identity, shared by every backend of the process.

A session is one :class:`~kubedl_prefect.kube.client.KubeClient` (one connection pool) and the
shared watches (:class:`~kubedl_prefect.kube.watch.WatchHub`) made with it. Backends are light
handles: each :meth:`SessionPool.acquire` for the same credentials (same
:meth:`~kubedl_prefect.kube.credentials.KubeconfigFile.session_key`) returns the same session and
counts one more user; :meth:`SessionPool.release` counts one less, and the last release stops the
watches and closes the client. So closing one backend never breaks another backend's wait, and
fifty Prefect tasks that each build a backend from the same block still share one watch per kind
and namespace.

Sessions live on the :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop: call the pool only
from coroutines running there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import Credentials, InCluster, KubeconfigFile, connect
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.watch import Informer, WatchHub, WatchSettings

_SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def default_credentials() -> Credentials:
    """The credentials a process has without being told: a kubeconfig, else its pod's account.

    ``$KUBECONFIG`` or ``~/.kube/config`` when either exists (as ``kubectl`` does), otherwise the
    in-cluster ServiceAccount when running in a pod, otherwise the default kubeconfig (whose
    absence then fails with a hint when the session is opened).
    """
    if os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().exists():
        return KubeconfigFile()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and _SERVICE_ACCOUNT_TOKEN.exists():
        return InCluster()
    return KubeconfigFile()


def resolve_credentials(
    owner: str,
    credentials: Credentials | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> Credentials:
    """The credentials a handle was given: ``credentials``, or a kubeconfig, or the default.

    Args:
        owner: Who asks (``KubernetesBackend``), for the error.
        credentials: Explicit credentials.
        kubeconfig: Shorthand for ``KubeconfigFile(kubeconfig, context)``.
        context: The kubeconfig context to use.

    Raises:
        KubeDLPrefectError: Both ``credentials`` and ``kubeconfig``/``context`` were given.
    """
    if credentials is not None and (kubeconfig is not None or context is not None):
        raise KubeDLPrefectError(
            f"{owner} got both credentials and kubeconfig/context",
            hint="pass credentials=KubeconfigFile(path, context) alone",
        )
    if credentials is not None:
        return credentials
    if kubeconfig is not None or context is not None:
        return KubeconfigFile(kubeconfig, context)
    return default_credentials()


@dataclass(eq=False)
class KubeSession:
    """A client and its shared watches for one cluster identity.

    Attributes:
        key: The credentials' session key (no secret in it).
        client: The one client of this identity.
        hub: The shared informers made with that client.
        users: How many holders have acquired it and not released it yet.
    """

    key: str
    client: KubeClient
    hub: WatchHub
    users: int = 0
    closed: bool = field(default=False)

    @property
    def server(self) -> str:
        """The API server's URL: the cluster identity recorded in job references."""
        return self.client.server

    async def _close(self) -> None:
        self.closed = True
        await self.hub.close()
        await self.client.close()


class SessionPool:
    """The process's sessions, one per cluster identity, reference-counted.

    Args:
        settings: Watch timing for every session's hub (tests shorten it).
    """

    def __init__(self, settings: WatchSettings | None = None):
        self.settings = settings
        self._sessions: dict[str, KubeSession] = {}
        self._opening: dict[str, asyncio.Future[KubeSession]] = {}

    async def acquire(self, credentials: Credentials) -> KubeSession:
        """The session for these credentials, opened on first use; counts one more user.

        Raises:
            KubeConnectionError: The credentials could not be loaded.
        """
        key = credentials.session_key()
        session = self._sessions.get(key)
        if session is None:
            opening = self._opening.get(key)
            if opening is None:
                # Two backends opening the same identity at once must end up with one client.
                opening = asyncio.get_running_loop().create_future()
                self._opening[key] = opening
                try:
                    client = await connect(credentials)
                except BaseException as exc:
                    opening.set_exception(exc)
                    opening.exception()  # retrieved: no "never retrieved" warning
                    raise
                finally:
                    self._opening.pop(key, None)
                session = KubeSession(key=key, client=client, hub=WatchHub(self.settings))
                self._sessions[key] = session
                opening.set_result(session)
            else:
                session = await asyncio.shield(opening)
        session.users += 1
        return session

    async def release(self, session: KubeSession) -> None:
        """Count one user less; the last one stops the session's watches and closes its client."""
        if session.closed:
            return
        session.users -= 1
        if session.users <= 0 and self._sessions.get(session.key) is session:
            del self._sessions[session.key]
            await session._close()

    def sessions(self) -> list[KubeSession]:
        """The open sessions."""
        return list(self._sessions.values())

    def informers(self) -> list[Informer]:
        """Every running informer of every session."""
        return [
            informer for session in self._sessions.values() for informer in session.hub.informers()
        ]

    async def close(self) -> None:
        """Close every session, whatever its users (end of process, tests)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session._close()


_POOL: SessionPool | None = None


def session_pool() -> SessionPool:
    """The process's one :class:`SessionPool` (use it on the runtime loop)."""
    global _POOL
    if _POOL is None:
        _POOL = SessionPool()
    return _POOL


class SessionHandle:
    """One holder's share of the session of a cluster identity: acquired on first use, released.

    The one owner of session handles for the backends and deployers built on a cluster identity:
    each of them holds one handle. Its methods hop to the
    :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop, so they may be awaited from any loop.

    Args:
        credentials: How to reach the cluster.
        pool: The session pool to share (the process's one by default).
        before_release: Awaited on the runtime loop before the session is released (a holder's
            writes still in flight).
    """

    def __init__(
        self,
        credentials: Credentials,
        pool: SessionPool | None = None,
        *,
        before_release: Callable[[], Awaitable[None]] | None = None,
    ):
        self.credentials = credentials
        self._pool = pool
        self._before_release = before_release
        self._session: KubeSession | None = None
        self._opening: asyncio.Task[KubeSession] | None = None

    async def session(self) -> KubeSession:
        """The shared session of this identity, acquired on first use."""
        return await KubeRuntime.get().run(self.acquire())

    async def acquire(self) -> KubeSession:
        """:meth:`session`, called on the runtime loop."""
        if self._session is not None and not self._session.closed:
            return self._session
        if self._opening is None:
            pool = self._pool or session_pool()
            self._opening = asyncio.get_running_loop().create_task(pool.acquire(self.credentials))
        opening = self._opening
        try:
            session = await asyncio.shield(opening)
        finally:
            if opening.done():
                self._opening = None
        self._session = session
        return session

    async def close(self) -> None:
        """Release this handle's share of the session (other holders' waits go on).

        The handle can still be used afterwards: it acquires the session again.
        """

        async def _close() -> None:
            if self._before_release is not None:
                await self._before_release()
            session, self._session = self._session, None
            if session is not None:
                await (self._pool or session_pool()).release(session)

        await KubeRuntime.get().run(_close())
