"""Hypothesis strategies of specs: valid spec data of every framework, and their building blocks.

Shared by the property tests (``test_spec_properties.py``, ``test_import_properties.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import Framework
from kubedl_prefect.spec.types import main_container_names

T = TypeVar("T")

# --- building blocks -----------------------------------------------------------------------

printable = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12
)
dns_label = st.from_regex(r"\A[a-z]([-a-z0-9]{0,10}[a-z0-9])?\Z")
object_name = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?(\.[a-z0-9]{1,5})?\Z")
label_key = st.from_regex(
    r"\A([a-z0-9]{1,6}\.[a-z]{2,4}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?\Z"
)
label_value = st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?)?\Z")
env_name = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,10}\Z")
abs_path = st.from_regex(r"\A(/[a-z0-9]{1,6}){1,3}\Z")
cpu = st.one_of(st.integers(1, 64), st.sampled_from(["500m", "250m", "1.5", "2", "100m"]))
memory = st.one_of(st.integers(1, 2**34), st.sampled_from(["512Mi", "1Gi", "16Gi", "1e9", "2G"]))


def attempt(action: Callable[[], T]) -> tuple[T | None, SpecError | None]:
    """Run ``action``: its result, or the SpecError it raised (anything else propagates)."""
    try:
        return action(), None
    except SpecError as exc:
        return None, exc


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    gpus = draw(st.integers(0, 8))
    data: dict[str, Any] = {
        "cpu": draw(maybe(cpu)),
        "memory": draw(maybe(memory)),
        "gpus": gpus or None,
    }
    extra = draw(
        st.dictionaries(
            st.sampled_from(["ephemeral-storage", "example.com/fpga", "hugepages-2Mi"]),
            st.sampled_from(["1", "2Gi", "10"]),
            max_size=2,
        )
    )
    if extra:
        data["limits"] = extra
        if draw(st.booleans()):
            data["requests"] = dict(extra)
    if gpus and draw(st.booleans()):
        data.setdefault("requests", {})["nvidia.com/gpu"] = str(gpus)
    return drop_none(data)


env_value = st.one_of(
    printable,
    st.integers(-5, 5),
    st.booleans(),
    st.builds(lambda n, k: {"secretKeyRef": {"name": n, "key": k}}, object_name, env_name),
    st.builds(
        lambda n, k: {"configMapKeyRef": {"name": n, "key": k, "optional": True}},
        object_name,
        env_name,
    ),
    st.just({"fieldRef": {"fieldPath": "status.podIP"}}),
)
env = st.dictionaries(env_name, env_value, max_size=3)

toleration = st.one_of(
    st.builds(
        lambda k, e: drop_none({"key": k, "operator": "Exists", "effect": e}),
        label_key,
        maybe(st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])),
    ),
    st.builds(
        lambda k, v: {
            "key": k,
            "operator": "Equal",
            "value": v,
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
        label_key,
        label_value,
    ),
    st.just({"operator": "Exists"}),
)

selector = st.builds(
    lambda labels, key: drop_none(
        {
            "matchLabels": labels or None,
            "matchExpressions": [{"key": key, "operator": "In", "values": ["a", "b"]}],
        }
    ),
    st.dictionaries(label_key, label_value, max_size=2),
    label_key,
)
affinity = st.one_of(
    st.builds(
        lambda key, weight: {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": key, "operator": "Exists"}]}
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": weight,
                        "preference": {
                            "matchExpressions": [{"key": key, "operator": "Gt", "values": ["3"]}]
                        },
                    }
                ],
            }
        },
        label_key,
        st.integers(1, 100),
    ),
    st.builds(
        lambda sel, weight, ns: {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": sel, "topologyKey": "kubernetes.io/hostname"}
                ],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": weight,
                        "podAffinityTerm": {
                            "namespaceSelector": sel,
                            "namespaces": ns,
                            "topologyKey": "topology.kubernetes.io/zone",
                        },
                    }
                ],
            },
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": sel, "topologyKey": "kubernetes.io/hostname"}
                ]
            },
        },
        selector,
        st.integers(1, 100),
        st.lists(dns_label, max_size=2),
    ),
)


def pod_template(framework: Framework) -> st.SearchStrategy[dict[str, Any]]:
    """Pod-template fragments with no typed home in the spec (the escape hatch)."""
    main = st.sampled_from(sorted(main_container_names(framework)))
    return st.one_of(
        st.sampled_from(
            [
                {"spec": {"terminationGracePeriodSeconds": 30}},
                {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}},
                {"spec": {"securityContext": {"runAsUser": 1000, "fsGroup": 1000}}},
                {"spec": {"containers": [{"name": "log-shipper", "image": "fluent-bit:3.0"}]}},
            ]
        ),
        main.map(
            lambda name: {
                "spec": {"containers": [{"name": name, "securityContext": {"privileged": False}}]}
            }
        ),
    )


port = st.builds(
    lambda number, name, protocol: drop_none(
        {"containerPort": number, "name": name, "protocol": protocol}
    ),
    st.integers(1024, 1100),
    maybe(st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z")),
    maybe(st.sampled_from(["TCP", "UDP"])),
)
ports = st.lists(
    port,
    max_size=2,
    unique_by=(lambda p: p["containerPort"], lambda p: p.get("name") or p["containerPort"]),
)

metric = st.one_of(
    st.builds(
        lambda value: {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": value},
            },
        },
        st.integers(1, 100),
    ),
    st.just(
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "samples_per_second"},
                "target": {"type": "AverageValue", "averageValue": "100"},
            },
        }
    ),
    st.just(
        {
            "type": "External",
            "external": {
                "metric": {"name": "queue_length", "selector": {"matchLabels": {"q": "train"}}},
                "target": {"type": "Value", "value": "30"},
            },
        }
    ),
)


@st.composite
def container_settings(draw: st.DrawFn, framework: Framework) -> dict[str, Any]:
    return drop_none(
        {
            "image": draw(
                maybe(st.sampled_from(["busybox:1.36", "ghcr.io/x/y@sha256:" + "a" * 64]))
            ),
            "imagePullPolicy": draw(maybe(st.sampled_from(["Always", "IfNotPresent", "Never"]))),
            "command": draw(maybe(st.lists(printable, max_size=3))),
            "args": draw(maybe(st.lists(printable, max_size=3))),
            "workingDir": draw(maybe(abs_path)),
            "env": draw(maybe(env)),
            "resources": draw(maybe(resources())),
            "nodeSelector": draw(maybe(st.dictionaries(label_key, label_value, max_size=2))),
            "tolerations": draw(maybe(st.lists(toleration, max_size=2))),
            "affinity": draw(maybe(affinity)),
            "ports": draw(maybe(ports)),
            "priorityClassName": draw(maybe(object_name)),
            "serviceAccountName": draw(maybe(dns_label)),
            "imagePullSecrets": draw(maybe(st.lists(object_name, max_size=2, unique=True))),
            "containerName": draw(maybe(dns_label)) if framework is Framework.MPI else None,
            "podTemplate": draw(maybe(pod_template(framework))),
        }
    )


ROLE_SETS = {
    Framework.PYTORCH: [["master"], ["master", "worker"], ["worker"]],
    Framework.TENSORFLOW: [
        ["worker"],
        ["chief", "worker"],
        ["chief", "ps", "worker"],
        ["master", "ps", "worker", "evaluator"],
        ["chief"],
    ],
    Framework.MPI: [["launcher", "worker"]],
    Framework.XGBOOST: [["master"], ["master", "worker"]],
}
SINGLE = {"master", "chief", "launcher"}


@st.composite
def role_spec(draw: st.DrawFn, role: str, framework: Framework) -> Any:
    count = 1 if role in SINGLE else draw(st.integers(1, 12))
    if draw(st.booleans()):
        return count
    data = draw(container_settings(framework))
    data["count"] = count
    data["restartPolicy"] = draw(maybe(st.sampled_from(["OnFailure", "Never", "ExitCode"])))
    return drop_none(data)


@st.composite
def volumes_and_checkpoint(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    sources = [
        lambda: {"pvc": draw(object_name), "readOnly": draw(st.booleans())},
        lambda: {
            "emptyDir": drop_none(
                {"medium": draw(maybe(st.just("Memory"))), "sizeLimit": draw(maybe(st.just("1Gi")))}
            )
        },
        lambda: {"hostPath": {"path": draw(abs_path), "type": "DirectoryOrCreate"}},
        lambda: {"configMap": draw(object_name)},
        lambda: {"secret": draw(object_name), "subPath": "key"},
    ]
    count = draw(st.integers(0, 3))
    volumes = []
    for index in range(count):
        source = sources[draw(st.integers(0, len(sources) - 1))]()
        volumes.append({"name": f"vol-{index}", "mountPath": f"/mnt/v{index}", **source})
    kind = draw(st.sampled_from(["none", "uri", "pvc", "volume"]))
    checkpoint: dict[str, Any] | None = None
    if kind == "uri":
        checkpoint = {"location": "s3://bucket/" + draw(dns_label)}
    elif kind == "pvc":
        checkpoint = {
            "location": "/ckpt/" + draw(dns_label),
            "pvc": draw(object_name),
            "mountPath": "/ckpt",
        }
    elif kind == "volume" and volumes:
        checkpoint = {"location": volumes[0]["mountPath"] + "/run"}
    return volumes, checkpoint


@st.composite
def valid_spec_data(draw: st.DrawFn) -> dict[str, Any]:
    framework = draw(st.sampled_from(list(Framework)))
    roles = draw(st.sampled_from(ROLE_SETS[framework]))
    data = draw(container_settings(framework))
    data["image"] = "busybox:1.36"
    data["name"] = draw(dns_label)
    data["framework"] = framework.value
    data["replicas"] = {role: draw(role_spec(role, framework)) for role in roles}
    if data.get("resources") and draw(st.booleans()):
        # Keep it simple for roles that override: drop the top-level GPU requests sometimes.
        data["resources"].pop("requests", None)
    counts = {
        role: (spec if isinstance(spec, int) else spec["count"])
        for role, spec in data["replicas"].items()
    }
    volumes, checkpoint = draw(volumes_and_checkpoint())
    network = drop_none(
        {
            "ncclSocketIfname": draw(maybe(st.sampled_from(["eth0", "^lo,docker"]))),
            "hostNetwork": draw(maybe(st.booleans())),
        }
    )
    if network.get("ncclSocketIfname"):
        for source in [data, *[s for s in data["replicas"].values() if isinstance(s, dict)]]:
            source.get("env", {}).pop("NCCL_SOCKET_IFNAME", None)
    data |= drop_none(
        {
            "backoffLimit": draw(maybe(st.integers(0, 10))),
            "activeDeadlineSeconds": draw(maybe(st.integers(1, 10**6))),
            "ttlSecondsAfterFinished": draw(maybe(st.integers(0, 10**5))),
            "cleanPodPolicy": draw(maybe(st.sampled_from(["All", "Running", "None"]))),
            "gang": draw(
                maybe(
                    st.builds(
                        lambda m, q, p, s: drop_none(
                            {"minAvailable": m, "queue": q, "priorityClass": p, "scheduler": s}
                        ),
                        maybe(st.integers(1, sum(counts.values()))),
                        maybe(dns_label),
                        maybe(object_name),
                        maybe(st.just("volcano")),
                    )
                )
            ),
            "volumes": volumes or None,
            "checkpoint": checkpoint,
            "network": network or None,
            "labels": draw(maybe(st.dictionaries(label_key, label_value, max_size=2))),
            "annotations": draw(maybe(st.dictionaries(label_key, printable, max_size=2))),
        }
    )
    if framework is Framework.PYTORCH and "worker" in counts and draw(st.booleans()):
        low = draw(st.integers(1, counts["worker"]))
        high = draw(st.integers(counts["worker"], counts["worker"] + 4))
        data["elastic"] = drop_none(
            {
                "minReplicas": low,
                "maxReplicas": high,
                "metrics": draw(maybe(st.lists(metric, min_size=1, max_size=2))),
            }
        )
        data["nprocPerNode"] = draw(maybe(st.sampled_from(["auto", "gpu", "4"])))
        if data["nprocPerNode"] is None:
            del data["nprocPerNode"]
    if framework is Framework.MPI:
        data["slotsPerWorker"] = draw(st.integers(1, 8))
    if framework is Framework.TENSORFLOW and draw(st.booleans()):
        data["successPolicy"] = draw(st.sampled_from(["", "AllWorkers"]))
    if network.get("hostNetwork") or any("hostPath" in volume for volume in volumes):
        data["podSecurity"] = "privileged"  # they break the Baseline Pod Security level
    return data
