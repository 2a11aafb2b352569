"""The process node agent: a kubelet of our own whose pods run as processes of this machine.

It registers its Node (:mod:`.node`), renews the node's Lease, watches the pods bound to it
(a list, then a watch with ``fieldSelector=spec.nodeName=<node>``) and the cluster's Services,
and gives every pod a :class:`PodWorker`: a network namespace and address (:mod:`.network`),
its volumes, then its init containers in order and its containers, each run by the sandbox
launcher (:mod:`.sandbox`) in the pod's namespaces, with its output written as the container's
log. What to run and what to report are decided by the pure :mod:`.podspec` and
:mod:`.podstatus`; this module does the I/O.

A pod being deleted gets SIGTERM on its containers, SIGKILL of their whole process trees after
its grace period, its network removed, and is then deleted for good (grace period 0), as a
kubelet does. When the agent stops (SIGTERM), it kills every container and removes its
network; when it starts, it first kills what an earlier run of it left.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from kubedl_prefect.errors import (
    ConflictError,
    KubeAPIError,
    KubeConnectionError,
    NotFoundError,
    ServerError,
    WatchError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CONFIG_MAPS,
    EVENTS,
    LEASES,
    NODES,
    PODS,
    SECRETS,
    SERVICE_ACCOUNTS,
    SERVICES,
    KubeObject,
    ResourceKind,
)
from kubedl_prefect.testbed import cluster, podlogs
from kubedl_prefect.testbed.components import LOOPBACK, Layout
from kubedl_prefect.testbed.nodeagent import (
    forwarder,
    network,
    podspec,
    podstatus,
    probes,
    provisioner,
)
from kubedl_prefect.testbed.nodeagent.node import (
    LEASE_NAMESPACE,
    AgentPaths,
    machine_capacity,
    node_manifest,
    node_status,
)
from kubedl_prefect.testbed.nodeagent.podstatus import (
    ContainerRecord,
    Running,
    Terminated,
    Waiting,
)
from kubedl_prefect.testbed.nodeagent.prober import ContainerProber
from kubedl_prefect.testbed.nodeagent.sandbox import SandboxSpec

logger = logging.getLogger(__name__)

#: The module every container launcher runs (how leftovers are recognised).
SANDBOX_MODULE = "kubedl_prefect.testbed.nodeagent.sandbox"
#: How often the node's Lease is renewed.
LEASE_RENEW_S = 10.0
#: Largest piece of a line kept in one log entry.
_LOG_CHUNK = 64 * 1024


def now() -> str:
    """The current time, RFC 3339 (seconds), as Kubernetes writes it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def kill_launchers(paths: AgentPaths) -> int:
    """SIGKILL every container launcher of this test bed's process nodes; return how many.

    Launchers are recognised by their command line (the sandbox module and a spec file under
    the test bed's process-node folder); their containers die with them.
    """
    marker = str(paths.root) + "/"
    killed = 0
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if SANDBOX_MODULE in cmdline and any(arg.startswith(marker) for arg in cmdline):
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed += 1
    return killed


class _Relist(Exception):
    """A watch must start over from a new list (410 Gone, an ERROR event)."""


async def list_and_watch(
    kube: KubeClient,
    kind: ResourceKind,
    *,
    field_selector: str | None,
    on_list: Callable[[list[KubeObject]], Awaitable[None]],
    on_event: Callable[[str, KubeObject], Awaitable[None]],
) -> None:
    """List ``kind`` (all namespaces), then watch it for ever; list again when needed."""
    while True:
        try:
            listed = await kube.list(kind, None, field_selector=field_selector)
            await on_list(listed.items)
            version = listed.resource_version
            while True:
                async for event in kube.watch(
                    kind,
                    None,
                    resource_version=version,
                    field_selector=field_selector,
                    timeout_seconds=240,
                    inactivity_timeout_s=120,
                ):
                    kind_of_event = str(event.get("type"))
                    obj = event.get("object") or {}
                    if kind_of_event == "ERROR":
                        raise _Relist
                    version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                    if kind_of_event != "BOOKMARK":
                        await on_event(kind_of_event, obj)
        except (_Relist, KubeConnectionError, ServerError, WatchError) as exc:
            logger.info("watch of %s starts over: %s", kind, exc or type(exc).__name__)
            await asyncio.sleep(1.0)


class NodeAgent:
    """The agent of one process node.

    Args:
        layout: The test bed.
        kube: A client (the agent's identity).
        node: The node's name.
        venv: The project's virtual environment (the ``venv`` image environment).
    """

    def __init__(self, layout: Layout, kube: KubeClient, node: str, venv: Path):
        self.layout = layout
        self.kube = kube
        self.paths = AgentPaths(layout, node)
        self.node = node
        self.venv = venv
        self.net = network.BedNetwork(
            network.bed_tag(layout.name), network.subnet(layout.ports.base)
        )
        self.workers: dict[str, PodWorker] = {}
        self.services: dict[tuple[str, str], KubeObject] = {}
        self.slots: set[int] = set()
        self.capacity = machine_capacity()
        self.forwarder = forwarder.Forwarder(self.paths.node_dir / forwarder.FORWARDS_FILE)
        self._forwarding: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Register the node and serve its pods until cancelled; then stop every pod."""
        kill_launchers(self.paths)
        network.teardown(self.net)
        shutil.rmtree(self.paths.node_dir, ignore_errors=True)
        self.paths.node_dir.mkdir(parents=True, exist_ok=True)
        network.ensure_bridge(self.net)
        await self.register()
        tasks = [
            asyncio.create_task(self._renew_lease(), name="lease"),
            asyncio.create_task(
                list_and_watch(
                    self.kube,
                    SERVICES,
                    field_selector=None,
                    on_list=self._services_listed,
                    on_event=self._service_event,
                ),
                name="services",
            ),
            asyncio.create_task(
                list_and_watch(
                    self.kube,
                    PODS,
                    field_selector=f"spec.nodeName={self.node}",
                    on_list=self._pods_listed,
                    on_event=self._pod_event,
                ),
                name="pods",
            ),
            asyncio.create_task(
                provisioner.run_provisioner(self.kube, self.paths.root / "volumes"),
                name="provisioner",
            ),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await self.stop_all()

    async def stop_all(self) -> None:
        """Kill every pod's containers (short grace) and remove the network."""
        workers = list(self.workers.values())
        await asyncio.gather(*(w.shutdown(grace_s=2.0) for w in workers), return_exceptions=True)
        await self.forwarder.close()
        kill_launchers(self.paths)
        network.teardown(self.net)
        shutil.rmtree(self.paths.node_dir, ignore_errors=True)

    # -- the node ---------------------------------------------------------------------------

    async def register(self) -> None:
        """Create (or take over) the Node and write its status."""
        manifest = node_manifest(self.node, self.capacity)
        await cluster.create_or_update(self.kube, NODES, manifest)
        await self._write_node_status()

    async def _write_node_status(self) -> None:
        status = node_status(
            self.node, self.capacity, kubelet_port=self.layout.ports.kwok, now=now()
        )
        await self.kube.patch(NODES, None, self.node, {"status": status}, subresource="status")

    async def _renew_lease(self) -> None:
        beats = 0
        while True:
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.node, "namespace": LEASE_NAMESPACE},
                "spec": {
                    "holderIdentity": self.node,
                    "leaseDurationSeconds": 40,
                    "renewTime": _micro_now(),
                },
            }
            try:
                await cluster.create_or_update(self.kube, LEASES, lease)
                beats += 1
                if beats % 6 == 0:  # the status once a minute, as kubelets do
                    await self._write_node_status()
            except KubeAPIError as exc:
                logger.warning("could not renew the node's Lease: %s", exc)
            await asyncio.sleep(LEASE_RENEW_S)

    # -- Services: names in every pod's /etc/hosts ------------------------------------------

    async def _services_listed(self, items: list[KubeObject]) -> None:
        self.services = {_key(item): item for item in items}
        self.refresh_hosts()

    async def _service_event(self, kind: str, obj: KubeObject) -> None:
        if kind == "DELETED":
            self.services.pop(_key(obj), None)
        else:
            self.services[_key(obj)] = obj
        self.refresh_hosts()

    def refresh_hosts(self) -> None:
        """Write every pod's ``/etc/hosts`` from the Services and the pods they select."""
        entries = [w.entry() for w in self.workers.values() if w.pod_ip is not None]
        endpoints = network.service_endpoints(list(self.services.values()), entries)
        for worker in self.workers.values():
            worker.write_hosts(endpoints)
        pods = [
            forwarder.ProcessPod(w.entry(), forwarder.container_ports(w.pod))
            for w in self.workers.values()
            if w.pod_ip is not None
        ]
        routes = forwarder.service_routes(list(self.services.values()), pods)
        task = asyncio.get_running_loop().create_task(self.forwarder.update(routes))
        self._forwarding.add(task)
        task.add_done_callback(self._forwarding.discard)

    # -- pods ------------------------------------------------------------------------------

    async def _pods_listed(self, items: list[KubeObject]) -> None:
        present = {str(p["metadata"]["uid"]) for p in items}
        for uid in list(self.workers):
            if uid not in present:
                self.workers[uid].gone()
        for pod in items:
            self._sync(pod)

    async def _pod_event(self, kind: str, pod: KubeObject) -> None:
        uid = str(pod["metadata"]["uid"])
        if kind == "DELETED":
            if uid in self.workers:
                self.workers[uid].gone()
            return
        self._sync(pod)

    def _sync(self, pod: KubeObject) -> None:
        uid = str(pod["metadata"]["uid"])
        worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
            return  # finished before this agent started
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        worker.start()

    def take_slot(self) -> int:
        """A free pod address slot, now taken."""
        slot = network.free_slot(self.slots, self.net.slots)
        self.slots.add(slot)
        return slot

    def forget(self, worker: PodWorker) -> None:
        """Drop a pod that is gone (its slot is free again)."""
        self.workers.pop(worker.uid, None)
        if worker.slot is not None:
            self.slots.discard(worker.slot)
        self.refresh_hosts()

    async def event(self, pod: KubeObject, kind: str, reason: str, message: str) -> None:
        """Record an Event about ``pod``, as a kubelet does (errors are only logged)."""
        meta = pod["metadata"]
        stamp = now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": self.node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.kube.create(EVENTS, meta["namespace"], body)
        except KubeAPIError as exc:
            logger.info("could not record event %s of %s: %s", reason, meta["name"], exc)


def _key(obj: KubeObject) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class PodWorker:
    """Runs one pod: its network, volumes, init containers, containers, status and deletion."""

    def __init__(self, agent: NodeAgent, pod: KubeObject):
        self.agent = agent
        self.pod = pod
        self.uid = str(pod["metadata"]["uid"])
        self.namespace = str(pod["metadata"]["namespace"])
        self.name = str(pod["metadata"]["name"])
        self.dir = agent.paths.pod_dir(self.uid)
        self.slot: int | None = None
        self.pod_ip: str | None = None
        self.netns: str | None = None
        self.start_time = now()
        spec = pod.get("spec") or {}
        self.policy = str(spec.get("restartPolicy", "Always"))
        self.init_specs: list[dict[str, Any]] = list(spec.get("initContainers") or [])
        self.specs: list[dict[str, Any]] = list(spec.get("containers") or [])
        self.init = [
            ContainerRecord(c["name"], c.get("image", ""), Waiting("PodInitializing"))
            for c in self.init_specs
        ]
        self.records = [
            ContainerRecord(c["name"], c.get("image", ""), Waiting("ContainerCreating"))
            for c in self.specs
        ]
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        #: What the readiness probes of running containers say, by container name.
        self.readiness: dict[str, bool] = {}
        self.deleting = asyncio.Event()
        self.grace_s = 30.0
        self._task: asyncio.Task[None] | None = None
        self._written: KubeObject | None = None
        self._report_lock = asyncio.Lock()
        self._gone = False
        self._ready = False
        #: Host folder and read-only flag of each persistentVolumeClaim volume, by name.
        self.claims: dict[str, tuple[Path, bool]] = {}

    # -- driven by the agent -----------------------------------------------------------------

    def start(self) -> None:
        """Start running the pod."""
        self._task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")
        if self.pod["metadata"].get("deletionTimestamp"):
            self.update(self.pod)

    def update(self, pod: KubeObject) -> None:
        """A newer version of the pod: a deletion starts its termination."""
        self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not self.deleting.is_set():
            self.grace_s = float(meta.get("deletionGracePeriodSeconds", 30))
            self.deleting.set()
            self.agent.refresh_hosts()  # out of its Services' endpoints at once

    def gone(self) -> None:
        """The pod object was removed: kill everything at once."""
        self._gone = True
        self.grace_s = 0.0
        self.deleting.set()

    async def shutdown(self, *, grace_s: float) -> None:
        """Stop the pod's containers (the agent stops) and wait for its worker."""
        self._gone = True
        self.grace_s = min(self.grace_s, grace_s)
        self.deleting.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task

    # -- the pod's life ------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._prepare()
            await self.report()
            if await self._run_init():
                await asyncio.gather(*(self._run_container(i) for i in range(len(self.specs))))
            await self.report()
            await self.deleting.wait()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("pod %s/%s failed in the agent", self.namespace, self.name)
            await self.deleting.wait()
        finally:
            await self._kill_all()
            self._teardown()
            if not self._gone:
                await self._delete_object()
            self.agent.forget(self)

    async def _prepare(self) -> None:
        self.slot = self.agent.take_slot()
        self.pod_ip = self.agent.net.address(self.slot)
        self.netns = await asyncio.to_thread(network.add_pod_network, self.agent.net, self.slot)
        (self.dir / "etc").mkdir(parents=True, exist_ok=True)
        (self.dir / "volumes").mkdir(parents=True, exist_ok=True)
        (self.dir / "etc" / "hostname").write_text(podspec.hostname(self.pod) + "\n")
        (self.dir / "etc" / "resolv.conf").write_text(network.render_resolv_conf(self.namespace))
        self.agent.refresh_hosts()

    def entry(self) -> network.PodEntry:
        """The pod as Services select it.

        A pod being deleted is not ready for its Services, whatever its probes say: Kubernetes
        takes a terminating pod out of its Services' endpoints at once (but where they publish
        not-ready addresses), while its containers shut down in their grace period.
        """
        spec = self.pod.get("spec") or {}
        metadata = self.pod.get("metadata") or {}
        terminating = self.deleting.is_set() or bool(metadata.get("deletionTimestamp"))
        return network.PodEntry(
            namespace=self.namespace,
            labels=dict(metadata.get("labels") or {}),
            address=self.pod_ip or "",
            hostname=str(spec.get("hostname", "")),
            subdomain=str(spec.get("subdomain", "")),
            ready=not terminating
            and bool(self.records)
            and all(
                isinstance(r.state, Running) and self.readiness.get(r.name, True)
                for r in self.records
            ),
        )

    def write_hosts(self, endpoints: list[KubeObject]) -> None:
        """Write the pod's ``/etc/hosts`` (in place: containers see it change)."""
        if self.pod_ip is None or not (self.dir / "etc").is_dir():
            return
        spec = self.pod.get("spec") or {}
        own = network.PodName(
            self.pod_ip, podspec.hostname(self.pod), str(spec.get("subdomain", "")), self.namespace
        )
        network.write_in_place(self.dir / "etc" / "hosts", network.render_hosts(own, endpoints))

    def _facts(self) -> podspec.PodFacts:
        return podspec.PodFacts(pod_ip=self.pod_ip or "", host_ip=LOOPBACK, venv=self.agent.venv)

    async def _objects(self) -> tuple[dict[str, KubeObject], dict[str, KubeObject]]:
        secret_names, config_map_names = podspec.referenced_objects(self.pod)
        secrets: dict[str, KubeObject] = {}
        config_maps: dict[str, KubeObject] = {}
        for names, kind, found in (
            (secret_names, SECRETS, secrets),
            (config_map_names, CONFIG_MAPS, config_maps),
        ):
            for name in names:
                with contextlib.suppress(NotFoundError):
                    found[name] = await self.agent.kube.get(kind, self.namespace, name)
        return secrets, config_maps

    async def _token(self) -> str | None:
        account = str((self.pod.get("spec") or {}).get("serviceAccountName") or "default")
        plural = f"{SERVICE_ACCOUNTS.plural}/{account}/token"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.name,
                    "uid": self.uid,
                },
            },
        }
        try:
            answer = await self.agent.kube.create(
                ResourceKind("", "v1", "TokenRequest", plural), self.namespace, request
            )
        except KubeAPIError as exc:
            logger.info("no token for %s/%s: %s", self.namespace, self.name, exc)
            return None
        return str(answer["status"]["token"])

    async def _volumes(self) -> str | None:
        """Write the pod's volumes; return why one cannot be set up, or ``None``."""
        volumes = (self.pod.get("spec") or {}).get("volumes") or []
        secrets, config_maps = await self._objects()
        needs_token = any(
            "serviceAccountToken" in source
            for v in volumes
            for source in (v.get("projected") or {}).get("sources") or []
        )
        token = await self._token() if needs_token else None
        for volume in volumes:
            if "persistentVolumeClaim" in volume:
                claim = await provisioner.claim_mount(self.agent.kube, self.namespace, volume)
                if isinstance(claim, str):
                    return claim
                self.claims[str(volume["name"])] = claim
                continue
            contents = podspec.volume_files(
                volume,
                self.pod,
                self._facts(),
                secrets=secrets,
                config_maps=config_maps,
                token=token,
            )
            if isinstance(contents, str):
                return contents
            folder = self.dir / "volumes" / str(volume["name"])
            folder.mkdir(parents=True, exist_ok=True)
            for relative, (data, mode) in contents.files.items():
                target = folder / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                target.chmod(mode)
        return None

    async def _run_init(self) -> bool:
        """Run the init containers in order; whether the containers may start."""
        if not self.init_specs:
            return True
        for index in range(len(self.init_specs)):
            outcome = await self._run_one(index, init=True)
            if outcome != 0:
                return False
        return True

    async def _run_container(self, index: int) -> None:
        await self._run_one(index, init=False)

    def _records(self, init: bool) -> list[ContainerRecord]:
        return self.init if init else self.records

    async def _set(self, index: int, init: bool, record: ContainerRecord) -> None:
        self._records(init)[index] = record
        await self.report()

    async def _wait_deleting(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the pod is deleted meanwhile; whether it is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.deleting.wait(), seconds)
        return self.deleting.is_set()

    async def _run_one(self, index: int, *, init: bool) -> int | None:
        """Run one container until it is done for good; its last exit code (``None``: never)."""
        container = (self.init_specs if init else self.specs)[index]
        name = str(container["name"])
        setup_failures = 0
        while not self.deleting.is_set():
            record = self._records(init)[index]
            problem = await self._volumes()
            if problem is not None:
                await self.agent.event(self.pod, "Warning", "FailedMount", problem)
                await self._set(
                    index, init, _replace(record, Waiting("ContainerCreating", problem))
                )
                setup_failures += 1
                if await self._wait_deleting(podstatus.backoff_s(setup_failures)):
                    return None
                continue
            secrets, config_maps = await self._objects()
            plan = podspec.plan_container(
                container, self.pod, self._facts(), secrets=secrets, config_maps=config_maps
            )
            if isinstance(plan, podspec.ContainerProblem):
                await self._not_startable(index, init, record, plan)
                setup_failures += 1
                if await self._wait_deleting(podstatus.backoff_s(setup_failures, cap=20.0)):
                    return None
                continue
            code = await self._execute(index, init, plan)
            if code is None:
                return None
            record = self._records(init)[index]
            assert isinstance(record.state, Terminated)
            again = (
                podstatus.restarts(self.policy, code)
                if not init
                else (code != 0 and self.policy != "Never")
            )
            if not again:
                return code
            waiting = Waiting(
                "CrashLoopBackOff",
                f"back-off restarting failed container {name} in pod {self.name}",
            )
            await self._set(
                index,
                init,
                ContainerRecord(
                    record.name, record.image, waiting, record.state, record.restart_count + 1
                ),
            )
            if await self._wait_deleting(podstatus.backoff_s(record.restart_count)):
                return None
        return None

    async def _not_startable(
        self, index: int, init: bool, record: ContainerRecord, plan: podspec.ContainerProblem
    ) -> None:
        if plan.reason == "ErrImagePull":
            await self._set(index, init, _replace(record, Waiting("ErrImagePull", plan.message)))
            await self.agent.event(self.pod, "Warning", "Failed", plan.message)
            if await self._wait_deleting(1.0):
                return
            image = (self.init_specs if init else self.specs)[index].get("image", "")
            message = f'Back-off pulling image "{image}"'
            await self._set(index, init, _replace(record, Waiting("ImagePullBackOff", message)))
            await self.agent.event(self.pod, "Normal", "BackOff", message)
        else:
            await self._set(index, init, _replace(record, Waiting(plan.reason, plan.message)))
            await self.agent.event(self.pod, "Warning", "Failed", f"Error: {plan.message}")

    def _log(self, name: str, *, fresh: bool) -> podlogs.PodLog:
        path = podlogs.pod_log_path(self.agent.layout.pod_logs_dir, self.namespace, self.name, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        previous = podlogs.previous_path(path)
        if fresh and path.exists() and path.stat().st_size:
            path.replace(previous)
        path.touch()
        previous.touch()
        return podlogs.PodLog(self.namespace, self.name, name, path)

    async def _execute(self, index: int, init: bool, plan: podspec.ContainerPlan) -> int | None:
        """Run the container once; its exit code, or ``None`` when the pod went away first."""
        record = self._records(init)[index]
        log = self._log(plan.name, fresh=record.restart_count > 0)
        await cluster.ensure_pod_log(
            self.agent.kube,
            self.namespace,
            self.name,
            plan.name,
            log.path,
            self.agent.layout.pod_logs_dir / "empty.log",
        )
        volumes = {str(v.get("name")): v for v in (self.pod.get("spec") or {}).get("volumes") or []}
        mounts = []
        for mount in plan.mounts:
            claim = self.claims.get(mount.volume)
            writable = "emptyDir" in volumes.get(mount.volume, {}) or (
                claim is not None and not claim[1]
            )
            source = claim[0] if claim else self.dir / "volumes" / mount.volume
            if mount.sub_path:
                source = source / mount.sub_path
                if writable and not source.exists():
                    source.mkdir(parents=True)
            mounts.append((str(source), mount.path, mount.read_only or not writable))
        scratch = self.dir / "scratch" / f"{plan.name}-{record.restart_count}"
        scratch.mkdir(parents=True, exist_ok=True)
        message = self._termination_file(plan.name, init)
        if message is not None:  # a file of the node's at terminationMessagePath, as a kubelet
            mounts.append((str(message[0]), message[1], False))
        spec = SandboxSpec(
            netns=self.netns or "",
            hostname=podspec.hostname(self.pod),
            scratch=str(scratch),
            etc={
                "/etc/hosts": str(self.dir / "etc" / "hosts"),
                "/etc/resolv.conf": str(self.dir / "etc" / "resolv.conf"),
                "/etc/hostname": str(self.dir / "etc" / "hostname"),
            },
            mounts=mounts,
            argv=list(plan.argv),
            env=plan.env,
            working_dir=plan.working_dir,
        )
        spec_file = self.dir / f"{plan.name}.json"
        spec_file.write_text(spec.to_json())
        started = now()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            SANDBOX_MODULE,
            str(spec_file),
            str(os.getpid()),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.processes[plan.name] = process
        prober = None if init else self._prober(self.specs[index], plan, process)
        await self._set(index, init, _replace(record, Running(started)))
        probing = asyncio.create_task(prober.run()) if prober is not None else None
        assert process.stdout is not None
        assert process.stderr is not None
        copies = [
            asyncio.create_task(_copy(process.stdout, log, "stdout")),
            asyncio.create_task(_copy(process.stderr, log, "stderr")),
        ]
        waiter = asyncio.create_task(process.wait())
        deleted = asyncio.create_task(self.deleting.wait())
        await asyncio.wait({waiter, deleted}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            await self._terminate(process)
        deleted.cancel()
        code = await waiter
        if probing is not None:
            probing.cancel()
            self.readiness.pop(plan.name, None)
        await asyncio.gather(*copies, return_exceptions=True)
        self.processes.pop(plan.name, None)
        shutil.rmtree(scratch, ignore_errors=True)
        exit_code = code if code >= 0 else 128 - code
        signal_number = exit_code - 128 if exit_code > 128 else None
        left = ""
        if message is not None:
            with contextlib.suppress(OSError):  # the pod's folder may be gone with the pod
                left = podstatus.termination_message(message[0].read_bytes())
        terminated = Terminated(exit_code, started, now(), signal_number, left)
        self._records(init)[index] = ContainerRecord(
            record.name, record.image, terminated, record.last, record.restart_count
        )
        if self.deleting.is_set():
            return None
        await self.report()
        return exit_code

    def _prober(
        self,
        container: KubeObject,
        plan: podspec.ContainerPlan,
        process: asyncio.subprocess.Process,
    ) -> ContainerProber | None:
        """The prober of one run of ``container`` (``None``: it has no probes)."""
        found = probes.container_probes(container, self.pod_ip or "")
        if isinstance(found, str):
            logger.warning("pod %s/%s: %s: not probed", self.namespace, self.name, found)
            return None
        if not found:
            return None
        name = plan.name
        if any(p.kind == "readiness" for p in found):
            self.readiness[name] = False
        pod_grace = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds")

        async def on_ready(ready: bool) -> None:
            self.readiness[name] = ready
            await self.report()

        async def on_failure(kind: probes.ProbeKind, message: str) -> None:
            await self.agent.event(self.pod, "Warning", "Unhealthy", message)

        async def on_kill(probe: probes.Probe) -> None:
            message = probes.kill_message(name, probe.kind)
            await self.agent.event(self.pod, "Normal", "Killing", message)
            grace = probe.termination_grace_s
            if grace is None:
                grace = float(pod_grace) if pod_grace is not None else 30.0
            await self._terminate(process, grace_s=grace)

        return ContainerProber(
            found,
            init_pid=lambda: _first_child(process.pid),
            env=plan.env,
            on_ready=on_ready,
            on_failure=on_failure,
            on_kill=on_kill,
        )

    def _termination_file(self, name: str, init: bool) -> tuple[Path, str] | None:
        """An empty file for the container's termination message, and where it is mounted."""
        spec = self.pod.get("spec") or {}
        containers = spec.get("initContainers" if init else "containers") or []
        container: KubeObject = next((c for c in containers if c.get("name") == name), {})
        path = podstatus.termination_message_path(container)
        if path is None:
            return None
        file = self.dir / "termination" / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(b"")  # each run starts with no message
        return file, path

    async def _terminate(
        self, process: asyncio.subprocess.Process, *, grace_s: float | None = None
    ) -> None:
        """SIGTERM (passed on to the command), then SIGKILL after the grace period."""
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        grace = self.grace_s if grace_s is None else grace_s
        try:
            await asyncio.wait_for(process.wait(), max(0.0, grace))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # the launcher; the kernel then kills its namespace

    async def _kill_all(self) -> None:
        for process in list(self.processes.values()):
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                with contextlib.suppress(Exception):
                    await process.wait()

    def _teardown(self) -> None:
        if self.slot is not None:
            network.delete_pod_network(self.agent.net, self.slot)
        shutil.rmtree(self.dir, ignore_errors=True)

    async def _delete_object(self) -> None:
        try:
            await self.agent.kube.delete(
                PODS,
                self.namespace,
                self.name,
                uid=self.uid,
                grace_period_s=0,
                propagation="Background",
            )
        except (ConflictError, NotFoundError):
            pass
        except KubeAPIError as exc:
            logger.warning("could not delete pod %s/%s: %s", self.namespace, self.name, exc)

    async def report(self) -> None:
        """Write the pod's status when it changed."""
        if self.deleting.is_set() and self._gone:
            return
        async with self._report_lock:
            status = podstatus.pod_status(
                self.pod,
                self.init,
                self.records,
                pod_ip=self.pod_ip,
                host_ip=LOOPBACK,
                start_time=self.start_time,
                now=now(),
                readiness=self.readiness,
            )
            if status == self._written:
                return
            try:
                answer = await self.agent.kube.patch(
                    PODS, self.namespace, self.name, {"status": status}, subresource="status"
                )
            except NotFoundError:
                return
            except KubeAPIError as exc:
                logger.warning("status of %s/%s not written: %s", self.namespace, self.name, exc)
                return
            self._written = status
            self.pod["status"] = answer.get("status", status)
            ready = self.entry().ready
            if ready != self._ready:
                self._ready = ready
                self.agent.refresh_hosts()


def _first_child(pid: int) -> int | None:
    """The first child of process ``pid`` (a launcher's: the container's first process)."""
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(pid).children()
        if children:
            return children[0].pid
    return None


def _replace(record: ContainerRecord, state: podstatus.ContainerState) -> ContainerRecord:
    return ContainerRecord(record.name, record.image, state, record.last, record.restart_count)


async def _copy(stream: asyncio.StreamReader, log: podlogs.PodLog, name: podlogs.Stream) -> None:
    """Copy a container's output into its log, line by line (long lines in pieces)."""
    pending = b""
    while True:
        chunk = await stream.read(_LOG_CHUNK)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        while len(pending) > _LOG_CHUNK:
            lines.append(pending[:_LOG_CHUNK])
            pending = pending[_LOG_CHUNK:]
        if lines:
            log.write(*(line.decode("utf-8", errors="replace") for line in lines), stream=name)
    if pending:
        log.write(pending.decode("utf-8", errors="replace"), stream=name)


async def serve(layout: Layout, kubeconfig: Path, node: str) -> None:
    """Run the agent of ``node`` until SIGTERM or SIGINT."""
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    agent = NodeAgent(layout, kube, node, Path(sys.prefix))
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, task.cancel)
    try:
        await agent.run()
    except asyncio.CancelledError:
        logger.info("process node %s stopped", node)
    finally:
        await kube.close()
