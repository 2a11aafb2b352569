"""The local twin of the cluster block: LocalCluster, and TrainingJob's cluster taking either."""

from __future__ import annotations

import asyncio
import doctest
import inspect
from pathlib import Path

import pytest
from prefect.blocks.core import Block
from pydantic import SecretStr, ValidationError

import kubedl_prefect.prefect.blocks as blocks
from kubedl_prefect.lifecycle.local import LocalBackend
from kubedl_prefect.lifecycle.local.capacity import machine_capacity
from kubedl_prefect.prefect import KubernetesCluster, LocalCluster, TrainingJob

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train" / "pytorch-ddp-cpu.yaml"


def test_its_backend_is_the_local_backend_of_its_workspace(tmp_path: Path) -> None:
    cluster = LocalCluster(
        workspace=str(tmp_path / "ws"),
        working_dir=str(tmp_path),
        max_processes=3,
        env={"MLFLOW_TRACKING_TOKEN": SecretStr("t0ken")},
    )
    backend = cluster.backend(dialect="kubeflow", labels={"kubedl-prefect.io/flow-run-id": "x"})
    assert isinstance(backend, LocalBackend)
    assert backend.workspace == str((tmp_path / "ws").resolve())
    assert backend.working_dir == str(tmp_path.resolve())
    assert backend.env == {"MLFLOW_TRACKING_TOKEN": "t0ken"}
    assert backend.labels == {"kubedl-prefect.io/flow-run-id": "x"}
    machine = machine_capacity()
    assert backend.capacity.processes == 3
    assert backend.capacity.cpus == machine.cpus
    assert backend.capacity.memory_bytes == machine.memory_bytes
    # A job reference's namespace is its workspace: re-attaching finds the same one.
    assert cluster.backend(namespace=str(tmp_path / "other")).namespace == str(tmp_path / "other")
    assert cluster.namespace == backend.namespace


def test_without_limits_the_machine_decides_and_the_default_workspace_is_used() -> None:
    from kubedl_prefect.lifecycle.local import default_workspace

    backend = LocalCluster().backend()
    assert isinstance(backend, LocalBackend)
    assert backend.capacity == machine_capacity()
    assert backend.workspace == str(Path(default_workspace()).expanduser().resolve())


def test_secrets_of_its_environment_stay_hidden() -> None:
    cluster = LocalCluster(env={"TOKEN": SecretStr("hunter2")})
    assert "hunter2" not in repr(cluster)
    assert "hunter2" not in cluster.model_dump_json()
    schema = LocalCluster.model_json_schema()
    assert "TOKEN" not in str(schema)
    # Every value under env is masked by Prefect's API (what "env" alone does not do).
    assert schema["secret_fields"] == ["env.*"]


def test_its_environment_takes_strings_and_refuses_a_masked_dump() -> None:
    assert LocalCluster(env={"A": "1", "B": SecretStr("2")}).backend().env == {"A": "1", "B": "2"}
    empty = LocalCluster()
    assert LocalCluster.model_validate_json(empty.model_dump_json()).backend().env == {}
    with pytest.raises(ValidationError, match="masked value"):
        LocalCluster.model_validate_json(LocalCluster(env={"A": "s3cr3t"}).model_dump_json())
    with pytest.raises(ValidationError, match="'N': its name and value must be strings") as bad:
        LocalCluster(env={"N": 12345678})
    assert "12345678" not in str(bad.value)


def test_a_training_job_takes_either_block_and_keeps_it_through_a_dump(tmp_path: Path) -> None:
    local = TrainingJob.from_spec_file(EXAMPLE, cluster=LocalCluster(workspace=str(tmp_path)))
    assert local.resolved_namespace() == str(tmp_path.resolve())
    for again in (
        TrainingJob.model_validate(local.model_dump()),
        TrainingJob.model_validate_json(local.model_dump_json()),
    ):
        assert isinstance(again.cluster, LocalCluster)
        assert again.cluster.workspace == str(tmp_path)
    remote = TrainingJob.from_spec_file(EXAMPLE, cluster=KubernetesCluster(namespace="ml"))
    assert isinstance(TrainingJob.model_validate(remote.model_dump()).cluster, KubernetesCluster)
    assert remote.resolved_namespace() == "ml"
    assert isinstance(TrainingJob.from_spec_file(EXAMPLE).cluster, KubernetesCluster)  # default


@pytest.mark.parametrize(
    ("cluster", "kind"),
    [
        ({"workspace": "/tmp/ws"}, LocalCluster),
        ({"max_processes": 2}, LocalCluster),
        ({"namespace": "ml"}, KubernetesCluster),
        ({}, KubernetesCluster),
    ],
)
def test_hand_written_cluster_fields_pick_the_block_they_belong_to(
    cluster: dict[str, object], kind: type[Block]
) -> None:
    job = TrainingJob(spec_file=str(EXAMPLE), cluster=cluster)
    assert type(job.cluster) is kind


def test_it_names_its_workspace_for_cleanup_and_is_found_again(tmp_path: Path) -> None:
    cluster = LocalCluster(workspace=str(tmp_path))
    reference = cluster.cleanup_reference()
    assert reference == {"localWorkspace": str(tmp_path.resolve())}
    found = asyncio.run(KubernetesCluster.from_cleanup_reference(reference))
    assert isinstance(found, LocalCluster)
    assert found.namespace == cluster.namespace
    # Kubernetes references are read as before.
    again = asyncio.run(
        LocalCluster.from_cleanup_reference({"kubeconfigPath": "/k", "context": "c"})
    )
    assert isinstance(again, KubernetesCluster)
    assert again.kubeconfig_path == "/k"


def test_it_is_a_block_type_of_the_collection_module_with_its_own_slug() -> None:
    collected = {
        cls.get_block_type_slug()
        for _, cls in inspect.getmembers(blocks, inspect.isclass)
        if issubclass(cls, Block) and cls.__module__ == blocks.__name__
    }
    assert {"kubedl-local-cluster", "kubedl-kubernetes-cluster", "kubedl-training-job"} <= collected
    assert LocalCluster.get_block_type_name() == "KubeDL Local Cluster"
    assert LocalCluster.get_description()


def test_the_backends_take_the_same_arguments() -> None:
    local = inspect.signature(LocalCluster.backend)
    remote = inspect.signature(KubernetesCluster.backend)
    assert list(local.parameters) == list(remote.parameters)


def test_docstring_examples_run() -> None:
    result = doctest.testmod(blocks)
    assert result.attempted > 0
    assert result.failed == 0
