"""Function tasks without a server: the payload, its bound, the env contract, what comes back.

The replicas' side (:mod:`kubedl_prefect.prefect.bootstrap`) runs here in the test process with
a prepared environment and no process group (one replica); the flow's side translates error
records into :class:`~kubedl_prefect.errors.ReplicaFunctionError`. The whole thing on two real
replicas with a Prefect server: ``tests/integration/test_function_tasks.py``.
"""

from __future__ import annotations

import base64
import importlib.util
import pickle
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.errors import (
    Diagnosis,
    FailureCategory,
    FunctionPayloadTooLargeError,
    JobFailedError,
    KubeDLPrefectError,
    ReplicaFunctionError,
)
from kubedl_prefect.prefect import bootstrap
from kubedl_prefect.prefect.blocks import KubernetesCluster, LocalCluster
from kubedl_prefect.prefect.functions import (
    DistributedFunction,
    adistributed_task,
    distributed_job,
    distributed_task,
    function_of,
    rank_zero_message,
    replica_errors,
    replica_name,
    spec_name_for,
)
from kubedl_prefect.prefect.replica import (
    FUNCTION_DATA_ENV,
    FUNCTION_FILE_ENV,
    FUNCTION_SHA256_ENV,
    MAX_INLINE_PAYLOAD_BYTES,
    MAX_TERMINATION_MESSAGE_BYTES,
    RESULT_FILE,
    TERMINATION_MESSAGE_ENV,
    TERMINATION_MESSAGE_PATH,
    Replica,
    ReplicaError,
    current_replica,
    digest,
    dump_call,
    load_call,
    payload_env,
    read_errors,
    read_payload,
    read_result,
    read_termination_message,
    termination_message,
    write_error,
    write_payload_file,
    write_result,
)
from kubedl_prefect.spec import CHECKPOINT_ENV, render


def scaled(values: list[float], factor: float) -> dict[str, float]:
    return {"sum": sum(values) * factor}


# -- the payload -----------------------------------------------------------------------------


def test_a_call_round_trips_through_its_payload_closures_and_all() -> None:
    offset = 10.0

    def shifted(x: float, *, by: float = 1.0) -> float:
        return x + by + offset

    data = dump_call(shifted, (1.0,), {"by": 2.0})
    fn, args, kwargs = load_call(data, digest(data))
    assert fn(*args, **kwargs) == 13.0


def test_a_payload_whose_digest_differs_is_refused_not_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"

    def touch() -> None:
        ran.touch()

    data = dump_call(touch, (), {})
    other = dump_call(scaled, ([1.0], 2.0), {})
    with pytest.raises(KubeDLPrefectError, match="not the one the task produced"):
        load_call(other, digest(data))
    assert not ran.exists()


def test_a_call_over_the_bound_names_its_size_the_limit_and_the_fix() -> None:
    big = [0.0] * 50_000
    with pytest.raises(FunctionPayloadTooLargeError) as caught:
        dump_call(scaled, (big, 2.0), {}, limit=64 * 1024)
    error = caught.value
    assert error.limit == 64 * 1024
    assert error.size > error.limit
    assert f"{error.size} bytes" in str(error)
    assert "65536 bytes" in str(error)
    assert error.hint is not None
    assert "path or URL" in error.hint
    assert isinstance(pickle.loads(pickle.dumps(error)), FunctionPayloadTooLargeError)


def test_the_payload_reaches_a_replica_as_a_file_or_inline(tmp_path: Path) -> None:
    data = dump_call(scaled, ([1.0, 2.0], 2.0), {})
    path = write_payload_file(tmp_path / "functions", data)
    assert path.stat().st_mode & 0o077 == 0
    assert write_payload_file(tmp_path / "functions", data) == path  # once per call
    as_file = payload_env(data, file=path)
    assert set(as_file) == {FUNCTION_SHA256_ENV, FUNCTION_FILE_ENV}
    inline = payload_env(data, file=None)
    assert base64.b64decode(inline[FUNCTION_DATA_ENV]) == data
    for env in (as_file, inline):
        got, expected = read_payload(env)
        fn, args, kwargs = load_call(got, expected)
        assert fn(*args, **kwargs) == {"sum": 6.0}
    with pytest.raises(KubeDLPrefectError, match="not started by a function task"):
        read_payload({})


# -- the env contract ------------------------------------------------------------------------


def test_the_replica_reads_the_v1_operators_and_trainers_variables() -> None:
    v1 = current_replica(
        {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456"}
    )
    assert v1 == Replica(1, 3, 0, "10.0.0.1", 23456)
    assert not v1.is_rank_zero
    trainer = current_replica(
        {"PET_NODE_RANK": "2", "PET_NNODES": "4", "PET_MASTER_ADDR": "n0", "PET_MASTER_PORT": "1"}
    )
    assert (trainer.rank, trainer.world_size, trainer.master_addr) == (2, 4, "n0")
    assert current_replica({}).is_rank_zero
    with pytest.raises(KubeDLPrefectError, match="outside a world"):
        current_replica({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(KubeDLPrefectError, match="not an integer"):
        current_replica({"RANK": "x", "WORLD_SIZE": "2"})


def test_no_process_group_alone_or_when_asked_for_none() -> None:
    assert bootstrap.process_group_backend(Replica(), "auto") is None
    assert bootstrap.process_group_backend(Replica(0, 2, 0, "127.0.0.1", 1), "none") is None


def test_rank_0s_store_stays_on_loopback_only_for_a_loopback_address_literal() -> None:
    # KubeDL gives its master MASTER_ADDR=localhost; its workers come by the Service name.
    assert bootstrap.store_listen_address("localhost") is None
    assert bootstrap.store_listen_address("LOCALHOST.") is None
    assert bootstrap.store_listen_address("fn-a1-master-0") is None
    assert bootstrap.store_listen_address("169.254.104.3") is None
    assert bootstrap.store_listen_address("127.0.0.1") == "127.0.0.1"  # a LocalCluster's
    assert bootstrap.store_listen_address("::1") == "::1"


def _listening_on(port: int) -> set[str]:
    import psutil

    return {
        c.laddr.ip
        for c in psutil.Process().net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


@pytest.mark.long  # imports torch: seconds
@pytest.mark.parametrize(
    ("master_addr", "where"),
    [("localhost", {"::", "0.0.0.0"}), ("127.0.0.1", {"127.0.0.1"})],
    ids=["kubedl-master", "local"],
)
def test_rank_0s_store_listens_where_the_other_ranks_can_reach_it(
    master_addr: str, where: set[str]
) -> None:
    # make test installs every extra; without torch this test must fail, not vanish.
    assert importlib.util.find_spec("torch") is not None, (
        "needs the torch extra (uv sync --all-extras)"
    )
    store = bootstrap.init_process_group(Replica(0, 1, 0, master_addr, 0), "gloo")
    store_port = store.port
    try:
        listening = _listening_on(store_port)
    finally:
        bootstrap._leave_process_group()
        del store
    assert listening, f"nothing listens on the store's port {store_port}"
    assert listening <= where, listening


# -- what comes back -------------------------------------------------------------------------


def test_rank_zeros_value_round_trips_and_a_file_others_may_write_is_refused(
    tmp_path: Path,
) -> None:
    write_result(tmp_path, {"val_accuracy": 0.97, "history": [1, 2]})
    assert read_result(tmp_path) == {"val_accuracy": 0.97, "history": [1, 2]}
    (tmp_path / RESULT_FILE).chmod(0o666)
    with pytest.raises(KubeDLPrefectError, match="others may write it"):
        read_result(tmp_path)
    (tmp_path / RESULT_FILE).unlink()
    with pytest.raises(KubeDLPrefectError, match="left no result"):
        read_result(tmp_path)


def test_error_records_say_the_rank_and_the_tracebacks_last_line_first_one_first(
    tmp_path: Path,
) -> None:
    try:
        raise ValueError("shard 3 is empty")
    except ValueError as exc:
        second = ReplicaError.of(1, exc)
    first = ReplicaError(2, "RuntimeError", "RuntimeError: boom", 1, second.time - 1)
    write_error(tmp_path, second)
    write_error(tmp_path, first)
    (tmp_path / "function-error-rank9.json").write_text("not json")
    assert read_errors(tmp_path) == [first, second]
    assert second.last_line == "ValueError: shard 3 is empty"
    assert second.error_type == "ValueError"


def _replica_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, call: Any, *args: Any) -> Path:
    data = dump_call(call, args, {})
    path = write_payload_file(tmp_path / "functions", data)
    outputs = tmp_path / "checkpoints"
    for name in ("RANK", "WORLD_SIZE", "PET_NODE_RANK", "PET_NNODES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**payload_env(data, file=path), CHECKPOINT_ENV: str(outputs)}.items():
        monkeypatch.setenv(name, value)
    return outputs


def test_the_bootstrap_calls_the_function_and_leaves_rank_zeros_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outputs = _replica_env(monkeypatch, tmp_path, scaled, [1.0, 2.0], 10.0)
    assert bootstrap.main() == 0
    assert read_result(outputs) == {"sum": 30.0}
    assert read_errors(outputs) == []


def test_the_bootstrap_awaits_a_coroutine_function(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def twice(x: int) -> int:
        return 2 * x

    outputs = _replica_env(monkeypatch, tmp_path, twice, 21)
    assert bootstrap.main() == 0
    assert read_result(outputs) == 42


def test_a_function_that_raises_exits_1_with_its_record_and_no_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse() -> None:
        raise ValueError("rank 0 refuses")

    outputs = _replica_env(monkeypatch, tmp_path, refuse)
    write_result(outputs, "stale")  # an earlier attempt's: removed at start
    assert bootstrap.main() == 1
    assert not (outputs / RESULT_FILE).exists()
    (error,) = read_errors(outputs)
    assert (error.rank, error.last_line) == (0, "ValueError: rank 0 refuses")
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_swapped_payload_file_is_refused_by_the_replica(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outputs = _replica_env(monkeypatch, tmp_path, scaled, [1.0], 1.0)
    swapped = dump_call(scaled, ([666.0], 1.0), {})
    Path(str(read_payload_path())).write_bytes(swapped)
    assert bootstrap.main() == 1
    (error,) = read_errors(outputs)
    assert "not the one the task produced" in error.last_line


def test_on_kubernetes_the_bootstrap_leaves_rank_zeros_value_in_its_termination_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _replica_env(monkeypatch, tmp_path, scaled, [1.0, 2.0], 10.0)
    message = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_MESSAGE_ENV, str(message))
    assert bootstrap.main() == 0
    read = read_termination_message(message.read_text(), where="pod ml/fn-master-0")
    assert (read.ok, read.result, read.error) == (True, {"sum": 30.0}, None)


def test_on_kubernetes_a_replica_that_raises_leaves_its_record_as_its_termination_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse() -> None:
        raise ValueError("rank 1 refuses")

    _replica_env(monkeypatch, tmp_path, refuse)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    message = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_MESSAGE_ENV, str(message))
    assert bootstrap.main() == 1
    read = read_termination_message(message.read_text(), where="pod ml/fn-worker-0")
    assert read.error is not None
    assert (read.ok, read.error.rank, read.error.last_line) == (
        False,
        1,
        "ValueError: rank 1 refuses",
    )


def test_a_value_too_large_or_not_json_becomes_a_note_the_flow_raises_on() -> None:
    text = termination_message(value={"weights": [0.5] * 2000})
    assert len(text.encode()) <= MAX_TERMINATION_MESSAGE_BYTES
    with pytest.raises(FunctionPayloadTooLargeError) as caught:
        read_termination_message(text, where="pod ml/fn-master-0")
    assert caught.value.limit == MAX_TERMINATION_MESSAGE_BYTES
    assert caught.value.size > MAX_TERMINATION_MESSAGE_BYTES
    assert "pod ml/fn-master-0" in str(caught.value)
    assert "checkpoint" in (caught.value.hint or "")
    with pytest.raises(KubeDLPrefectError, match="is a bytes, which cannot come back"):
        read_termination_message(termination_message(value=b"\x00"), where="pod ml/m-0")
    # a message cut at 4 KiB, or one another program wrote, is refused, never guessed at
    for foreign in ('{"result": [1, 2', "Error: exit 1", '{"other": 1}'):
        with pytest.raises(KubeDLPrefectError, match="not a function task's"):
            read_termination_message(foreign, where="pod ml/m-0")


def test_rank_zeros_pod_is_found_by_its_labels_in_either_dialect() -> None:
    def pod(name: str, role: str, index: str, message: str | None, *, v1: bool) -> dict[str, Any]:
        prefix = "training.kubeflow.org/" if v1 else ""
        terminated = {"exitCode": 0} | ({"message": message} if message else {})
        return {
            "metadata": {
                "name": name,
                "labels": {f"{prefix}replica-type": role, f"{prefix}replica-index": index},
            },
            "status": {
                "containerStatuses": [
                    {"name": "sidecar", "state": {"terminated": {"message": "not this"}}},
                    {"name": "pytorch", "state": {"terminated": terminated}},
                ]
            },
        }

    for v1 in (False, True):
        pods = [
            pod("fn-worker-0", "worker", "0", '{"result": "worker"}', v1=v1),
            pod("fn-master-0", "master", "0", '{"result": "master"}', v1=v1),
        ]
        assert rank_zero_message(pods, "pytorch") == ("fn-master-0", '{"result": "master"}')
    silent = [pod("fn-master-0", "master", "0", None, v1=False)]
    assert rank_zero_message(silent, "pytorch") == ("fn-master-0", None)
    assert rank_zero_message(silent[:0], "pytorch") == (None, None)


def test_the_error_records_of_failed_replicas_come_from_their_termination_messages() -> None:
    def record(rank: int, line: str, at: float) -> str:
        return termination_message(error=ReplicaError(rank, "ValueError", line, 1, at))

    def pod(name: str, statuses: list[dict[str, Any]]) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"containerStatuses": statuses}}

    pods = [
        pod("fn-master-0", [{"name": "pytorch", "state": {"terminated": {"message": "{}"}}}]),
        pod(  # restarted (killed from outside) after its function raised: the last state says
            "fn-worker-1",
            [
                {
                    "name": "pytorch",
                    "state": {"running": {}},
                    "lastState": {"terminated": {"message": record(2, "E: later", 9.0)}},
                }
            ],
        ),
        pod(
            "fn-worker-0",
            [
                {"name": "sidecar", "state": {"terminated": {"message": record(7, "no", 1.0)}}},
                {
                    "name": "pytorch",
                    "state": {"terminated": {"message": record(1, "E: first", 5.0)}},
                },
            ],
        ),
        pod("fn-worker-2", [{"name": "pytorch", "state": {"terminated": {"message": "Error: 1"}}}]),
    ]
    errors = replica_errors(pods, "pytorch")
    assert [(e.rank, e.last_line) for e in errors] == [(1, "E: first"), (2, "E: later")]
    assert replica_errors(pods[:1], "pytorch") == []  # neither a record nor one of ours


def test_every_replica_of_a_function_task_fails_on_its_functions_error_not_restarts(
    tmp_path: Path,
) -> None:
    for cluster in (KubernetesCluster(namespace="ml"), LocalCluster(workspace=str(tmp_path))):
        job = settings(cluster, image="x").training_job(([1.0], 2.0), {})
        manifest = render(job.training_spec(), job.dialect)
        policies = {
            role: spec["restartPolicy"]
            for role, spec in manifest["spec"]["pytorchReplicaSpecs"].items()
        }
        assert policies == {"Master": "ExitCode", "Worker": "ExitCode"}


def read_payload_path() -> str:
    import os

    return os.environ[FUNCTION_FILE_ENV]


# -- the flow's side -------------------------------------------------------------------------


def settings(cluster: Any = None, **overrides: Any) -> DistributedFunction:
    options: dict[str, Any] = {
        "replicas": 3,
        "cluster": cluster,
        "resources": {"cpu": 1, "memory": "1Gi"},
        "image": None,
        "dialect": "kubedl",
        "namespace": None,
        "env": {"EXTRA": "1"},
        "checkpoint_pvc": None,
        "process_group": "auto",
        "retry": {"max_attempts": 1},
        "timeouts": None,
        "name": None,
        "max_payload_bytes": 1024 * 1024,
    }
    return DistributedFunction(scaled, **{**options, **overrides})


def test_a_failed_job_becomes_an_error_naming_the_replica_rank_exit_code_and_last_line(
    tmp_path: Path,
) -> None:
    write_error(tmp_path, ReplicaError(2, "ValueError", "ValueError: bad shard", 1, 5.0))
    diagnosis = Diagnosis(
        FailureCategory.USER_CODE, False, "worker-1", 1, "exited with code 1", "read it"
    )
    failed = JobFailedError("training job scaled failed", diagnosis=diagnosis, retryable=False)
    error = settings()._replica_error(failed, tmp_path)
    assert isinstance(error, ReplicaFunctionError)
    assert isinstance(error, JobFailedError)
    assert (error.replica, error.rank, error.exit_code) == ("worker-1", 2, 1)
    assert error.message == (
        "function task 'scaled': replica worker-1 (rank 2 of 3) failed with exit code 1: "
        "ValueError: bad shard"
    )
    assert not error.retryable
    again = pickle.loads(pickle.dumps(error))
    assert (again.replica, again.last_line, again.diagnosis) == (
        "worker-1",
        error.last_line,
        diagnosis,
    )
    assert settings()._replica_error(failed, tmp_path / "none") is failed  # no record: as it is


def test_the_job_of_a_call_on_this_machine_runs_the_bootstrap_with_the_payload_file(
    tmp_path: Path,
) -> None:
    fn = settings(LocalCluster(workspace=str(tmp_path)))
    job = fn.training_job(([1.0], 2.0), {})
    spec = job.training_spec()
    assert spec.name == "scaled"
    assert spec.command == ["python", "-m", "kubedl_prefect.prefect.bootstrap"]
    assert {role.value: r.count for role, r in spec.replicas.items()} == {"master": 1, "worker": 2}
    env = {name: value.value for name, value in (spec.env or {}).items()}
    assert env["EXTRA"] == "1"
    assert Path(str(env[FUNCTION_FILE_ENV])).parent == tmp_path / "functions"
    assert FUNCTION_DATA_ENV not in env
    assert [replica_name(rank) for rank in range(3)] == ["master-0", "worker-0", "worker-1"]


def test_on_kubernetes_the_call_is_inline_an_image_is_required_and_the_job_renders(
    tmp_path: Path,
) -> None:
    cluster = KubernetesCluster(namespace="ml")
    with pytest.raises(KubeDLPrefectError, match="has no image"):
        settings(cluster).training_job(([1.0], 2.0), {})
    job = settings(cluster, image="ghcr.io/acme/trainer:1", checkpoint_pvc="ckpt").training_job(
        ([1.0], 2.0), {}
    )
    manifest = render(job.training_spec(), job.dialect)
    text = repr(manifest)
    assert "kubedl_prefect.prefect.bootstrap" in text
    assert FUNCTION_DATA_ENV in text
    assert "ckpt" in text
    with pytest.raises(FunctionPayloadTooLargeError) as caught:
        settings(cluster, image="x").training_job(([0.0] * 40_000, 2.0), {})
    assert caught.value.limit == MAX_INLINE_PAYLOAD_BYTES
    # rank 0's value comes back in the training container's termination message
    for role in manifest["spec"]["pytorchReplicaSpecs"].values():
        (container,) = role["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert container["terminationMessagePath"] == TERMINATION_MESSAGE_PATH
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert env[TERMINATION_MESSAGE_ENV] == TERMINATION_MESSAGE_PATH
    local = settings(LocalCluster(workspace=str(tmp_path))).training_job(([1.0], 2.0), {})
    assert "terminationMessagePath" not in repr(render(local.training_spec(), local.dialect))


def test_the_decorator_makes_a_prefect_task_whose_settings_survive_with_options(
    tmp_path: Path,
) -> None:
    @distributed_task(replicas=2, cluster=LocalCluster(workspace=str(tmp_path)), tags=["gpu"])
    def Train_Model(epochs: int) -> int:
        return epochs

    assert Train_Model.name == "Train_Model"
    assert "gpu" in Train_Model.tags
    assert function_of(Train_Model.with_options(retries=0)).spec_name == "train-model"
    job = distributed_job(Train_Model, 3)
    assert job.training_spec().name == "train-model"

    @distributed_task
    def bare() -> None:
        return None

    assert function_of(bare).replicas == 2

    @adistributed_task(replicas=3, cluster=LocalCluster(workspace=str(tmp_path)), tags=["gpu"])
    def Train_Model_Async(epochs: int) -> int:
        return epochs

    assert Train_Model_Async.isasync
    assert not Train_Model.isasync
    assert "gpu" in Train_Model_Async.tags
    assert function_of(Train_Model_Async.with_options(retries=0)).replicas == 3
    assert distributed_job(Train_Model_Async, 3).training_spec().name == "train-model-async"
    assert spec_name_for("_9lives", 2) == "fn-9lives"


@pytest.mark.parametrize(
    "module",
    [
        "kubedl_prefect.prefect.replica",
        "kubedl_prefect.prefect.bootstrap",
        "kubedl_prefect.prefect.functions",
    ],
)
def test_the_examples_in_the_docstrings_hold(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), raise_on_error=False)
    assert result.failed == 0


def test_neither_side_imports_torch_and_the_replicas_side_not_prefect_either() -> None:
    import subprocess
    import sys

    probe = (
        "import sys; import kubedl_prefect.prefect.bootstrap; "
        "replica = sorted({'torch', 'prefect'} & set(sys.modules)); "
        "import kubedl_prefect.prefect.functions; "
        "print(replica, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[]", "False"]
