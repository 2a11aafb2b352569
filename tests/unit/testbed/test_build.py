"""Building binaries from wrapper modules: cached by input hash, rebuilt on change, loud failure."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import build
from kubedl_prefect.testbed.build import GoBinary, SourcePatch
from kubedl_prefect.testbed.upstream import GoModule


def _module(root: Path, body: str = "func main() {}\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "go.mod").write_text("module example.local/hello\n\ngo 1.24\n")
    (root / "main.go").write_text(f"package main\n\n{body}")
    return root


def test_kube_version_ldflags_stamp_the_version() -> None:
    flags = build.kube_version_ldflags("v1.34.4")
    assert "-X k8s.io/component-base/version.gitVersion=v1.34.4" in flags
    assert "-X k8s.io/component-base/version.gitMajor=1" in flags
    assert "-X k8s.io/component-base/version.gitMinor=34" in flags


def test_hash_follows_every_input(cache: Path, tmp_path: Path) -> None:
    module = _module(tmp_path / "m")
    binary = GoBinary("hello", module, ".")
    first = build.inputs_hash(binary)
    assert build.inputs_hash(binary) == first
    assert build.inputs_hash(GoBinary("hello", module, ".", ldflags=("-X a.b=c",))) != first
    (module / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert build.inputs_hash(binary) != first
    assert build.binary_path(binary).parent == cache / "bin"
    assert build.binary_path(binary).name == f"hello-{build.inputs_hash(binary)}"


def test_tool_from_a_dependency_ignores_the_module_sources(cache: Path, tmp_path: Path) -> None:
    module = _module(tmp_path / "m")
    tool = GoBinary("tool", module, "example.org/some/cmd/tool")
    before = build.inputs_hash(tool)
    (module / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert build.inputs_hash(tool) == before
    (module / "go.mod").write_text("module example.local/hello\n\ngo 1.25\n")
    assert build.inputs_hash(tool) != before


def test_builds_once_then_reuses_and_replaces_stale(cache: Path, tmp_path: Path) -> None:
    module = _module(tmp_path / "m")
    binary = GoBinary("hello", module, ".")
    started: list[str] = []
    path = build.build(binary, on_start=lambda b: started.append(b.name))
    assert started == ["hello"]
    assert subprocess.run([path], check=False).returncode == 0
    mtime = path.stat().st_mtime_ns

    assert build.build(binary, on_start=lambda b: started.append(b.name)) == path
    assert started == ["hello"]  # no second build
    assert path.stat().st_mtime_ns == mtime
    assert build.is_built(binary)
    assert "hello" in build.build_times()

    _module(module, "func main() { println() }\n")
    newer = build.build(binary)
    assert newer != path
    assert newer.is_file()
    assert not path.exists()  # the stale build is removed


def test_failed_build_raises_with_the_log_tail(cache: Path, tmp_path: Path) -> None:
    module = _module(tmp_path / "m", "func main() { undefinedThing() }\n")
    binary = GoBinary("broken", module, ".")
    with pytest.raises(TestbedError) as caught:
        build.build(binary)
    assert "undefinedThing" in str(caught.value)
    assert build.build_log_path(binary).is_file()
    assert not build.is_built(binary)


def test_duplicate_names_are_refused(cache: Path, tmp_path: Path) -> None:
    module = _module(tmp_path / "m")
    with pytest.raises(TestbedError, match="duplicated: x"):
        build.build_all([GoBinary("x", module, "."), GoBinary("x", module, "./y")])


def test_missing_go_mod_is_reported(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match=r"no go\.mod"):
        build.inputs_hash(GoBinary("x", tmp_path, "."))


def test_go_1_27_keeps_the_json_v1_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binary = GoBinary("x", _module(tmp_path / "m"), ".")
    monkeypatch.setattr(build, "go_version", lambda: "go1.27.1")
    monkeypatch.setenv("GOEXPERIMENT", "greenteagc")
    assert build.build_env(binary)["GOEXPERIMENT"] == "greenteagc,nojsonv2"
    monkeypatch.setattr(build, "go_version", lambda: "go1.26.8")
    assert build.build_env(binary)["GOEXPERIMENT"] == "greenteagc"


def test_the_shipped_wrapper_modules_are_complete() -> None:
    from kubedl_prefect.testbed.testbed import CONTROL_PLANE_BINARIES

    for binary in CONTROL_PLANE_BINARIES:
        go_mod = (binary.module / "go.mod").read_text()
        assert (binary.module / "go.sum").is_file(), binary.module
        if not binary.package.startswith("."):
            assert binary.package in go_mod, f"{binary.package} missing from the tool block"


def _patched_pair(tmp_path: Path) -> tuple[GoBinary, build.SourcePatch]:
    dep = tmp_path / "dep"
    dep.mkdir()
    (dep / "go.mod").write_text("module example.local/dep\n\ngo 1.24\n")
    (dep / "dep.go").write_text('package dep\n\nfunc Where() string { return ":9443" }\n')
    module = _module(
        tmp_path / "m",
        'import "example.local/dep"\n\nfunc main() { println(dep.Where()) }\n',
    )
    (module / "go.mod").write_text(
        "module example.local/hello\n\ngo 1.24\n\nrequire example.local/dep v0.0.0\n\n"
        f"replace example.local/dep => {dep}\n"
    )
    patch = build.SourcePatch(
        module="example.local/dep",
        file="dep.go",
        old='":9443"',
        new='"127.0.0.1:9443"',
        reason="loopback only",
    )
    return GoBinary("patched", module, ".", patches=(patch,)), patch


def test_a_source_patch_changes_the_build_not_the_dependency(cache: Path, tmp_path: Path) -> None:
    binary, _ = _patched_pair(tmp_path)
    unpatched = GoBinary("patched", binary.module, ".")
    assert build.inputs_hash(binary) != build.inputs_hash(unpatched)
    path = build.build(binary)
    ran = subprocess.run([path], capture_output=True, text=True, check=True)
    assert ran.stderr.strip() == "127.0.0.1:9443"
    assert '":9443"' in (tmp_path / "dep" / "dep.go").read_text()  # the original is untouched
    log = build.build_log_path(binary).read_text()
    assert "# patched example.local/dep/dep.go: loopback only" in log
    assert "-modfile" in log


def test_a_source_patch_that_no_longer_applies_fails_loudly(cache: Path, tmp_path: Path) -> None:
    binary, patch = _patched_pair(tmp_path)
    stale = build.SourcePatch(patch.module, patch.file, '":8080"', '"x"', "gone upstream")
    with pytest.raises(TestbedError, match="expects its text once, found it 0 times"):
        build.build(GoBinary("patched", binary.module, ".", patches=(stale,)))
    with pytest.raises(TestbedError, match="found it 2 times"):
        build.apply_patch("a a", build.SourcePatch("m", "f", "a", "c", "r"))
    assert build.apply_patch("a b", build.SourcePatch("m", "f", "a", "c", "r")) == "c b"


def test_an_upstream_module_is_built_inside_a_patched_copy_of_itself(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A published module with replace directives is built from its own source (KServe's case):
    # only what go build reads is copied, patched there; the module cache stays untouched.
    source = _module(tmp_path / "upstream", 'func main() { println("0.0.0.0") }\n')
    (source / "docs").mkdir()
    (source / "docs" / "big.md").write_text("not Go\n")
    module = GoModule("example.org/upstream", "v1.2.3")
    monkeypatch.setattr(build, "module_dir", lambda m: source if m == module else None)
    binary = GoBinary(
        "upstream-tool",
        module,
        ".",
        env=(("CGO_ENABLED", "0"),),
        patches=(SourcePatch(module.path, "main.go", "0.0.0.0", "127.0.0.1", "loopback"),),
    )
    path = build.build(binary)
    ran = subprocess.run([path], capture_output=True, text=True, check=False)
    assert ran.stderr.strip() == "127.0.0.1"
    copy = build.source_copy_dir(binary)
    assert copy.is_relative_to(cache)
    assert sorted(p.name for p in copy.rglob("*") if p.is_file()) == ["go.mod", "main.go"]
    assert "0.0.0.0" in (source / "main.go").read_text()
    log = build.build_log_path(binary).read_text()
    assert "# patched example.org/upstream/main.go: loopback" in log
    # Its version is its content: another version is another binary.
    other = GoBinary("upstream-tool", GoModule(module.path, "v1.2.4"), ".")
    assert build.inputs_hash(other) != build.inputs_hash(binary)


def _every_binary() -> list[GoBinary]:
    from kubedl_prefect.testbed.controlplane import CONTROL_PLANE_BINARIES
    from kubedl_prefect.testbed.operators import OPERATOR_BINARIES

    return [*CONTROL_PLANE_BINARIES, *OPERATOR_BINARIES]


def test_patched_modules_are_fetched_on_a_fresh_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A fresh machine has an empty module cache: the folder of every module a wrapper's
    # SourcePatch names must be downloaded, not assumed extracted (issue 15: `go list -m` gives
    # no Dir there). Only those modules are fetched (their go.mod graph and zips), nothing built.
    modcache = tmp_path / "gomodcache"
    monkeypatch.setenv("GOMODCACHE", str(modcache))
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path / "cache"))
    patched = [b for b in _every_binary() if isinstance(b.module, Path) and b.patches]
    assert patched, "no wrapper module patches a dependency any more: drop this test"
    for binary in patched:
        modfile = build.write_patched_modfile(binary, tmp_path / "patched")
        for patch in binary.patches:
            source = build.patched_module_dir(binary, patch.module)
            assert source.is_relative_to(modcache), source
            assert patch.old in (source / patch.file).read_text(encoding="utf-8")
            copy = modfile.parent / patch.module.replace("/", "_")
            assert f"replace {patch.module} => {copy}" in modfile.read_text(encoding="utf-8")
            assert patch.new in (copy / patch.file).read_text(encoding="utf-8")
    # The module cache is read-only once written; let pytest's tmp_path clean-up remove it.
    for path in [modcache, *(p for p in modcache.rglob("*") if p.is_dir())]:
        path.chmod(0o755)


def test_a_module_the_proxy_does_not_have_fails_with_its_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kubedl_prefect.testbed.upstream import download

    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "gomodcache"))
    monkeypatch.setenv("GOPROXY", "off")
    with pytest.raises(
        TestbedError, match=r"could not download example\.org/none@v1\.0\.0: .*GOPROXY=off"
    ):
        download("example.org/none@v1.0.0")
