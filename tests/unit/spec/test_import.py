"""``kubedl-prefect import``: upstream example manifests round-trip through import and render.

Each manifest under ``manifests/kubeflow`` and ``manifests/kubedl`` is written anew after an
upstream example (its first comment names the source). Imported, then rendered in its own
dialect, it must give the same job: equal as the operator sees it (operator defaults, the CRD's
defaults the API server fills, quantities, named lists), and the render must pass the strict
CRD schema. ``manifests/refused`` holds manifests that cannot be ported; each names the field
its error must name (``# refused: <path>``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CrdErrors
from crd_schema import CRDSchema, defaulted
from spec_helpers import REPO
from typer.testing import CliRunner

from kubedl_prefect.cli import ExitCode, app
from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    Dialect,
    Framework,
    RenderOptions,
    load_spec,
    loads_spec,
    render,
    validate,
)
from kubedl_prefect.spec.porting import ImportedSpec, import_file, import_manifest, import_manifests
from kubedl_prefect.spec.semantics import (
    OPERATOR_DEFAULTS,
    differences,
    operator_view,
)
from kubedl_prefect.spec.types import CHECKPOINT_ENV, RestartPolicy, Role
from kubedl_prefect.testbed.upstream import KUBEDL, KUBEFLOW_TRAINING, module_dir

MANIFESTS = Path(__file__).resolve().parent / "manifests"
SUITE = sorted([*MANIFESTS.glob("kubeflow/*.yaml"), *MANIFESTS.glob("kubedl/*.yaml")])
REFUSED = sorted(MANIFESTS.glob("refused/*.yaml"))
runner = CliRunner()


def manifest_of(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


def crd_view(manifest: dict[str, Any], dialect: Dialect, framework: Framework) -> dict[str, Any]:
    """The operator's view of ``manifest`` once the API server filled in the CRD's defaults."""
    return operator_view(defaulted(CRDSchema.for_kind(dialect, framework), manifest), dialect)


def import_one(path: Path) -> ImportedSpec:
    (imported,) = import_manifests(path.read_text(encoding="utf-8"), source=str(path))
    return imported


@pytest.mark.parametrize("path", SUITE, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_upstream_manifest_round_trips(path: Path, crd_errors: CrdErrors) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Source: "), "every manifest names its upstream source"
    original = manifest_of(path)
    imported = import_one(path)
    spec = imported.spec
    assert imported.dialect.value == path.parent.name
    validate(spec, imported.dialect)
    rendered = render(spec, imported.dialect, RenderOptions(namespace=imported.namespace))
    assert crd_errors(imported.dialect, spec.framework, rendered) == []
    assert (
        differences(
            crd_view(original, imported.dialect, spec.framework),
            crd_view(rendered, imported.dialect, spec.framework),
        )
        == []
    )
    # What `import` prints is a valid spec, comments and all, and loads back to the same spec.
    assert loads_spec(imported.to_yaml()) == spec


def test_the_suite_covers_every_kind_in_both_dialects() -> None:
    kinds = {(p.parent.name, manifest_of(p)["kind"]) for p in SUITE}
    assert kinds == {
        (dialect, kind)
        for dialect in ("kubedl", "kubeflow")
        for kind in ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob")
    }


def test_the_view_sees_real_differences() -> None:
    path = MANIFESTS / "kubeflow" / "pytorch-simple.yaml"
    original = manifest_of(path)
    spec = import_one(path).spec
    changed = spec.model_copy(update={"backoff_limit": 2})
    rendered = render(changed, "kubeflow", RenderOptions(namespace="kubeflow"))
    found = differences(operator_view(original), operator_view(rendered))
    assert found == ["runPolicy.backoffLimit: (absent) != 2"]
    # Defaults the operator fills count as given: an explicit Kubeflow default is no change.
    worker = original["spec"]["pytorchReplicaSpecs"]["Worker"]
    del worker["restartPolicy"]
    assert differences(operator_view(manifest_of(path)), operator_view(original)) == []


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: p.stem)
def test_manifests_that_cannot_be_ported_are_refused_with_the_field(path: Path) -> None:
    expected = re.search(r"^# refused: (\S+)$", path.read_text(encoding="utf-8"), re.M)
    assert expected is not None
    with pytest.raises(SpecError) as info:
        import_file(path)
    assert [issue.path for issue in info.value.issues] == [expected.group(1)]
    assert all(issue.fix for issue in info.value.issues)


def test_defaults_that_differ_are_written_out_with_a_comment() -> None:
    imported = import_one(MANIFESTS / "kubeflow" / "mpijob-tensorflow-mnist.yaml")
    spec = imported.spec
    # Kubeflow's MPI replicas restart Never by default; the spec's defaults are ExitCode and
    # OnFailure, so the operator's is written out.
    assert spec.replicas[Role.LAUNCHER].restart_policy is RestartPolicy.NEVER
    assert spec.replicas[Role.WORKER].restart_policy is RestartPolicy.NEVER
    text = imported.to_yaml()
    assert "# restartPolicy Never is the operator's default for a Launcher of an MPIJob" in text
    # Kubeflow's TFJob default clean-pod policy is None, the spec's Running.
    tf = import_one(MANIFESTS / "kubeflow" / "tfjob-simple.yaml")
    assert tf.spec.clean_pod_policy.value == "None"
    assert "# cleanPodPolicy None is the operator's default for a TFJob" in tf.to_yaml()
    assert "--namespace kubeflow" in tf.to_yaml()
    # KubeDL deletes finished XGBoostJobs after 100 s unless told otherwise.
    xgb = import_one(MANIFESTS / "kubedl" / "xgboostjob-iris-train.yaml")
    assert xgb.spec.ttl_seconds_after_finished == 100


def test_typed_homes_are_used() -> None:
    imagenet = import_one(MANIFESTS / "kubeflow" / "pytorch-elastic-imagenet.yaml").spec
    assert imagenet.elastic is not None
    assert imagenet.elastic.metrics is not None
    assert imagenet.elastic.metrics[0].resource is not None
    assert imagenet.elastic.metrics[0].resource.target.average_utilization == 80
    assert imagenet.resources is not None
    assert imagenet.resources.requests == {"cpu": "4"}
    assert imagenet.env is not None
    assert imagenet.env["LOGLEVEL"].value == "DEBUG"
    iris = import_one(MANIFESTS / "kubeflow" / "xgboostjob-iris-train.yaml").spec
    assert iris.ports is not None
    assert [(p.name, p.container_port) for p in iris.ports] == [("xgboostjob-port", 9991)]
    assert iris.args is None  # the roles' arguments differ: each role has its own
    assert iris.replicas[Role.WORKER].args is not None
    assert iris.pod_template is None
    local = import_one(MANIFESTS / "kubeflow" / "xgboostjob-iris-train-local.yaml").spec
    assert local.volumes is not None
    assert [(v.name, v.pvc, v.mount_path) for v in local.volumes] == [
        ("task-pv-storage", "xgboostlocal", "/tmp/xgboost_model")
    ]
    mnist = import_one(MANIFESTS / "kubedl" / "tfjob-mnist.yaml").spec
    assert mnist.resources is not None
    assert mnist.resources.limits == {"cpu": "2048m", "memory": "2Gi"}
    assert mnist.resources.requests == {"cpu": "1024m", "memory": "1Gi"}
    gpus = import_one(MANIFESTS / "kubeflow" / "pytorch-mnist-nccl.yaml").spec
    assert gpus.resources is not None
    assert gpus.resources.gpus == 1
    host = import_one(MANIFESTS / "kubedl" / "tfjob-hostnetwork.yaml").spec
    assert host.network is not None
    assert host.network.host_network is True
    assert host.annotations is None
    elastic_mpi = import_one(MANIFESTS / "kubeflow" / "mpijob-tensorflow-mnist-elastic.yaml").spec
    assert elastic_mpi.replicas[Role.WORKER].container_name == "mpi-worker"
    assert render(elastic_mpi, "kubeflow")["spec"]["mainContainer"] == "mpi-worker"


def test_job_only_annotations_stay_off_the_pods() -> None:
    imported = import_one(MANIFESTS / "kubedl" / "tfjob-affinity-annotations.yaml")
    spec = imported.spec
    assert spec.annotations is not None
    assert spec.annotations["kubedl.io/pod-batch-size"] == "2"
    rendered = render(spec, "kubedl")
    template = rendered["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    assert "annotations" not in template.get("metadata", {})
    assert "No typed home" in imported.to_yaml()


def test_what_has_no_typed_home_goes_to_the_escape_hatch_with_a_comment() -> None:
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "probe"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "spec": {
                            "shareProcessNamespace": True,
                            "containers": [
                                {"name": "sidecar", "image": "busybox:1.36"},
                                {
                                    "name": "pytorch",
                                    "image": "torch:2",
                                    "lifecycle": {"preStop": {"exec": {"command": ["sync"]}}},
                                },
                            ],
                        }
                    },
                }
            }
        },
    }
    imported = import_manifest(manifest)
    assert imported.spec.pod_template == {
        "spec": {
            "shareProcessNamespace": True,
            "containers": [
                {"name": "pytorch", "lifecycle": {"preStop": {"exec": {"command": ["sync"]}}}},
                {"name": "sidecar", "image": "busybox:1.36"},
            ],
        }
    }
    text = imported.to_yaml()
    assert "# No typed home in the spec" in text
    assert "the training container now comes first" in text


def test_the_porting_guide_example_is_what_import_prints() -> None:
    page = (REPO / "docs" / "porting.md").read_text(encoding="utf-8")
    manifest, spec = re.findall(r"```yaml\n(.*?)```", page, re.S)[:2]
    (imported,) = import_manifests(manifest)
    assert imported.to_yaml() == spec


def test_zero_replicas_are_refused_with_the_field() -> None:
    manifest = manifest_of(MANIFESTS / "kubeflow" / "tfjob-simple.yaml")
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = 0
    with pytest.raises(SpecError) as info:
        import_manifest(manifest)
    assert [i.path for i in info.value.issues] == ["spec.tfReplicaSpecs.Worker.replicas"]


def test_several_documents_and_lists() -> None:
    one = (MANIFESTS / "kubeflow" / "tfjob-simple.yaml").read_text(encoding="utf-8")
    two = (MANIFESTS / "kubedl" / "pytorchjob-sendrecv.yaml").read_text(encoding="utf-8")
    imported = import_manifests(f"{one}\n---\n{two}")
    assert [i.spec.name for i in imported] == ["tfjob-simple", "pytorch-dist-sendrecv-example"]
    listed = {"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(one)]}
    (item,) = import_manifests(yaml.safe_dump(listed))
    assert item.spec.name == "tfjob-simple"


def test_dialect_is_checked() -> None:
    text = (MANIFESTS / "kubeflow" / "tfjob-simple.yaml").read_text(encoding="utf-8")
    with pytest.raises(SpecError, match="--dialect kubedl was asked for"):
        import_manifests(text, dialect="kubedl")
    assert import_manifests(text, dialect="kubeflow")[0].dialect is Dialect.KUBEFLOW
    for api, kind, path in [
        ("kubeflow.org/v1", "PaddleJob", "kind"),
        ("kubeflow.org/v2", "TFJob", "apiVersion"),
        ("batch/v1", "Job", "apiVersion"),
    ]:
        with pytest.raises(SpecError) as info:
            import_manifest({"apiVersion": api, "kind": kind, "metadata": {"name": "x"}})
        assert info.value.issues[0].path == path


def test_server_fields_are_left_out() -> None:
    manifest = manifest_of(MANIFESTS / "kubeflow" / "tfjob-simple.yaml")
    manifest["metadata"] |= {
        "uid": "1234",
        "resourceVersion": "9",
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
    }
    manifest["status"] = {"conditions": []}
    manifest["spec"]["runPolicy"] = {"suspend": False}
    imported = import_manifest(manifest)
    assert imported.spec.annotations is None
    text = imported.to_yaml()
    assert "uid, resourceVersion" in text
    assert "status was left out" in text


def test_checkpoints_rendered_by_kubedl_prefect_come_back() -> None:
    spec = loads_spec(
        "name: ckpt\nimage: torch:2\nreplicas: {master: 1, worker: 2}\n"
        "checkpoint: {location: /ckpt/run, pvc: claims, mountPath: /ckpt}\n"
        "network: {ncclSocketIfname: eth0}\nenv: {A: '1'}\n"
    )
    for dialect in Dialect:
        again = import_manifest(render(spec, dialect)).spec
        assert again.checkpoint == spec.checkpoint
        assert again.network == spec.network
        assert again.env == spec.env


def test_a_checkpoint_variable_set_by_hand_stays_raw() -> None:
    manifest = manifest_of(MANIFESTS / "kubeflow" / "tfjob-simple.yaml")
    container = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": CHECKPOINT_ENV, "value": "/x"}, {"name": "B", "value": "2"}]
    spec = import_manifest(manifest).spec
    assert spec.checkpoint is None
    assert spec.pod_template is not None
    assert spec.pod_template["spec"]["containers"][0]["env"][0]["name"] == CHECKPOINT_ENV


def test_the_examples_round_trip_through_import() -> None:
    for example in sorted((REPO / "examples").glob("*.yaml")):
        spec = load_spec(example)
        for dialect in Dialect:
            try:
                manifest = render(spec, dialect)
            except SpecError:
                continue  # the elastic example is for Kubeflow only
            again = import_manifest(manifest).spec
            assert (
                differences(operator_view(render(again, dialect)), operator_view(manifest)) == []
            ), example.name


# --- the operators' defaults, against their Go code ------------------------------------------

_GO_POLICIES = {"RestartPolicyOnFailure": "OnFailure", "RestartPolicyNever": "Never"}
_GO_POLICIES |= {"RestartPolicyExitCode": "ExitCode"}


def _go_constant(text: str, name: str) -> str:
    match = re.search(rf"^\s*{name}\s*=\s*(\S+)", text, re.M)
    assert match is not None, name
    return match.group(1).split(".")[-1].strip('"')


@pytest.mark.parametrize(
    ("dialect", "framework", "constant", "roles"),
    [
        (Dialect.KUBEFLOW, Framework.PYTORCH, "PyTorchJobDefaultRestartPolicy", None),
        (Dialect.KUBEFLOW, Framework.TENSORFLOW, "TFJobDefaultRestartPolicy", None),
        (Dialect.KUBEFLOW, Framework.MPI, "MPIJobDefaultRestartPolicy", None),
        (Dialect.KUBEFLOW, Framework.XGBOOST, "XGBoostJobDefaultRestartPolicy", None),
        (Dialect.KUBEDL, Framework.PYTORCH, "PyTorchJobDefaultMasterRestartPolicy", [Role.MASTER]),
        (Dialect.KUBEDL, Framework.PYTORCH, "PyTorchJobDefaultWorkerRestartPolicy", [Role.WORKER]),
        (Dialect.KUBEDL, Framework.TENSORFLOW, "TFJobDefaultRestartPolicy", None),
        (Dialect.KUBEDL, Framework.MPI, "MPIJobDefaultRestartPolicy", None),
    ],
)
def test_restart_policy_defaults_are_the_operators(
    dialect: Dialect, framework: Framework, constant: str, roles: list[Role] | None
) -> None:
    if dialect is Dialect.KUBEFLOW:
        folder = module_dir(KUBEFLOW_TRAINING) / "pkg/apis/kubeflow.org/v1"
        pattern = "*_types.go"
    else:
        folder = module_dir(KUBEDL) / "apis/training/v1alpha1"
        pattern = "*_constants.go"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob(pattern)))
    expected = _GO_POLICIES[_go_constant(text, constant)]
    defaults = OPERATOR_DEFAULTS[dialect, framework]
    for role in roles or list(defaults.restart_policies):
        policy = defaults.restart_policies[role]
        assert policy is not None
        assert policy.value == expected


def test_kubedl_xgboost_has_no_restart_default_and_a_ttl() -> None:
    folder = module_dir(KUBEDL) / "apis/training/v1alpha1"
    defaults_go = (folder / "xgboostjob_defaults.go").read_text(encoding="utf-8")
    constants = (folder / "xgboostjob_constants.go").read_text(encoding="utf-8")
    assert "RestartPolicy" not in defaults_go
    ttl = re.search(r"XGBoostJobDefaultTTLseconds\s*=\s*int32\((\d+)\)", constants)
    assert ttl is not None
    defaults = OPERATOR_DEFAULTS[Dialect.KUBEDL, Framework.XGBOOST]
    assert defaults.ttl_seconds_after_finished == int(ttl.group(1))
    assert set(defaults.restart_policies.values()) == {None}


def test_clean_pod_policy_defaults_are_the_operators() -> None:
    kubeflow = module_dir(KUBEFLOW_TRAINING) / "pkg/apis/kubeflow.org/v1"
    for name in ("pytorch", "tensorflow", "xgboost", "mpi"):
        text = (kubeflow / f"{name}_defaults.go").read_text(encoding="utf-8")
        assert "CleanPodPolicyPointer(CleanPodPolicyNone)" in text, name
    assert {OPERATOR_DEFAULTS[Dialect.KUBEFLOW, f].clean_pod_policy.value for f in Framework} == {
        "None"
    }
    kubedl = module_dir(KUBEDL) / "apis/training/v1alpha1"
    pytorch = (kubedl / "pytorchjob_defaults.go").read_text(encoding="utf-8")
    tensorflow = (kubedl / "tfjob_defaults.go").read_text(encoding="utf-8")
    assert "common.CleanPodPolicyNone" in pytorch
    assert "v1.CleanPodPolicyRunning" in tensorflow
    expected = {Framework.PYTORCH: "None", Framework.TENSORFLOW: "Running"}
    expected |= {Framework.MPI: "Running", Framework.XGBOOST: "None"}
    for framework, policy in expected.items():
        assert OPERATOR_DEFAULTS[Dialect.KUBEDL, framework].clean_pod_policy.value == policy


def test_import_command(tmp_path: Path) -> None:
    path = MANIFESTS / "kubeflow" / "xgboostjob-iris-train.yaml"
    result = runner.invoke(app, ["import", str(path)])
    assert result.exit_code == ExitCode.OK, result.stderr
    (spec_file := tmp_path / "spec.yaml").write_text(result.stdout, encoding="utf-8")
    assert load_spec(spec_file) == import_one(path).spec
    refused = runner.invoke(app, ["import", str(MANIFESTS / "refused" / "kubedl-tfjob-cache.yaml")])
    assert refused.exit_code == ExitCode.INVALID_SPEC
    assert "spec.cacheBackend" in refused.stderr
    assert refused.stdout == ""
    wrong = runner.invoke(app, ["import", str(path), "--dialect", "kubedl"])
    assert wrong.exit_code == ExitCode.INVALID_SPEC
    missing = runner.invoke(app, ["import", str(tmp_path / "missing.yaml")])
    assert missing.exit_code == ExitCode.USAGE
