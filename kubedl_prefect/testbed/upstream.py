"""Pinned upstream Go modules of the test bed, and where their files are on disk.

The CRDs we install and validate against come from the very module versions the test bed builds,
fetched through the Go module proxy into our own cache (never copied into this repository).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kubedl_prefect.errors import TestbedError


@dataclass(frozen=True)
class GoModule:
    """A Go module at a pinned version."""

    path: str
    version: str


KUBERNETES = GoModule("k8s.io/kubernetes", "v1.34.4")
KWOK = GoModule("sigs.k8s.io/kwok", "v0.8.0")
KUBEDL = GoModule("github.com/alibaba/kubedl", "v0.5.0")
KUBEFLOW_TRAINING = GoModule("github.com/kubeflow/training-operator", "v1.9.4")
VOLCANO = GoModule("volcano.sh/volcano", "v1.14.1")
KSERVE = GoModule("github.com/kserve/kserve", "v0.20.0")
#: Kubeflow Trainer v2 (``trainer.kubeflow.org``): exact versions, the proxy's version lists are
#: stale (they do not list these releases).
TRAINER = GoModule("github.com/kubeflow/trainer/v2", "v2.3.0")
JOBSET = GoModule("sigs.k8s.io/jobset", "v0.12.0")
#: Kueue (``kueue.x-k8s.io``): exact version, the proxy's version list stops at v0.17.0.
KUEUE = GoModule("sigs.k8s.io/kueue", "v0.19.2")


def cache_root() -> Path:
    """Root of everything the test bed builds and keeps (Go caches, binaries, cluster state).

    ``$KUBEDL_PREFECT_CACHE`` if set, else ``$XDG_CACHE_HOME/kubedl-prefect`` (``~/.cache/...``):
    outside any checkout, so fresh clones on the same machine (CI) reuse warm Go builds.
    """
    explicit = os.environ.get("KUBEDL_PREFECT_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser().resolve() / "kubedl-prefect"


def go_env() -> dict[str, str]:
    """Environment for every ``go`` command we run: our own module and build caches."""
    root = cache_root()
    env = dict(os.environ)
    env.setdefault("GOMODCACHE", str(root / "go" / "mod"))
    env.setdefault("GOCACHE", str(root / "go" / "build"))
    env.setdefault("GOFLAGS", "-mod=mod")
    env.setdefault("GOTOOLCHAIN", "local")
    return env


def go_binary() -> str:
    """Path of the ``go`` command, or a :class:`TestbedError` saying how to get one."""
    found = shutil.which("go")
    if found is None:
        raise TestbedError(
            "the test bed builds Kubernetes from Go modules, but no `go` command was found",
            hint="install Go 1.26 (https://go.dev/dl/) and make sure `go` is on PATH",
        )
    return found


def download(query: str, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> Path:
    """Download a module through the Go module proxy (once) and return its extracted folder.

    ``query`` is ``path@version``, or a bare module path run in the folder of a module that
    requires it (``cwd``), which resolves to the version that module's build list selects.
    ``go list -m`` is no substitute: it reports a ``Dir`` only for a module already extracted
    in the module cache, true on a warm machine and false on a fresh one.

    Raises:
        TestbedError: The download failed; the message carries the proxy's own error.
    """
    proc = subprocess.run(
        [go_binary(), "mod", "download", "-json", query],
        cwd=cwd,
        env=go_env() if env is None else env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or not info.get("Dir"):
        where = f" (required by {cwd})" if cwd is not None else ""
        raise TestbedError(
            f"could not download {query}{where}: {info.get('Error') or proc.stderr.strip()}",
            hint="check that the Go module proxy is reachable (GOPROXY) and the version exists",
        )
    return Path(info["Dir"])


@cache
def module_dir(module: GoModule) -> Path:
    """Download ``module`` through the Go module proxy (once) and return its extracted folder.

    A module already extracted in the module cache is taken from there without running ``go``
    (a test bed with built binaries starts without Go).
    """
    extracted = Path(go_env()["GOMODCACHE"]) / f"{escaped_path(module.path)}@{module.version}"
    # Go extracts into the final folder and removes <folder>.partial once it is complete.
    if extracted.is_dir() and not extracted.with_name(extracted.name + ".partial").exists():
        return extracted
    return download(f"{module.path}@{module.version}")


def escaped_path(path: str) -> str:
    """A module path as the module cache spells it: each capital letter as ``!`` + lower case.

    Example:
        >>> escaped_path("github.com/BurntSushi/toml")
        'github.com/!burnt!sushi/toml'
    """
    return "".join(f"!{c.lower()}" if c.isupper() else c for c in path)


def module_file(module: GoModule, relative: str) -> Path:
    """A file inside a downloaded module, e.g. a CRD YAML."""
    path = module_dir(module) / relative
    if not path.is_file():
        raise TestbedError(f"{relative} not found in {module.path}@{module.version}")
    return path
