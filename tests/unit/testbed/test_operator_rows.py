"""The training operators' rows: wrapper modules, command lines, configuration, cluster objects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kubedl_prefect.testbed import operators
from kubedl_prefect.testbed.build import GoBinary
from kubedl_prefect.testbed.components import ComponentContext, Layout, Ports
from kubedl_prefect.testbed.upstream import KUBEDL, KUBEFLOW_TRAINING

CONTROL_PLANE_OFFSETS = {43, 47, 57, 59, 79, 80}


def _go_mod(binary: GoBinary) -> str:
    assert isinstance(binary.module, Path)
    return (binary.module / "go.mod").read_text()


def _requires(go_mod: str) -> dict[str, str]:
    """Module -> version of every ``require`` line (single and block form)."""
    found: dict[str, str] = {}
    in_block = False
    for raw in go_mod.splitlines():
        line = raw.split("//")[0].strip()
        if line.startswith("require ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if line.startswith("require "):
            line = line.removeprefix("require ").strip()
        elif not in_block:
            continue
        parts = line.split()
        if len(parts) == 2:
            found[parts[0]] = parts[1]
    return found


def _replaces(go_mod: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in re.finditer(r"^\s*(\S+)\s+=>\s+(\S+)(?:\s+(\S+))?\s*$", go_mod, re.MULTILINE):
        old, new, version = match.groups()
        found[old] = f"{new} {version}" if version else new
    return found


def _context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ComponentContext:
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path / "cache"))
    layout = Layout(name="unit", ports=Ports(30000))
    return ComponentContext(
        layout=layout, binaries={}, kubeconfig=layout.kubeconfig("some-operator")
    )


WRAPPED = [b for b in operators.OPERATOR_BINARIES if isinstance(b.module, Path)]


def test_only_kserve_builds_from_its_own_module() -> None:
    # KServe's go.mod has replace directives: it is built inside a copy of itself (.kserve).
    assert [b.name for b in operators.OPERATOR_BINARIES if b not in WRAPPED] == ["kserve-manager"]


@pytest.mark.parametrize("binary", WRAPPED, ids=lambda b: b.name)
def test_each_binary_has_a_committed_module_with_its_package_as_a_tool(binary: GoBinary) -> None:
    assert isinstance(binary.module, Path)
    go_mod = _go_mod(binary)
    assert (binary.module / "go.sum").is_file()
    assert re.search(rf"^tool {re.escape(binary.package)}$", go_mod, re.MULTILINE)
    assert "=> ./" not in go_mod  # no local paths
    assert "=> ../" not in go_mod


def test_wrapper_modules_pin_the_upstream_versions() -> None:
    kubedl = _requires(_go_mod(operators.KUBEDL_BINARY))
    kubeflow = _requires(_go_mod(operators.KUBEFLOW_BINARY))
    volcano = _requires(_go_mod(operators.VOLCANO_BINARY))
    assert kubedl[KUBEDL.path] == KUBEDL.version
    assert kubeflow[KUBEFLOW_TRAINING.path] == KUBEFLOW_TRAINING.version
    assert volcano[operators.VOLCANO_SCHEDULER.path] == operators.VOLCANO_SCHEDULER.version


def test_kubedl_keeps_kubernetes_1_22_libraries() -> None:
    replaces = _replaces(_go_mod(operators.KUBEDL_BINARY))
    assert replaces["k8s.io/client-go"] == "k8s.io/client-go v0.22.6"
    assert replaces["k8s.io/kubernetes"] == "k8s.io/kubernetes v1.22.6"
    staging = [m for m in replaces if m.startswith("k8s.io/")]
    assert len(staging) == 30
    # The one deliberate bump: reflect2 < 1.0.2 crashes at run time on Go >= 1.18.
    assert _requires(_go_mod(operators.KUBEDL_BINARY))["github.com/modern-go/reflect2"] == "v1.0.2"


def test_volcano_apis_come_from_the_published_module_not_a_local_path() -> None:
    replaces = _replaces(_go_mod(operators.VOLCANO_BINARY))
    assert replaces["volcano.sh/apis"] == f"volcano.sh/apis {operators.VOLCANO_APIS_VERSION}"
    kube = {v.split()[-1] for k, v in replaces.items() if k.startswith("k8s.io/")}
    assert kube == {"v0.34.1"}  # what volcano.sh/volcano v1.14.1 itself pins


def test_operator_ports_are_loopback_distinct_and_clear_of_the_control_plane() -> None:
    offsets = operators.PORT_OFFSETS
    assert len(set(offsets.values())) == len(offsets)
    assert not set(offsets.values()) & CONTROL_PLANE_OFFSETS
    assert all(0 <= n < 100 for n in offsets.values())


def test_volcano_command_line_and_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(tmp_path, monkeypatch)
    args = operators.volcano_args(ctx)
    assert "--leader-elect=false" in args
    assert f"--scheduler-name={operators.VOLCANO_SCHEDULER_NAME}" in args
    assert (
        f"--healthz-address=127.0.0.1:{30000 + operators.PORT_OFFSETS['volcano-healthz']}" in args
    )
    conf_arg = next(a for a in args if a.startswith("--scheduler-conf="))
    conf = yaml.safe_load(Path(conf_arg.split("=", 1)[1]).read_text())
    assert [a.strip() for a in conf["actions"].split(",")] == ["enqueue", "allocate", "backfill"]
    plugins = {p["name"] for tier in conf["tiers"] for p in tier["plugins"]}
    assert {"gang", "predicates", "proportion", "nodeorder"} <= plugins
    assert "overcommit" not in plugins
    health = operators.volcano_health(ctx.layout)
    assert (
        health.url
        == f"http://127.0.0.1:{30000 + operators.PORT_OFFSETS['volcano-healthz']}/healthz"
    )


def test_kubedl_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = operators.kubedl_args(_context(tmp_path, monkeypatch))
    assert "--workloads=PyTorchJob,TFJob,MPIJob,XGBoostJob" in args
    assert "--gang-scheduler-name=volcano" in args
    assert "--enable-leader-election=false" in args
    assert "--feature-gates=DAGScheduling=false,JobCoordinator=false" in args
    assert f"--max-reconciles={operators.KUBEDL_MAX_RECONCILES}" in args
    assert not any(a.startswith("--kubeconfig") for a in args)  # pflag only: $KUBECONFIG
    metrics = f"127.0.0.1:{30000 + operators.PORT_OFFSETS['kubedl-controller-metrics']}"
    assert f"--controller-metrics-addr={metrics}" in args


def test_kubeflow_command_line_writes_its_webhook_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(tmp_path, monkeypatch)
    ctx.serving_cert.parent.mkdir(parents=True)
    ctx.serving_cert.write_text("certificate")
    ctx.serving_key.write_text("key")
    cert_dir = tmp_path / "webhook-certs"
    monkeypatch.setattr(operators, "KUBEFLOW_WEBHOOK_CERT_DIR", cert_dir)
    args = operators.kubeflow_args(ctx)
    assert (cert_dir / "tls.crt").read_text() == "certificate"
    assert (cert_dir / "tls.key").read_text() == "key"
    assert [a for a in args if a.startswith("--enable-scheme=")] == [
        f"--enable-scheme={s}" for s in ("pytorchjob", "tfjob", "mpijob", "xgboostjob")
    ]
    assert "--leader-elect=false" in args
    assert "--gang-scheduler-name=volcano" in args
    assert f"--kubeconfig={ctx.kubeconfig}" in args
    probe = 30000 + operators.PORT_OFFSETS["kubeflow-probe"]
    assert f"--health-probe-bind-address=127.0.0.1:{probe}" in args
    assert operators.kubeflow_health(ctx.layout).url == f"http://127.0.0.1:{probe}/readyz"


def test_components_run_the_operator_binaries_with_their_own_identities() -> None:
    names = {b.name for b in operators.OPERATOR_BINARIES}
    components = operators.OPERATOR_COMPONENTS
    assert components[0].name == "volcano-scheduler"  # gangs need it from the start
    assert {c.binary for c in components} == names
    users = [c.identity.user for c in components if c.identity is not None]
    assert len(set(users)) == len(components)
    for component in components:
        assert component.identity is not None
        assert "system:masters" not in component.identity.groups


def test_operator_manifests_bind_each_identity_to_a_role() -> None:
    manifests = operators.operator_manifests()
    queues = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Queue"}
    assert set(queues) == {"root", "default"}
    assert all(q["status"] == {"state": "Open"} for q in queues.values())
    assert manifests[0]["kind"] == "Queue"  # opened before the scheduler starts
    bindings = {
        m["subjects"][0]["name"]: m["roleRef"]["name"]
        for m in manifests
        if m["kind"] == "ClusterRoleBinding"
    }
    assert bindings[operators.VOLCANO_IDENTITY.user] == "cluster-admin"
    roles = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "ClusterRole"}
    for identity in (operators.KUBEDL_IDENTITY, operators.KUBEFLOW_IDENTITY):
        rules = roles[bindings[identity.user]]["rules"]
        podgroups = [r for r in rules if "podgroups" in r.get("resources", [])]
        assert any("scheduling.volcano.sh" in r["apiGroups"] for r in podgroups)
        assert any("pods" in r.get("resources", []) for r in rules)
    secret = next(m for m in manifests if m["kind"] == "Secret")
    assert secret["metadata"] == {
        "name": operators.KUBEFLOW_WEBHOOK_SECRET,
        "namespace": operators.OPERATOR_NAMESPACE,
    }
