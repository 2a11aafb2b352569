"""Local serving's own logic: the server environment, V2 requests, start-up, readiness, stop.

The real model server (MLServer) is exercised in tests/integration/test_local_serving.py; here a
stand-in ``mlserver`` executable (a small HTTP server speaking the V2 endpoints the module uses,
with a child process of its own, optionally deaf to SIGTERM) drives the process handling, and a
stand-in ``uv`` the environment's installation.
"""

from __future__ import annotations

import doctest
import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest

import kubedl_prefect.serving.local as local
from kubedl_prefect.errors import LocalServerError
from kubedl_prefect.serving.local import (
    install_server_environment,
    serve_locally,
    server_environment,
    v2_request,
)

FAKE_MLSERVER = textwrap.dedent(
    """\
    #!{python}
    # A stand-in for `mlserver start FOLDER`: V2 ready/metadata/infer on the settings' port.
    import json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from pathlib import Path

    folder = Path(sys.argv[2])
    settings = json.loads((folder / "settings.json").read_text())
    model = json.loads((folder / "model-settings.json").read_text())
    name = model["name"]
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "crash":
        print("cannot load", model["parameters"]["uri"], flush=True)
        sys.exit(3)
    if mode == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(folder, "child.pid").write_text(str(child.pid))
    Path(folder, "env.json").write_text(json.dumps(dict(os.environ)))
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == f"/v2/models/{{name}}/ready":
                ready = mode != "never" and time.monotonic() - started > 0.5
                self.answer(200 if ready else 503, {{}})
            elif self.path == f"/v2/models/{{name}}":
                self.answer(200, {{"name": name, "platform": "fake"}})
            else:
                self.answer(404, {{"error": "no such path"}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            (tensor,) = body["inputs"]
            rows, width = tensor["shape"]
            if width != 2:
                self.answer(400, {{"error": "expected 2 features"}})
                return
            data = tensor["data"]
            sums = [data[i * width] + data[i * width + 1] for i in range(rows)]
            self.answer(200, {{"model_name": name, "outputs": [
                {{"name": "output-1", "shape": [rows, 1], "datatype": "FP32", "data": sums}}]}})

    HTTPServer(("127.0.0.1", settings["http_port"]), Handler).serve_forever()
    """
)


@pytest.fixture
def fake_environment(tmp_path: Path) -> Path:
    home = tmp_path / "env"
    (home / "bin").mkdir(parents=True)
    script = home / "bin" / "mlserver"
    script.write_text(FAKE_MLSERVER.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return home


def tree_of(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def test_docstring_examples_run() -> None:
    result = doctest.testmod(local)
    assert result.attempted > 0
    assert result.failed == 0


def test_rows_become_one_fp32_tensor_and_v2_requests_pass_through() -> None:
    assert v2_request([[1, 2], [3, 4.5]]) == {
        "inputs": [{"name": "input-0", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4.5]}]
    }
    assert v2_request(np.array([[0.5, 1.0]], dtype=np.float32))["inputs"][0]["data"] == [0.5, 1.0]
    assert v2_request([1.0, 2.0])["inputs"][0]["shape"] == [2, 1]
    request = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]}
    assert v2_request(request) == request


@pytest.mark.parametrize("payload", [[], "text", [[1, 2], [3]], [[]], [["a", "b"]], None])
def test_payloads_that_are_not_rows_of_numbers_are_refused(payload: object) -> None:
    with pytest.raises(LocalServerError):
        v2_request(payload)


def test_the_environment_follows_the_requirements_digest_or_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(local.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    one = tmp_path / "one.txt"
    one.write_text("mlserver==1.7.1\n")
    two = tmp_path / "two.txt"
    two.write_text("mlserver==1.7.2\n")
    assert server_environment(one).parent == tmp_path / "cache" / "kubedl-prefect" / "mlserver"
    assert server_environment(one) != server_environment(two)
    assert server_environment(one) == server_environment(one)
    monkeypatch.setenv(local.ENVIRONMENT_VARIABLE, str(tmp_path / "mine"))
    assert server_environment(one) == tmp_path / "mine"


def fake_uv(tmp_path: Path, *, fail: bool = False) -> Path:
    """A ``uv`` that records its calls and makes ``bin/mlserver`` at ``pip install``."""
    calls = tmp_path / "uv-calls.jsonl"
    script = tmp_path / "uv"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import json, sys
            from pathlib import Path
            with open({str(calls)!r}, "a") as out:
                out.write(json.dumps(sys.argv[1:]) + "\\n")
            if sys.argv[1] == "venv":
                Path(sys.argv[-1], "bin").mkdir(parents=True)
                Path(sys.argv[-1], "bin", "python").write_text("")
            elif {fail!r}:
                print("No solution found when resolving dependencies", file=sys.stderr)
                sys.exit(1)
            else:
                python = Path(sys.argv[sys.argv.index("--python") + 1])
                python.with_name("mlserver").write_text("")
            """
        )
    )
    script.chmod(0o755)
    return script


def test_the_environment_is_installed_once_from_the_pinned_requirements(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path)
    home = tmp_path / "env"
    assert install_server_environment(home, uv=str(uv), python="3.11") == home
    assert (home / "bin" / "mlserver").exists()
    calls = [json.loads(line) for line in (tmp_path / "uv-calls.jsonl").read_text().splitlines()]
    assert calls[0][:1] == ["venv"]
    assert "3.11" in calls[0]
    assert calls[1][:2] == ["pip", "install"]
    assert str(local.MLSERVER_REQUIREMENTS) in calls[1]
    install_server_environment(home, uv=str(uv))  # installed: nothing runs
    assert len((tmp_path / "uv-calls.jsonl").read_text().splitlines()) == 2


def test_a_failed_installation_says_what_uv_said_and_is_redone_next_time(tmp_path: Path) -> None:
    home = tmp_path / "env"
    with pytest.raises(LocalServerError) as caught:
        install_server_environment(home, uv=str(fake_uv(tmp_path, fail=True)))
    assert "No solution found" in caught.value.log_tail
    assert "exited with 1" in caught.value.message
    install_server_environment(home, uv=str(fake_uv(tmp_path)))
    assert (home / "bin" / "mlserver").exists()


def test_serving_without_the_environment_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(LocalServerError) as caught:
        serve_locally("models:/m/1", tracking_uri="http://127.0.0.1:1", environment=tmp_path)
    assert caught.value.hint is not None
    assert "install_server_environment" in caught.value.hint


def test_the_server_starts_on_loopback_answers_and_stop_ends_its_whole_tree(
    fake_environment: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", "/somewhere/.venv")
    server = serve_locally(
        "models:/spirals/3",
        tracking_uri="http://user:s3cret@127.0.0.1:5000",
        name="spirals",
        environment=fake_environment,
        workdir=tmp_path / "serve",
        env={"MLFLOW_TRACKING_TOKEN": "t0ken"},
    )
    try:
        assert server.ready()
        assert server.url.startswith("http://127.0.0.1:")
        assert server.infer_url == f"{server.url}/v2/models/spirals/infer"
        settings = json.loads((server.workdir / "model-settings.json").read_text())
        assert settings["parameters"] == {"uri": "models:/spirals/3"}
        assert settings["implementation"] == "mlserver_mlflow.MLflowRuntime"
        env = json.loads((server.workdir / "env.json").read_text())
        assert env["MLFLOW_TRACKING_URI"] == "http://user:s3cret@127.0.0.1:5000"
        assert env["MLFLOW_TRACKING_TOKEN"] == "t0ken"
        assert "VIRTUAL_ENV" not in env  # the caller's environment does not leak in
        answer = server.predict([[1.0, 2.0], [0.5, 0.25]])
        assert answer["outputs"][0]["data"] == [3.0, 0.75]
        assert server.metadata()["name"] == "spirals"
        with pytest.raises(LocalServerError, match="answered 400"):
            server.predict([[1.0, 2.0, 3.0]])
        tree = tree_of(server.pid)
        assert len(tree) == 2  # the server and its child
    finally:
        server.stop()
    _, alive = psutil.wait_procs(tree, timeout=0)
    assert not alive
    assert (tmp_path / "serve" / "mlserver.log").exists()  # a given workdir is kept
    with pytest.raises(LocalServerError, match="has exited"):
        server.predict([[1.0, 2.0]])


def test_a_server_deaf_to_sigterm_is_killed_after_the_grace_period(
    fake_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "deaf")
    with serve_locally(
        "models:/m/1", tracking_uri="http://127.0.0.1:1", environment=fake_environment
    ) as server:
        tree = tree_of(server.pid)
        workdir = server.workdir
        server.stop(grace_s=1.0)
    _, alive = psutil.wait_procs(tree, timeout=0)
    assert not alive
    assert not workdir.exists()  # a temporary workdir goes with the server


def test_a_server_that_exits_fails_with_its_log_and_no_password(
    fake_environment: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "crash")
    with pytest.raises(LocalServerError) as caught:
        serve_locally(
            "models:/m/9",
            tracking_uri="http://me:hunter2@127.0.0.1:1",
            environment=fake_environment,
            workdir=tmp_path / "w",
        )
    message = str(caught.value)
    assert "exited with code 3" in message
    assert "cannot load models:/m/9" in caught.value.log_tail
    assert "hunter2" not in message
    assert "http://***@127.0.0.1:1" in message


def test_a_server_that_never_gets_ready_is_stopped_at_the_deadline(
    fake_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "never")
    before = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    with pytest.raises(LocalServerError, match="not ready after 2 s"):
        serve_locally(
            "models:/m/1",
            tracking_uri="http://127.0.0.1:1",
            environment=fake_environment,
            ready_timeout_s=2.0,
        )
    after = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    assert after <= before


def test_uv_is_found_in_this_environment_when_it_is_not_on_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker started as `.venv/bin/python -m ...` has no .venv/bin on PATH; the extra's uv
    # package still knows where its binary is.
    monkeypatch.setenv("PATH", "/nonexistent")
    found = local.uv_executable()
    assert found is not None
    assert Path(found).name == "uv"
    assert os.access(found, os.X_OK)


def test_without_uv_anywhere_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "uv_executable", lambda: None)
    with pytest.raises(LocalServerError) as raised:
        local.install_server_environment(tmp_path / "env")
    assert "local-serving" in (raised.value.hint or "")
