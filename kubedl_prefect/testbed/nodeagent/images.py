"""Which local environment an image runs in on a process node: the image map (pure).

A process node pulls nothing. An image reference is matched, by its repository (registry host
``docker.io`` and the ``library/`` prefix dropped, tag and digest ignored), against
:data:`IMAGE_MAP`; the first rule that matches names the environment the container's command
runs in:

- ``venv``: the project's virtual environment (the Python the node agent runs with: torch,
  kubedl-prefect and its example training program), its ``bin`` first on ``PATH``;
- ``system``: this machine's own ``/usr/bin`` and ``/bin`` (``sh``, ``echo``, ``sleep``...);
- ``shell``: the same, with an ``nslookup`` first on ``PATH`` that answers from the pod's
  ``/etc/hosts`` (:data:`SHIMS`; the test bed has no DNS server, its names are in that file):
  ``alpine``, the image of the Kubeflow training operator's PyTorchJob init container, which
  waits with ``nslookup <master service>``.

KServe's images map too: ``seldonio/mlserver`` (the ``kserve-mlserver`` runtime) to ``mlserver``,
the model server's own environment (:func:`kubedl_prefect.serving.local.server_environment`, the
one local serving uses), whose default command is the image's ``mlserver start
$MLSERVER_MODELS_DIR``; ``kserve/storage-initializer`` to ``storage-initializer``, whose entry point
is :mod:`.storage_initializer` in the project's environment (KServe's contract: ``SRC DEST``
pairs). A container without ``command`` runs its image's entry point (and, without ``args``, its
default arguments), as a container runtime does.

An image no rule matches cannot be "pulled": the container waits with ``ErrImagePull``, then
``ImagePullBackOff``, as a real kubelet does for an image that does not exist.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

#: Commands the ``shell`` environment puts before the machine's (``nslookup``).
SHIMS = Path(__file__).parent / "shims"
#: Where KServe's model server images read the model (``$MLSERVER_MODELS_DIR``).
MODELS_DIR = "/mnt/models"
#: The module the storage initializer image runs.
STORAGE_INITIALIZER_MODULE = "kubedl_prefect.testbed.nodeagent.storage_initializer"
#: ``PATH`` of the machine's own tools, after an environment's own folders.
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class ImageRule:
    """One line of the image map.

    Attributes:
        repository: An ``fnmatch`` pattern of the normalised repository (``pytorch/pytorch``,
            ``ghcr.io/kubedl-prefect/*``).
        environment: ``venv`` or ``system``.
    """

    repository: str
    environment: str


#: The image map, first match wins (docs/testbed.md, "Process nodes", lists it too).
IMAGE_MAP: tuple[ImageRule, ...] = (
    ImageRule("pytorch/pytorch", "venv"),
    ImageRule("ghcr.io/kubedl-prefect/*", "venv"),
    ImageRule("kubeflow/pytorch-dist-*", "venv"),
    ImageRule("python", "venv"),
    ImageRule("busybox", "system"),
    ImageRule("seldonio/mlserver", "mlserver"),
    ImageRule("kserve/storage-initializer", "storage-initializer"),
    ImageRule("alpine", "shell"),
)


@dataclass(frozen=True)
class ImageEnvironment:
    """What a mapped image gives a container.

    Attributes:
        name: The environment's name (``venv``, ``system``).
        path: The container's ``PATH`` folders, in order.
        env: Variables the image sets (the container's own ``env`` wins).
        entrypoint: The image's entry point (run when a container names no ``command``).
        cmd: The image's default arguments (when a container names neither ``command`` nor
            ``args``).
    """

    name: str
    path: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    def environment(self) -> dict[str, str]:
        """The image's variables with ``PATH``."""
        return {"PATH": ":".join(self.path), **self.env}


def repository(image: str) -> str:
    """The repository of an image reference, normalised.

    Example:
        >>> repository("docker.io/library/python:3.11-slim")
        'python'
        >>> repository("ghcr.io/kubedl-prefect/ddp-train@sha256:abc")
        'ghcr.io/kubedl-prefect/ddp-train'
        >>> repository("localhost:5000/x:1")
        'localhost:5000/x'
    """
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if name.startswith("library/"):
        name = name[len("library/") :]
    return name


def environments(venv: Path) -> dict[str, ImageEnvironment]:
    """The environments images map to, with the project's virtual environment at ``venv``."""
    from kubedl_prefect.serving.local import server_environment

    mlserver = server_environment()
    return {
        "mlserver": ImageEnvironment(
            "mlserver",
            (str(mlserver / "bin"), *SYSTEM_PATH),
            # MLServer 1.7's inference worker pool dies at start in this Python (uvloop: "no
            # current event loop"); local serving runs without it too (parallel_workers 0).
            {
                "VIRTUAL_ENV": str(mlserver),
                "MLSERVER_MODELS_DIR": MODELS_DIR,
                "MLSERVER_PARALLEL_WORKERS": "0",
            },
            cmd=("/bin/sh", "-c", 'exec mlserver start "$MLSERVER_MODELS_DIR"'),
        ),
        "storage-initializer": ImageEnvironment(
            "storage-initializer",
            (str(venv / "bin"), *SYSTEM_PATH),
            {"VIRTUAL_ENV": str(venv)},
            entrypoint=(str(venv / "bin" / "python"), "-m", STORAGE_INITIALIZER_MODULE),
        ),
        "venv": ImageEnvironment(
            "venv", (str(venv / "bin"), *SYSTEM_PATH), {"VIRTUAL_ENV": str(venv)}
        ),
        "system": ImageEnvironment("system", SYSTEM_PATH),
        "shell": ImageEnvironment("shell", (str(SHIMS), *SYSTEM_PATH)),
    }


def resolve_image(
    image: str, venv: Path, rules: tuple[ImageRule, ...] = IMAGE_MAP
) -> ImageEnvironment | None:
    """The environment ``image`` runs in, or ``None`` when no rule maps it (it cannot be pulled).

    Example:
        >>> from pathlib import Path
        >>> resolve_image("pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime", Path("/v")).path[0]
        '/v/bin'
        >>> resolve_image("nvcr.io/nvidia/pytorch:24.01", Path("/v")) is None
        True
    """
    repo = repository(image)
    known = environments(venv)
    for rule in rules:
        if fnmatch.fnmatchcase(repo, rule.repository):
            return known[rule.environment]
    return None
