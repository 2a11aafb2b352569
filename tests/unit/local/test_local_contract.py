"""The environment contract, capacity and state decisions of the local backend (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubedl_prefect.errors import FailureCategory, SpecError
from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.local.capacity import LocalCapacity, admit, gpu_ids
from kubedl_prefect.lifecycle.local.contract import (
    check_local,
    launch_env,
    local_checkpoint_dir,
    replica_plans,
    success_replicas,
)
from kubedl_prefect.lifecycle.local.state import (
    JobState,
    ReplicaState,
    diagnose_local,
    job_status,
    lost,
    settle,
)
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import TrainingJobSpec, parse_spec


def spec(**extra: Any) -> TrainingJobSpec:
    data: dict[str, Any] = {
        "name": "mnist",
        "image": "ghcr.io/example/mnist:1.0",
        "command": ["python3", "-m", "train"],
        "args": ["--epochs", "3"],
        "replicas": {"master": 1, "worker": 2},
        **extra,
    }
    return parse_spec(data)


def plans(job: TrainingJobSpec, **extra: Any) -> dict[str, dict[str, str]]:
    made = replica_plans(
        job,
        job_name="mnist-abc-a1",
        ports=extra.pop("ports", [29500, 29501, 29502]),
        python="/venv/bin/python",
        working_dir="/work",
        checkpoint_dir=extra.pop("checkpoint_dir", None),
        **extra,
    )
    return {p.name: dict(p.env) for p in made}


def test_pytorch_replicas_get_ranks_world_size_and_the_masters_address() -> None:
    made = replica_plans(
        spec(),
        job_name="mnist-abc-a1",
        ports=[29500],
        python="/venv/bin/python",
        working_dir="/work",
        checkpoint_dir="/ws/checkpoints/mnist-1",
        inherited={"PATH": "/usr/bin", "RANK": "7", "TF_CONFIG": "{}", "HOME": "/root"},
    )
    assert [p.name for p in made] == ["master-0", "worker-0", "worker-1"]
    assert [p.env["RANK"] for p in made] == ["0", "1", "2"]
    for plan in made:
        assert plan.argv == ("/venv/bin/python", "-m", "train", "--epochs", "3")
        assert plan.cwd == "/work"
        assert plan.env["WORLD_SIZE"] == "3"
        assert (plan.env["MASTER_ADDR"], plan.env["MASTER_PORT"]) == ("127.0.0.1", "29500")
        assert plan.env["LOCAL_RANK"] == "0"
        assert plan.env["PYTHONUNBUFFERED"] == "0"  # what both operators set
        assert plan.env["KUBEDL_PREFECT_CHECKPOINT_DIR"] == "/ws/checkpoints/mnist-1"
        assert plan.env["PATH"] == "/venv/bin:/usr/bin"
        assert plan.env["HOME"] == "/root"
        assert "TF_CONFIG" not in plan.env  # an inherited one is dropped


def test_tensorflow_replicas_get_a_tf_config_with_one_port_each() -> None:
    tf = spec(framework="tensorflow", replicas={"chief": 1, "worker": 2, "ps": 1})
    envs = plans(tf, ports=[2000, 2001, 2002, 2003])
    configs = {name: json.loads(env["TF_CONFIG"]) for name, env in envs.items()}
    cluster = configs["chief-0"]["cluster"]
    assert cluster == {
        "chief": ["127.0.0.1:2000"],
        "ps": ["127.0.0.1:2001"],
        "worker": ["127.0.0.1:2002", "127.0.0.1:2003"],
    }
    assert configs["worker-1"]["task"] == {"type": "worker", "index": 1}
    assert all(c["cluster"] == cluster for c in configs.values())
    assert all("RANK" not in env for env in envs.values())
    assert success_replicas(tf) == {"chief-0"}


def test_gpus_are_handed_out_per_replica_and_a_replica_without_sees_none() -> None:
    job = spec(replicas={"master": {"count": 1}, "worker": {"count": 1, "resources": {"gpus": 2}}})
    envs = plans(job, gpu_ids=[0, 1, 2])
    assert envs["master-0"]["CUDA_VISIBLE_DEVICES"] == ""
    assert envs["worker-0"]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_spec_env_field_refs_backend_env_and_cpu_threads() -> None:
    job = spec(
        env={
            "POD": {"fieldRef": {"fieldPath": "metadata.name"}},
            "IP": {"fieldRef": {"fieldPath": "status.podIP"}},
            "LR": "0.1",
            "TOKEN": {"secretKeyRef": {"name": "mlflow", "key": "token"}},
        },
        resources={"cpu": "2500m"},
    )
    envs = plans(job, extra_env={"TOKEN": "s3cret", "LR": "0.2"})
    assert envs["worker-1"]["POD"] == "mnist-abc-a1-worker-1"
    assert envs["worker-1"]["IP"] == "127.0.0.1"
    assert envs["worker-1"]["LR"] == "0.2"  # the backend's env overrides the spec's
    assert envs["worker-1"]["TOKEN"] == "s3cret"
    assert envs["worker-1"]["OMP_NUM_THREADS"] == "2"


def test_what_the_local_backend_cannot_run_is_refused_with_its_field() -> None:
    job = spec(env={"TOKEN": {"secretKeyRef": {"name": "mlflow", "key": "token"}}})
    with pytest.raises(SpecError, match=r"env\.TOKEN"):
        check_local(job)
    check_local(job, provided={"TOKEN"})
    mpi = parse_spec(
        {
            "name": "hvd",
            "framework": "mpi",
            "image": "x",
            "command": ["mpirun"],
            "replicas": {"launcher": 1, "worker": 2},
        }
    )
    with pytest.raises(SpecError, match="MPI"):
        check_local(mpi)
    with pytest.raises(SpecError, match=r"replicas\.master\.command"):
        check_local(spec(command=None))


def test_checkpoints_go_to_the_workspace_unless_the_location_is_a_file_uri() -> None:
    s3 = spec(checkpoint={"location": "s3://bucket/team"})
    one, two = (local_checkpoint_dir(s3, key, "/ws") for key in ("a", "b"))
    assert one is not None
    assert one.startswith("/ws/checkpoints/mnist-")
    assert one != two
    assert local_checkpoint_dir(s3, "a", "/ws") == one  # every attempt of a key: the same
    local = spec(checkpoint={"location": "file:///data/ckpt"})
    found = local_checkpoint_dir(local, "a", "/ws")
    assert found is not None
    assert found.startswith("/data/ckpt/mnist-")
    assert local_checkpoint_dir(spec(), "a", "/ws") is None


def test_launch_env_drops_every_inherited_contract_variable() -> None:
    inherited = {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "HOME": "/h"}
    assert launch_env(inherited, {}, "/v/bin/python") == {"HOME": "/h", "PATH": "/v/bin"}


def test_launch_env_passes_on_only_what_a_program_needs_not_the_callers_secrets() -> None:
    inherited = {
        "PATH": "/usr/bin",
        "HOME": "/home/me",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": "/tmp/me",
        "VIRTUAL_ENV": "/venv",
        "MLFLOW_TRACKING_PASSWORD": "hunter2",
        "PREFECT_API_KEY": "pnu_x",
        "AWS_SECRET_ACCESS_KEY": "aws",
        "HTTPS_PROXY": "http://user:pass@proxy:3128",
        "KUBEDL_PREFECT_LOCAL_JOB": "someone-elses",
    }
    env = launch_env(inherited, {"FROM_PLAN": "1"}, "/venv/bin/python")
    assert env == {
        "PATH": "/venv/bin:/usr/bin",
        "HOME": "/home/me",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": "/tmp/me",
        "VIRTUAL_ENV": "/venv",
        "FROM_PLAN": "1",
    }


def test_replicas_talk_over_the_loopback_interface_unless_the_backend_env_says_otherwise() -> None:
    job = spec(network={"ncclSocketIfname": "eth0"}, env={"GLOO_SOCKET_IFNAME": "eth0"})
    envs = plans(job, loopback_interface="lo")
    for env in envs.values():
        assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    envs = plans(job, loopback_interface="lo0", extra_env={"NCCL_SOCKET_IFNAME": "eth1"})
    assert (envs["worker-0"]["GLOO_SOCKET_IFNAME"], envs["worker-0"]["NCCL_SOCKET_IFNAME"]) == (
        "lo0",
        "eth1",
    )


def test_every_replica_carries_the_marker_of_its_job_whatever_the_env_says() -> None:
    envs = plans(spec(), job_uid="0a1b", extra_env={"KUBEDL_PREFECT_LOCAL_JOB": "forged"})
    assert {env["KUBEDL_PREFECT_LOCAL_JOB"] for env in envs.values()} == {"0a1b"}


def test_admission_names_every_shortage_in_the_schedulers_words() -> None:
    machine = LocalCapacity(processes=2, cpus=2, memory_bytes=4 * 2**30, gpus=0)
    ok = admit(spec(replicas={"master": 1, "worker": 1}), machine)
    assert ok.admitted
    assert (ok.scheduled, ok.expected) == (2, 2)
    refused = admit(spec(resources={"cpu": 1, "memory": "2Gi"}), machine)
    assert not refused.admitted
    assert refused.blocker == AdmissionBlocker.INSUFFICIENT_RESOURCES
    assert "too many processes (3 replicas, 2 allowed)" in refused.reason
    assert "Insufficient cpu (3 asked, 2 here)" in refused.reason
    assert "Insufficient memory (6Gi asked, 4Gi here)" in refused.reason
    gpus = admit(spec(replicas={"master": 1}, resources={"gpus": 1}), machine)
    assert gpus.blocker == AdmissionBlocker.INSUFFICIENT_GPU


def test_gpu_ids_come_from_the_device_files(tmp_path: Any) -> None:
    for name in ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert gpu_ids(tmp_path) == [0, 3]
    assert gpu_ids(tmp_path / "missing") == []


def running(*names: str) -> JobState:
    return JobState(
        "Running",
        tuple(ReplicaState(n, n.split("-")[0], int(n.split("-")[1]), "running") for n in names),
    )


def test_the_job_settles_like_the_operators_decide() -> None:
    state = running("master-0", "worker-0")
    master = frozenset({"master-0"})
    assert settle(state, master) is None
    worker_done = state.with_replica(state.replica("worker-0").exited(0, at="1"))
    assert settle(worker_done, master) is None  # the master's success is the job's
    done = worker_done.with_replica(state.replica("master-0").exited(0, at="2"))
    settled = settle(done, master)
    assert settled is not None
    assert settled.phase == "Succeeded"
    failed = state.with_replica(state.replica("worker-0").exited(3, at="1"))
    settled = settle(failed, master)
    assert settled is not None
    assert (settled.phase, settled.message) == ("Failed", "worker-0 exited with code 3")


def test_replicas_stopped_by_the_supervisor_are_not_the_cause() -> None:
    state = running("master-0", "worker-0")
    state = state.with_replica(state.replica("worker-0").exited(1, at="1"))
    state = state.with_replica(
        state.replica("master-0").exited(-15, at="2", stopped_by="supervisor")
    )
    diagnosis = diagnose_local(state, job_name="j", container="pytorch")
    assert (diagnosis.category, diagnosis.replica, diagnosis.exit_code) == (
        FailureCategory.USER_CODE,
        "worker-0",
        1,
    )
    assert job_status(state).replicas["master"].failed == 0


@pytest.mark.parametrize(
    ("returncode", "category", "retryable", "code"),
    [
        (-9, FailureCategory.KILLED, True, 137),
        (-15, FailureCategory.KILLED, True, 143),
        (137, FailureCategory.KILLED, True, 137),
        (126, FailureCategory.COMMAND_NOT_RUNNABLE, False, 126),
        (127, FailureCategory.COMMAND_NOT_RUNNABLE, False, 127),
        (2, FailureCategory.USER_CODE, False, 2),
    ],
)
def test_exit_codes_and_signals_are_classified_like_containers(
    returncode: int, category: FailureCategory, retryable: bool, code: int
) -> None:
    state = running("worker-0")
    state = state.with_replica(state.replica("worker-0").exited(returncode, at="1"))
    diagnosis = diagnose_local(state, job_name="j", container="pytorch")
    assert (diagnosis.category, diagnosis.retryable, diagnosis.exit_code) == (
        category,
        retryable,
        code,
    )


def test_an_nccl_timeout_in_the_logs_wins_over_the_exit_code() -> None:
    state = running("worker-0")
    state = state.with_replica(state.replica("worker-0").exited(1, at="1"))
    tails = {"worker-0": ["[Rank 1] Watchdog caught collective operation timeout"]}
    diagnosis = diagnose_local(state, job_name="j", container="pytorch", log_tails=tails)
    assert diagnosis.category == FailureCategory.NCCL_TIMEOUT


def test_a_lost_supervisor_is_a_lost_node() -> None:
    state = lost(running("master-0"), "t")
    assert job_status(state).phase == Phase.FAILED
    diagnosis = diagnose_local(state, job_name="j", container="pytorch")
    assert (diagnosis.category, diagnosis.retryable) == (FailureCategory.NODE_LOST, True)


def test_states_survive_their_json_round_trip() -> None:
    state = running("master-0", "worker-0")
    state = state.with_replica(state.replica("worker-0").exited(-9, at="t"))
    assert JobState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
