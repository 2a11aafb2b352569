"""Build the test bed's Go binaries from our small wrapper modules, once per change of inputs.

Each binary is one row of a table (:class:`GoBinary`): the wrapper module folder (with its committed
``go.mod``/``go.sum``), the package to build, the binary name and its ``-ldflags``. A binary
lands in ``cache_root()/bin/<name>-<hash>`` where the hash covers everything that can change the
result (go.mod, go.sum, the module's own ``.go`` files for its own packages, the Go version,
flags, source patches); it is rebuilt only when that hash changes.

A row may also name an upstream :class:`~kubedl_prefect.testbed.upstream.GoModule` instead of a
wrapper folder: a module that is itself a main module with ``replace``/``exclude`` directives
(KServe's), which ``go install`` refuses and no wrapper can inherit. It is built inside a writable
copy of its own source (its ``.go`` files, ``go.mod`` and ``go.sum``), taken from the Go module
cache into ``cache_root()/src/<name>/`` at each build; the hash then covers the module's path and
version (immutable once published) instead of wrapper files.

A row may carry :class:`SourcePatch` edits of a pinned dependency's files (an upstream listen
address hard-coded to every interface, say): the patched modules are copied outside the module
cache and the repository, patched there and swapped in by ``go build -modfile`` (a copy of the
wrapper's go.mod with a ``replace`` line per patched module): the module cache stays pristine and
no upstream file is copied into this repository. A patch whose text is not found exactly once
fails the build.

Builds are CPU- and memory-heavy (the API server takes minutes on two cores), so they run one at a
time under a file lock that also keeps concurrent processes (CI, a second shell) from building the
same binary twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed.upstream import (
    GoModule,
    cache_root,
    download,
    go_binary,
    go_env,
    module_dir,
)

#: Folder holding the wrapper modules shipped with the package (``go/<module>/go.mod``).
GO_ROOT = Path(__file__).resolve().parent / "go"

#: How many log lines a failed build shows in its error.
_LOG_TAIL_LINES = 40

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourcePatch:
    """A textual edit of one file of a dependency, applied at build time (see the module docs).

    Attributes:
        module: Module path of the dependency (``github.com/alibaba/kubedl``), resolved to the
            version the wrapper module pins.
        file: The file, relative to the module's root (``pkg/metrics/monitor.go``).
        old: Text that must occur exactly once in the file.
        new: What replaces it.
        reason: Why the patch exists (kept in the build log).
    """

    module: str
    file: str
    old: str
    new: str
    reason: str


@dataclass(frozen=True)
class GoBinary:
    """One binary the test bed builds.

    Attributes:
        name: File name of the binary (``kube-apiserver-etcd``); unique across the table.
        module: Folder of the wrapper module holding ``go.mod`` (usually ``GO_ROOT / "kube"``),
            or an upstream module built inside a writable copy of itself (see the module docs).
        package: Package to build, relative (``./cmd/x``) or a full import path from a dependency
            listed in the module's ``tool`` block (``k8s.io/kubernetes/cmd/kube-scheduler``).
        ldflags: Extra ``-ldflags`` items, e.g. ``-X`` version stamps (``-s -w`` are always added).
        tags: Go build tags.
        env: Extra environment variables for ``go build`` (``CGO_ENABLED``...).
        patches: Edits of dependencies' files applied to this build only (for an upstream
            module: edits of its own files, applied to the copy).
    """

    name: str
    module: Path | GoModule
    package: str
    ldflags: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=())
    patches: tuple[SourcePatch, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.module, GoModule):
            foreign = sorted({p.module for p in self.patches} - {self.module.path})
            if foreign:
                raise TestbedError(
                    f"{self.name} builds {self.module.path} from its own source: it can only "
                    f"patch that module's files, not {', '.join(foreign)}"
                )


def kube_version_ldflags(
    version: str, package: str = "k8s.io/component-base/version"
) -> tuple[str, ...]:
    """``-X`` flags stamping a Kubernetes-style version (``v1.34.4``) into ``package``.

    Without them the binaries report ``v0.0.0-master`` and clients that compare versions complain.
    """
    major, minor = version.lstrip("v").split(".")[:2]
    return (
        f"-X {package}.gitVersion={version}",
        f"-X {package}.gitMajor={major}",
        f"-X {package}.gitMinor={minor}",
        f"-X {package}.gitTreeState=clean",
    )


@cache
def go_version() -> str:
    """Version of the ``go`` command in PATH (``go1.26.8``)."""
    proc = subprocess.run(
        [go_binary(), "env", "GOVERSION"],
        env=go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise TestbedError(f"`go env GOVERSION` failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _go_minor(version: str) -> int:
    try:
        return int(version.removeprefix("go").split(".")[1])
    except (IndexError, ValueError):
        return 0


def build_env(binary: GoBinary) -> dict[str, str]:
    """The environment ``go build`` runs with for ``binary``."""
    env = go_env()
    env.update(dict(binary.env))
    if _go_minor(go_version()) >= 27:
        # Go 1.27 switches encoding/json to the v2 engine, with which kube-openapi serves broken
        # OpenAPI documents; keep the old engine until the pinned Kubernetes copes with it.
        experiments = [e for e in env.get("GOEXPERIMENT", "").split(",") if e]
        if "nojsonv2" not in experiments:
            env["GOEXPERIMENT"] = ",".join([*experiments, "nojsonv2"])
    return env


def inputs_hash(binary: GoBinary) -> str:
    """Hash of everything that determines the built binary (12 hex digits)."""
    digest = hashlib.sha256()
    env = build_env(binary)
    meta = {
        "name": binary.name,
        "package": binary.package,
        "ldflags": binary.ldflags,
        "tags": binary.tags,
        "env": binary.env,
        "go": go_version(),
        "goexperiment": env.get("GOEXPERIMENT", ""),
        "patches": [[p.module, p.file, p.old, p.new] for p in binary.patches],
    }
    if isinstance(binary.module, GoModule):
        # A published module version never changes: its path and version are its content.
        meta["upstream"] = f"{binary.module.path}@{binary.module.version}"
    digest.update(json.dumps(meta, sort_keys=True).encode())
    if isinstance(binary.module, Path):
        for path in _module_inputs(binary.module, with_sources=binary.package.startswith(".")):
            digest.update(path.relative_to(binary.module).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def source_copy_dir(binary: GoBinary) -> Path:
    """Where an upstream module's binary is built: a writable copy of its source."""
    return cache_root() / "src" / binary.name


def _copy_upstream(binary: GoBinary, module: GoModule) -> Path:
    """A fresh writable copy of ``module``'s Go sources with ``binary``'s patches applied.

    Only what ``go build`` reads is copied (``.go`` files, ``go.mod``, ``go.sum``): KServe's
    module is 440 MB, mostly manifests, docs and Python.
    """
    source = module_dir(module)
    target = source_copy_dir(binary)
    _remove_tree(target)

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {
            name
            for name in names
            if not (Path(folder) / name).is_dir()
            and not name.endswith(".go")
            and name not in ("go.mod", "go.sum")
        }

    shutil.copytree(source, target, ignore=ignore, copy_function=shutil.copyfile)
    for folder_path in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        folder_path.chmod(0o755)
    for patch in binary.patches:
        path = target / patch.file
        path.chmod(0o644)
        path.write_text(apply_patch(path.read_text(encoding="utf-8"), patch), encoding="utf-8")
    return target


def _module_inputs(module: Path, *, with_sources: bool) -> list[Path]:
    # A package of the module itself (``./cmd/x``) depends on the module's own .go files; a
    # package from a dependency (a ``tool``) only on go.mod/go.sum.
    if not (module / "go.mod").is_file():
        raise TestbedError(f"no go.mod in {module}")
    files = [module / "go.mod"]
    if (module / "go.sum").is_file():
        files.append(module / "go.sum")
    if with_sources:
        files += sorted(p for p in module.rglob("*.go") if p.is_file())
    return files


def bin_dir() -> Path:
    """Folder of the built binaries."""
    return cache_root() / "bin"


def binary_path(binary: GoBinary) -> Path:
    """Where ``binary`` is (or will be) once built for the current inputs.

    Without a ``go`` command on PATH the inputs cannot be hashed (the Go version is one of
    them): the binary built last under this name is used as it is, if there is one
    (:func:`last_built`), so that a machine with built binaries starts without Go.
    """
    if shutil.which("go") is None:
        found = last_built(binary)
        if found is not None:
            if binary.name not in _UNCHECKED:
                _UNCHECKED.add(binary.name)
                logger.warning(
                    "no `go` on PATH: using %s as built, without checking it is up to date", found
                )
            return found
    return bin_dir() / f"{binary.name}-{inputs_hash(binary)}"


_UNCHECKED: set[str] = set()


def last_built(binary: GoBinary) -> Path | None:
    """The binary last built under ``binary``'s name, if it is still there (found without Go).

    The one ``build-times.json`` records, else the only ``<name>-<12 hex>`` file of the
    binaries folder (a build removes the older ones).
    """
    times = bin_dir() / "build-times.json"
    try:
        recorded = json.loads(times.read_text()).get(binary.name, {}).get("binary")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, str) and (bin_dir() / recorded).is_file():
        return bin_dir() / recorded
    found = [
        path
        for path in bin_dir().glob(f"{binary.name}-*")
        if _is_hash(path.name[len(binary.name) + 1 :]) and path.is_file()
    ]
    return found[0] if len(found) == 1 else None


def _is_hash(suffix: str) -> bool:
    return len(suffix) == 12 and all(c in "0123456789abcdef" for c in suffix)


def build_log_path(binary: GoBinary) -> Path:
    """Log file of the latest build of ``binary``."""
    return cache_root() / "logs" / f"build-{binary.name}.log"


def is_built(binary: GoBinary) -> bool:
    """Whether ``binary`` is built for its current inputs."""
    return binary_path(binary).is_file()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(
    binary: GoBinary,
    *,
    parallelism: int = 2,
    on_start: Callable[[GoBinary], None] | None = None,
) -> Path:
    """Build ``binary`` unless it is already built for its current inputs; return its path.

    Args:
        binary: The table row to build.
        parallelism: ``go build -p``: how many packages compile at once.
        on_start: Called before a real build starts (not when the binary is up to date), e.g. to
            tell the user that a slow cold build is under way.

    Raises:
        TestbedError: Go is missing or the build failed (the message ends with the log's tail).
    """
    target = binary_path(binary)
    if target.is_file():
        return target
    # One build at a time on this machine: each one takes both cores and up to ~2 GB to link.
    with _locked(bin_dir() / ".build.lock"):
        if target.is_file():  # built by another process while we waited
            return target
        if on_start is not None:
            on_start(binary)
        log_path = build_log_path(binary)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        command = [go_binary(), "build", "-p", str(parallelism), "-trimpath", "-o", str(partial)]
        command += ["-ldflags", " ".join(("-s", "-w", *binary.ldflags))]
        if binary.tags:
            command += ["-tags", ",".join(binary.tags)]
        command.append(binary.package)
        started = time.monotonic()
        with log_path.open("w") as log:
            if isinstance(binary.module, GoModule):
                folder = _copy_upstream(binary, binary.module)
            else:
                folder = binary.module
                if binary.patches:
                    command[-1:-1] = [
                        "-modfile",
                        str(write_patched_modfile(binary, bin_dir() / "patched")),
                    ]
            for patch in binary.patches:
                log.write(f"# patched {patch.module}/{patch.file}: {patch.reason}\n")
            log.write(f"$ (cd {folder} && {' '.join(command)})\n")
            log.flush()
            proc = subprocess.run(
                command,
                cwd=folder,
                env=build_env(binary),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            partial.unlink(missing_ok=True)
            raise TestbedError(
                f"building {binary.name} failed (exit {proc.returncode}); "
                f"last lines of {log_path}:\n{_tail(log_path)}",
                hint="fix the wrapper module's go.mod, or remove the Go caches under "
                f"{cache_root() / 'go'} if they are corrupt",
            )
        os.replace(partial, target)
        _record_build_time(binary, target, elapsed)
        _remove_stale(binary, keep=target)
        return target


def apply_patch(text: str, patch: SourcePatch) -> str:
    """``text`` with ``patch`` applied.

    Raises:
        TestbedError: ``patch.old`` does not occur exactly once (the pinned version changed).
    """
    count = text.count(patch.old)
    if count != 1:
        raise TestbedError(
            f"source patch of {patch.module}/{patch.file} expects its text once, found it "
            f"{count} times: {patch.old!r}",
            hint="the pinned version changed: update the patch in the binaries table",
        )
    return text.replace(patch.old, patch.new)


def _wrapper_dir(binary: GoBinary) -> Path:
    if not isinstance(binary.module, Path):
        raise TestbedError(f"{binary.name} is built from upstream source, not a wrapper module")
    return binary.module


def patched_module_dir(binary: GoBinary, module: str) -> Path:
    """The source folder of ``module`` as ``binary``'s wrapper resolves it.

    A module replaced by a local folder is that folder; any other is downloaded at the version
    the wrapper pins when its source is not extracted yet (a fresh machine), with the build's
    own environment, so the folder is the one ``go build`` would read.
    """
    wrapper, env = _wrapper_dir(binary), build_env(binary)
    proc = subprocess.run(
        [go_binary(), "list", "-m", "-json", module],
        cwd=wrapper,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0 and (folder := json.loads(proc.stdout).get("Dir")):
        return Path(folder)
    return download(module, cwd=wrapper, env=env)


def write_patched_modfile(binary: GoBinary, folder: Path) -> Path:
    """Copy and patch the modules ``binary`` patches; return a ``go.mod`` that points at them.

    Go refuses ``-overlay`` replacements of files in the module cache, so each patched module is
    copied under ``folder`` (outside the cache and the repository) and a copy of the wrapper's
    ``go.mod`` gains one ``replace`` line per patched module, for ``go build -modfile``.
    """
    wrapper = _wrapper_dir(binary)
    root = folder / f"patched-{binary.name}"
    _remove_tree(root)
    modules = sorted({p.module for p in binary.patches})
    # A replace the wrapper already has for a patched module gives way to the patched copy.
    lines = [
        line
        for line in (wrapper / "go.mod").read_text(encoding="utf-8").splitlines()
        if not any(line.strip().startswith(f"replace {m} ") for m in modules)
    ]
    lines.append("")
    for module in modules:
        copy = root / module.replace("/", "_")
        shutil.copytree(patched_module_dir(binary, module), copy, copy_function=shutil.copyfile)
        for folder_path in [copy, *(p for p in copy.rglob("*") if p.is_dir())]:
            folder_path.chmod(0o755)
        for patch in (p for p in binary.patches if p.module == module):
            target = copy / patch.file
            target.write_text(apply_patch(target.read_text(encoding="utf-8"), patch))
        lines.append(f"replace {module} => {copy}")
    modfile = root / "go.mod"
    modfile.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if (wrapper / "go.sum").is_file():
        shutil.copyfile(wrapper / "go.sum", root / "go.sum")
    return modfile


def _remove_tree(path: Path) -> None:
    if path.exists():
        for folder in [path, *(p for p in path.rglob("*") if p.is_dir())]:
            folder.chmod(0o755)
        shutil.rmtree(path)


def build_all(
    binaries: Sequence[GoBinary],
    *,
    on_start: Callable[[GoBinary], None] | None = None,
) -> dict[str, Path]:
    """Build every binary of the table, one after the other; return ``{name: path}``."""
    names = [b.name for b in binaries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TestbedError(f"binary names must be unique, duplicated: {', '.join(duplicates)}")
    return {b.name: build(b, on_start=on_start) for b in binaries}


def build_times() -> dict[str, float]:
    """Seconds the latest real build of each binary took, as recorded in the binaries folder."""
    path = bin_dir() / "build-times.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {name: float(entry["seconds"]) for name, entry in data.items()}


def _record_build_time(binary: GoBinary, target: Path, seconds: float) -> None:
    path = bin_dir() / "build-times.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[binary.name] = {"seconds": round(seconds, 1), "binary": target.name}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _remove_stale(binary: GoBinary, *, keep: Path) -> None:
    for old in bin_dir().glob(f"{binary.name}-*"):
        if old != keep and _is_hash(old.name[len(binary.name) + 1 :]):
            old.unlink(missing_ok=True)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])
