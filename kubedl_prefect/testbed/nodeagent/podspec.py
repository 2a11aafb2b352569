"""What a pod's containers are to run on a process node: commands, environment, mounts (pure).

:func:`plan_container` turns one container of a pod (and the Secrets and ConfigMaps it refers
to) into a :class:`ContainerPlan` (argv, environment, working directory, mounts) or a
:class:`ContainerProblem` (the waiting reason a kubelet would report: ``ErrImagePull`` for an
image no rule of the image map knows, ``CreateContainerConfigError`` for a missing Secret or
key). :func:`volume_files` says what a volume holds. Nothing here does I/O: the node agent
fetches the objects and writes the files.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from kubedl_prefect.testbed.nodeagent.images import IMAGE_MAP, ImageRule, resolve_image

KubeObject = dict[str, Any]

#: Where every pod finds its ServiceAccount's token, CA and namespace.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class PodFacts:
    """What the node knows of a pod beyond its manifest.

    Attributes:
        pod_ip: The pod's address.
        host_ip: The node's address.
        venv: The project's virtual environment (the ``venv`` image environment).
        rules: The image map.
    """

    pod_ip: str
    host_ip: str
    venv: Path
    rules: tuple[ImageRule, ...] = IMAGE_MAP


@dataclass(frozen=True)
class Mount:
    """One ``volumeMount`` of a container.

    Attributes:
        volume: The volume's name.
        path: Where it appears inside the container (absolute).
        sub_path: A path inside the volume to mount instead of its root.
        read_only: Mounted read-only.
    """

    volume: str
    path: str
    sub_path: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class ContainerPlan:
    """How one container runs.

    Attributes:
        name: The container's name.
        image: Its image reference.
        argv: The command and its arguments, ``$(VAR)`` expanded.
        env: Its whole environment (image variables, then the container's, ``HOSTNAME``).
        working_dir: Its working directory (``/`` unless it says otherwise).
        mounts: Its volume mounts.
    """

    name: str
    image: str
    argv: tuple[str, ...]
    env: dict[str, str]
    working_dir: str
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class ContainerProblem:
    """Why a container cannot start: the waiting reason and message a kubelet reports.

    Attributes:
        name: The container's name.
        reason: ``ErrImagePull``, ``CreateContainerConfigError`` or ``CreateContainerError``.
        message: What is wrong.
    """

    name: str
    reason: str
    message: str


class _ConfigError(Exception):
    """A reference that cannot be resolved (becomes ``CreateContainerConfigError``)."""


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, values: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names replaced, ``$$`` an escaped ``$``.

    Example:
        >>> expand("--rank=$(RANK) $(UNKNOWN) $$(RANK)", {"RANK": "1"})
        '--rank=1 $(UNKNOWN) $(RANK)'
    """

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return values.get(name, match.group(0))

    return _VAR.sub(replace, text)


_LABEL_PATH = re.compile(r"metadata\.(labels|annotations)\['(.+)'\]")


def field_value(pod: KubeObject, path: str, facts: PodFacts) -> str:
    """The downward-API value of ``fieldPath`` for ``pod``.

    Raises:
        _ConfigError: A field the downward API does not offer.
    """
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path in simple:
        return str(simple[path])
    match = _LABEL_PATH.fullmatch(path)
    if match:
        return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = metadata.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise _ConfigError(f"unsupported fieldPath {path!r}")


def _data(kind: str, obj: KubeObject) -> dict[str, str]:
    """The decoded ``data`` of a Secret, or a ConfigMap's ``data`` (and ``binaryData``)."""
    found: dict[str, str] = {}
    if kind == "Secret":
        for key, value in (obj.get("data") or {}).items():
            found[key] = base64.b64decode(value).decode("utf-8", errors="replace")
        found.update(obj.get("stringData") or {})
    else:
        found.update(obj.get("data") or {})
        for key, value in (obj.get("binaryData") or {}).items():
            found[key] = base64.b64decode(value).decode("utf-8", errors="replace")
    return found


def _key_ref(
    kind: str, ref: Mapping[str, Any], namespace: str, objects: Mapping[str, KubeObject]
) -> str | None:
    name, key = str(ref.get("name", "")), str(ref.get("key", ""))
    optional = bool(ref.get("optional", False))
    if name not in objects:
        if optional:
            return None
        raise _ConfigError(f'{kind.lower()} "{name}" not found')
    data = _data(kind, objects[name])
    if key not in data:
        if optional:
            return None
        raise _ConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return data[key]


def _env(
    container: Mapping[str, Any],
    pod: KubeObject,
    facts: PodFacts,
    secrets: Mapping[str, KubeObject],
    config_maps: Mapping[str, KubeObject],
) -> dict[str, str]:
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix", ""))
        for kind, key, objects in (
            ("ConfigMap", "configMapRef", config_maps),
            ("Secret", "secretRef", secrets),
        ):
            ref = source.get(key)
            if ref is None:
                continue
            name = str(ref.get("name", ""))
            if name not in objects:
                if ref.get("optional"):
                    continue
                raise _ConfigError(f'{kind.lower()} "{name}" not found')
            for item, data in _data(kind, objects[name]).items():
                env[prefix + item] = data
    for item in container.get("env") or []:
        name = str(item["name"])
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, str(source["fieldRef"].get("fieldPath", "")), facts)
        elif "secretKeyRef" in source:
            value = _key_ref("Secret", source["secretKeyRef"], namespace, secrets)
        elif "configMapKeyRef" in source:
            value = _key_ref("ConfigMap", source["configMapKeyRef"], namespace, config_maps)
        else:
            raise _ConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
        if value is not None:
            env[name] = value
    return env


def hostname(pod: KubeObject) -> str:
    """The pod's host name: ``spec.hostname``, else its name (cut to 63 characters)."""
    spec = pod.get("spec") or {}
    name = spec.get("hostname") or (pod.get("metadata") or {}).get("name", "pod")
    return str(name)[:63].rstrip("-.")


def plan_container(
    container: Mapping[str, Any],
    pod: KubeObject,
    facts: PodFacts,
    *,
    secrets: Mapping[str, KubeObject],
    config_maps: Mapping[str, KubeObject],
) -> ContainerPlan | ContainerProblem:
    """How ``container`` of ``pod`` runs, or why it cannot start.

    Args:
        container: The container (an entry of ``initContainers`` or ``containers``).
        pod: The pod.
        facts: Its address, the node's, the image map and the project's environment.
        secrets: The pod namespace's Secrets it refers to, by name (missing: not found).
        config_maps: The ConfigMaps it refers to, by name.
    """
    name = str(container.get("name", ""))
    image = str(container.get("image", ""))
    environment = resolve_image(image, facts.venv, facts.rules)
    if environment is None:
        return ContainerProblem(
            name,
            "ErrImagePull",
            f'Failed to pull image "{image}": no local environment is mapped to it on this '
            "process node (kubedl-prefect test bed; see the image map in docs/testbed.md)",
        )
    try:
        own = _env(container, pod, facts, secrets, config_maps)
    except _ConfigError as exc:
        return ContainerProblem(name, "CreateContainerConfigError", str(exc))
    command = [expand(str(part), own) for part in container.get("command") or []]
    args = [expand(str(part), own) for part in container.get("args") or []]
    if not command:  # the image's entry point, and its default arguments unless given
        command = list(environment.entrypoint)
        args = args or list(environment.cmd)
    argv = (*command, *args)
    if not argv:
        return ContainerProblem(
            name, "CreateContainerError", "no command specified (its image has no default command)"
        )
    env = {
        **environment.environment(),
        "HOME": "/root",
        "HOSTNAME": hostname(pod),
        **own,
    }
    mounts = []
    for mount in container.get("volumeMounts") or []:
        path = str(mount.get("mountPath", ""))
        if not PurePosixPath(path).is_absolute():
            return ContainerProblem(name, "CreateContainerError", f"mountPath {path!r}")
        mounts.append(
            Mount(
                volume=str(mount.get("name", "")),
                path=path,
                sub_path=str(mount.get("subPath", "")),
                read_only=bool(mount.get("readOnly", False)),
            )
        )
    return ContainerPlan(
        name=name,
        image=image,
        argv=argv,
        env=env,
        working_dir=str(container.get("workingDir") or "/"),
        mounts=tuple(mounts),
    )


@dataclass(frozen=True)
class VolumeFiles:
    """What a volume holds.

    Attributes:
        files: ``{relative path: (content, mode)}`` (an ``emptyDir`` has none).
        writable: Containers may write to it (``emptyDir``); the others are read-only.
    """

    files: dict[str, tuple[bytes, int]]
    writable: bool = False


def _items(
    data: Mapping[str, bytes], items: list[Mapping[str, Any]] | None, mode: int
) -> dict[str, tuple[bytes, int]]:
    if not items:
        return {key: (value, mode) for key, value in data.items()}
    picked = {}
    for item in items:
        key = str(item["key"])
        if key in data:
            picked[str(item.get("path", key))] = (data[key], int(item.get("mode", mode)))
    return picked


def _raw(kind: str, obj: KubeObject) -> dict[str, bytes]:
    raw: dict[str, bytes] = {}
    if kind == "Secret":
        for key, value in (obj.get("data") or {}).items():
            raw[key] = base64.b64decode(value)
    else:
        for key, value in (obj.get("data") or {}).items():
            raw[key] = str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            raw[key] = base64.b64decode(value)
    return raw


def volume_files(
    volume: Mapping[str, Any],
    pod: KubeObject,
    facts: PodFacts,
    *,
    secrets: Mapping[str, KubeObject],
    config_maps: Mapping[str, KubeObject],
    token: str | None,
) -> VolumeFiles | str:
    """What ``volume`` holds, or why it cannot be set up (a ``FailedMount`` message).

    ``emptyDir``, ``configMap``, ``secret``, ``downwardAPI`` and ``projected`` (service-account
    token, ConfigMaps, Secrets, downward API) are supported.

    Args:
        volume: An entry of the pod's ``volumes``.
        pod: The pod.
        facts: Its facts (downward API).
        secrets: Secrets it refers to, by name.
        config_maps: ConfigMaps it refers to, by name.
        token: A token for the pod's ServiceAccount (projected ``serviceAccountToken``).
    """
    if "emptyDir" in volume:
        return VolumeFiles({}, writable=True)
    sources: list[tuple[str, Mapping[str, Any]]] = []
    default_mode = 0o644
    if "projected" in volume:
        projected = volume["projected"]
        default_mode = int(projected.get("defaultMode", default_mode))
        for source in projected.get("sources") or []:
            for key in ("secret", "configMap", "downwardAPI", "serviceAccountToken"):
                if key in source:
                    sources.append((key, source[key]))
    else:
        for key in ("secret", "configMap", "downwardAPI"):
            if key in volume:
                sources.append((key, volume[key]))
                default_mode = int(volume[key].get("defaultMode", default_mode))
    if not sources:
        kinds = sorted(set(volume) - {"name"})
        return f"volume {volume.get('name')}: {', '.join(kinds)} volumes are not supported"
    files: dict[str, tuple[bytes, int]] = {}
    for key, source in sources:
        if key == "serviceAccountToken":
            if token is None:
                return f"volume {volume.get('name')}: no service-account token"
            files[str(source.get("path", "token"))] = (token.encode(), default_mode)
        elif key == "downwardAPI":
            for item in source.get("items") or []:
                field = (item.get("fieldRef") or {}).get("fieldPath")
                if not field:
                    return f"volume {volume.get('name')}: only fieldRef items are supported"
                try:
                    text = field_value(pod, str(field), facts)
                except _ConfigError as exc:
                    return f"volume {volume.get('name')}: {exc}"
                files[str(item["path"])] = (text.encode(), int(item.get("mode", default_mode)))
        else:
            kind = "Secret" if key == "secret" else "ConfigMap"
            name = str(source.get("secretName" if key == "secret" else "name", source.get("name")))
            objects = secrets if kind == "Secret" else config_maps
            if name not in objects:
                if source.get("optional"):
                    continue
                return f'{kind.lower()} "{name}" not found'
            files.update(_items(_raw(kind, objects[name]), source.get("items"), default_mode))
    return VolumeFiles(files)


def referenced_objects(pod: KubeObject) -> tuple[set[str], set[str]]:
    """Names of the Secrets and ConfigMaps ``pod`` refers to (env, envFrom, volumes)."""
    secrets: set[str] = set()
    config_maps: set[str] = set()
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for container in containers:
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                secrets.add(str(source["secretRef"].get("name", "")))
            if "configMapRef" in source:
                config_maps.add(str(source["configMapRef"].get("name", "")))
        for item in container.get("env") or []:
            source = item.get("valueFrom") or {}
            if "secretKeyRef" in source:
                secrets.add(str(source["secretKeyRef"].get("name", "")))
            if "configMapKeyRef" in source:
                config_maps.add(str(source["configMapKeyRef"].get("name", "")))
    for volume in spec.get("volumes") or []:
        if "secret" in volume:
            secrets.add(str(volume["secret"].get("secretName", "")))
        if "configMap" in volume:
            config_maps.add(str(volume["configMap"].get("name", "")))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                secrets.add(str(source["secret"].get("name", "")))
            if "configMap" in source:
                config_maps.add(str(source["configMap"].get("name", "")))
    return secrets, config_maps
