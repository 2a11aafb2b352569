"""Pod Security Standards: Baseline breakers refused without `podSecurity: privileged`,
Restricted breakers warned about, each with its field path, line, level and fix."""

from __future__ import annotations

from typing import Any

import pytest
from spec_helpers import EXAMPLES, GOLDEN, minimal

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    PodSecurityLevel,
    dump_manifests,
    dump_spec,
    load_spec,
    loads_spec,
    loads_spec_with_warnings,
    parse_spec,
    pod_security_findings,
    pod_security_warnings,
    render,
    spec_hash,
)

BASELINE = PodSecurityLevel.BASELINE
RESTRICTED = PodSecurityLevel.RESTRICTED


def container(**fields: Any) -> dict[str, Any]:
    """A pod template whose training container (``pytorch``) has these fields."""
    return {"spec": {"containers": [{"name": "pytorch", **fields}]}}


# (spec fields, the path of the finding, words of its problem)
BASELINE_BREAKERS = [
    (
        {"podTemplate": container(securityContext={"privileged": True})},
        "podTemplate.spec.containers[0].securityContext.privileged",
        "every capability",
    ),
    ({"podTemplate": {"spec": {"hostPID": True}}}, "podTemplate.spec.hostPID", "every process"),
    ({"podTemplate": {"spec": {"hostIPC": True}}}, "podTemplate.spec.hostIPC", "IPC namespace"),
    (
        {"podTemplate": {"spec": {"hostNetwork": True}}},
        "podTemplate.spec.hostNetwork",
        "network namespace",
    ),
    ({"network": {"hostNetwork": True}}, "network.hostNetwork", "network namespace"),
    (
        {"volumes": [{"name": "root", "mountPath": "/host", "hostPath": {"path": "/"}}]},
        "volumes[0].hostPath",
        "the node's whole filesystem",
    ),
    (
        {
            "podTemplate": {
                "spec": {
                    "volumes": [{"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}]
                }
            }
        },
        "podTemplate.spec.volumes[0].hostPath",
        "/var/run/docker.sock",
    ),
    (
        {
            "replicas": {
                "master": 1,
                "worker": {
                    "count": 2,
                    "podTemplate": container(
                        securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}
                    ),
                },
            }
        },
        "replicas.worker.podTemplate.spec.containers[0].securityContext.capabilities.add[1]",
        "SYS_ADMIN",
    ),
    ({"ports": [{"containerPort": 8080, "hostPort": 8080}]}, "ports[0].hostPort", "hostPort 8080"),
    (
        {
            "podTemplate": {
                "spec": {
                    "initContainers": [
                        {
                            "name": "init",
                            "image": "busybox",
                            "ports": [{"containerPort": 1, "hostPort": 2}],
                        }
                    ]
                }
            }
        },
        "podTemplate.spec.initContainers[0].ports[0].hostPort",
        "hostPort 2",
    ),
    (
        {"podTemplate": {"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}}},
        "podTemplate.spec.securityContext.seccompProfile.type",
        "system-call filtering off",
    ),
    (
        {"podTemplate": container(securityContext={"appArmorProfile": {"type": "Unconfined"}})},
        "podTemplate.spec.containers[0].securityContext.appArmorProfile.type",
        "AppArmor",
    ),
    (
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/pytorch": "unconfined"}},
        "annotations['container.apparmor.security.beta.kubernetes.io/pytorch']",
        "'unconfined'",
    ),
    (
        {"podTemplate": container(securityContext={"seLinuxOptions": {"type": "spc_t"}})},
        "podTemplate.spec.containers[0].securityContext.seLinuxOptions.type",
        "'spc_t'",
    ),
    (
        {"podTemplate": container(securityContext={"procMount": "Unmasked"})},
        "podTemplate.spec.containers[0].securityContext.procMount",
        "/proc",
    ),
    (
        {
            "podTemplate": {
                "spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}
            }
        },
        "podTemplate.spec.securityContext.sysctls[0].name",
        "kernel.msgmax",
    ),
    (
        {"podTemplate": container(securityContext={"windowsOptions": {"hostProcess": True}})},
        "podTemplate.spec.containers[0].securityContext.windowsOptions.hostProcess",
        "Windows node",
    ),
    (
        {"podTemplate": container(livenessProbe={"httpGet": {"host": "10.0.0.1", "port": 80}})},
        "podTemplate.spec.containers[0].livenessProbe.httpGet.host",
        "'10.0.0.1'",
    ),
]

RESTRICTED_BREAKERS = [
    (
        {"podTemplate": {"spec": {"securityContext": {"runAsUser": 0}}}},
        "podTemplate.spec.securityContext.runAsUser",
        "runAsUser: 0 runs the containers as root",
    ),
    (
        {
            "replicas": {
                "master": 1,
                "worker": {"count": 2, "podTemplate": container(securityContext={"runAsUser": 0})},
            }
        },
        "replicas.worker.podTemplate.spec.containers[0].securityContext.runAsUser",
        "runAsUser: 0 runs the container as root",
    ),
    (
        {"podTemplate": container(securityContext={"runAsNonRoot": False})},
        "podTemplate.spec.containers[0].securityContext.runAsNonRoot",
        "run as root",
    ),
    (
        {"podTemplate": container(securityContext={"allowPrivilegeEscalation": True})},
        "podTemplate.spec.containers[0].securityContext.allowPrivilegeEscalation",
        "more privileges than its parent",
    ),
    (
        {"podTemplate": container(securityContext={"capabilities": {"add": ["CHOWN"]}})},
        "podTemplate.spec.containers[0].securityContext.capabilities.add[0]",
        "capability CHOWN",
    ),
    (
        {
            "podTemplate": {
                "spec": {"volumes": [{"name": "data", "nfs": {"server": "nfs", "path": "/x"}}]}
            }
        },
        "podTemplate.spec.volumes[0].nfs",
        "nfs volume",
    ),
]


@pytest.mark.parametrize(("fields", "path", "words"), BASELINE_BREAKERS)
def test_settings_that_break_baseline_are_refused_without_the_opt_in(
    fields: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(**fields))
    (issue,) = [i for i in info.value.issues if i.path == path]
    assert words in issue.problem
    assert "which the Baseline Pod Security level forbids" in issue.problem
    assert "podSecurity: privileged" in issue.fix


@pytest.mark.parametrize(("fields", "path", "words"), BASELINE_BREAKERS)
def test_the_opt_in_allows_them_with_a_warning(
    fields: dict[str, Any], path: str, words: str
) -> None:
    spec = parse_spec(minimal(**fields, podSecurity="privileged"))
    (warning,) = [w for w in pod_security_warnings(spec) if w.path == path]
    assert warning.level is BASELINE
    assert warning.allowed
    assert words in str(warning)
    assert "podSecurity: privileged allows it" in str(warning)
    assert spec == loads_spec(dump_spec(spec))  # the opt-in survives a dump


@pytest.mark.parametrize(("fields", "path", "words"), RESTRICTED_BREAKERS)
def test_settings_that_break_only_restricted_are_warnings(
    fields: dict[str, Any], path: str, words: str
) -> None:
    spec = parse_spec(minimal(**fields))
    (warning,) = pod_security_warnings(spec)
    assert (warning.path, warning.level) == (path, RESTRICTED)
    assert words in warning.problem
    assert "which the Restricted Pod Security level forbids" in str(warning)


def test_the_refusal_and_the_warning_name_the_yaml_line() -> None:
    text = (
        "name: mnist\nimage: busybox:1.36\nreplicas:\n  worker:\n    count: 2\n"
        "    podTemplate:\n      spec:\n        hostPID: true\n"
        "        securityContext: {runAsUser: 0}\n"
    )
    with pytest.raises(SpecError) as info:
        loads_spec(text)
    (issue,) = info.value.issues
    assert issue.path == "replicas.worker.podTemplate.spec.hostPID"
    assert "(line 8)" in issue.problem
    _, warnings = loads_spec_with_warnings(
        text.replace("name: mnist", "name: mnist\npodSecurity: privileged")
    )
    assert [(w.path, w.level, w.line) for w in warnings] == [
        ("replicas.worker.podTemplate.spec.hostPID", BASELINE, 9),
        ("replicas.worker.podTemplate.spec.securityContext.runAsUser", RESTRICTED, 10),
    ]
    assert str(warnings[1]).startswith(
        "replicas.worker.podTemplate.spec.securityContext.runAsUser: runAsUser: 0 runs the "
        "containers as root, which the Restricted Pod Security level forbids (line 10)"
    )


def test_what_baseline_and_restricted_allow_is_not_reported() -> None:
    allowed = minimal(
        ports=[{"containerPort": 8080}],
        volumes=[{"name": "data", "mountPath": "/data", "pvc": "claim"}],
        annotations={"container.apparmor.security.beta.kubernetes.io/pytorch": "runtime/default"},
        podTemplate={
            "spec": {
                "hostNetwork": False,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"},
                    "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}],
                    "seLinuxOptions": {"type": "container_t"},
                },
                "containers": [
                    {
                        "name": "pytorch",
                        "securityContext": {
                            "privileged": False,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                            "procMount": "Default",
                        },
                        "ports": [{"containerPort": 9000, "hostPort": 0}],
                    }
                ],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            }
        },
    )
    assert pod_security_findings(parse_spec(allowed)) == []


def test_the_examples_break_nothing_but_the_host_network_of_the_mpi_one() -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_spec(path)
        found = [(f.path, f.level) for f in pod_security_findings(spec)]
        if path.name == "mpi-horovod.yaml":
            assert spec.pod_security == "privileged"
            assert found == [("network.hostNetwork", BASELINE)]
        else:
            assert (path.name, found) == (path.name, [])


def test_the_opt_in_renders_nothing_and_baseline_is_the_default() -> None:
    spec = load_spec(EXAMPLES / "mpi-horovod.yaml")
    for dialect in ("kubedl", "kubeflow"):
        golden = (GOLDEN / dialect / "mpi-horovod.yaml").read_text()
        assert dump_manifests([render(spec, dialect)]) == golden
    plain = parse_spec(minimal())
    said = parse_spec(minimal(podSecurity="baseline"))
    assert said == plain
    assert spec_hash(said) == spec_hash(plain)
    assert "podSecurity" not in dump_spec(said)
    with pytest.raises(SpecError, match="podSecurity"):
        parse_spec(minimal(podSecurity="restricted"))
