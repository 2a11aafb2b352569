"""KServe's images on the process node: the local storage initializer and the image mappings."""

from __future__ import annotations

import doctest
import http.server
import logging
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubedl_prefect.serving.local import server_environment
from kubedl_prefect.testbed.nodeagent import podspec, storage_initializer
from kubedl_prefect.testbed.nodeagent.images import STORAGE_INITIALIZER_MODULE
from kubedl_prefect.testbed.nodeagent.storage_initializer import main

VENV = Path("/v")
FACTS = podspec.PodFacts(pod_ip="169.254.104.7", host_ip="127.0.0.1", venv=VENV)


def test_docstring_examples() -> None:
    result = doctest.testmod(storage_initializer)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """An MLflow model's artifact folder."""
    folder = tmp_path / "store" / "1" / "models" / "m-ab" / "artifacts"
    folder.mkdir(parents=True)
    (folder / "MLmodel").write_text("flavors: {}\n")
    (folder / "data").mkdir()
    (folder / "data" / "model.pth").write_bytes(b"weights")
    return folder


def test_a_file_uri_is_copied_into_the_destination(model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "mnt" / "models"
    assert main([f"file://{model}", str(dest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["MLmodel", "data"]
    assert not (dest / "MLmodel").is_symlink()  # MLflow 3 refuses linked model files
    assert (dest / "MLmodel").read_text() == "flavors: {}\n"
    assert (dest / "data" / "model.pth").read_bytes() == b"weights"


def test_a_single_archive_is_unpacked(model: Path, tmp_path: Path) -> None:
    packed = tmp_path / "packed"
    packed.mkdir()
    with tarfile.open(packed / "model.tar.gz", "w:gz") as archive:
        archive.add(model / "MLmodel", arcname="MLmodel")
    dest = tmp_path / "models"
    assert main([f"file://{packed}", str(dest)]) == 0
    assert [p.name for p in dest.iterdir()] == ["MLmodel"]
    assert not (dest / "MLmodel").is_symlink()


@pytest.fixture
def file_server(model: Path) -> Iterator[str]:
    """A real HTTP server on loopback serving the model's folder."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(model), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_http_uri_is_downloaded(file_server: str, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    assert main([f"{file_server}/MLmodel", str(dest)]) == 0
    assert (dest / "MLmodel").read_text() == "flavors: {}\n"
    assert main([f"{file_server}/missing.bin", str(tmp_path / "other")]) == 1


def test_what_cannot_be_fetched_fails_with_exit_code_1_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO, logger="kserve.storage-initializer"):
        assert main(["s3://ml/1/models/m-ab/artifacts", str(tmp_path / "a")]) == 1
        assert main([f"file://{tmp_path}/nothing", str(tmp_path / "b")]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors[0].startswith(
        "Storage initialization failed: Cannot recognize storage type for s3://ml/"
    )
    assert (
        errors[1]
        == f"Storage initialization failed: Local path file://{tmp_path}/nothing does not exist."
    )
    assert main(["file:///x"]) == 1
    assert capsys.readouterr().out.startswith("Usage: initializer-entrypoint src_uri_0 dest_path_0")


def test_kserves_images_run_their_entry_points_in_their_environments() -> None:
    pod = {"metadata": {"name": "fraud-predictor-abc", "namespace": "ml"}, "spec": {}}
    initializer = podspec.plan_container(
        {
            "name": "storage-initializer",
            "image": "kserve/storage-initializer:v0.20.0",
            "args": ["file:///store/m", "/mnt/models"],
        },
        pod,
        FACTS,
        secrets={},
        config_maps={},
    )
    server = podspec.plan_container(
        {"name": "kserve-container", "image": "docker.io/seldonio/mlserver:1.7.1"},
        pod,
        FACTS,
        secrets={},
        config_maps={},
    )

    assert isinstance(initializer, podspec.ContainerPlan)
    assert initializer.argv == (
        "/v/bin/python",
        "-m",
        STORAGE_INITIALIZER_MODULE,
        "file:///store/m",
        "/mnt/models",
    )
    assert isinstance(server, podspec.ContainerPlan)
    assert server.argv == ("/bin/sh", "-c", 'exec mlserver start "$MLSERVER_MODELS_DIR"')
    assert server.env["MLSERVER_MODELS_DIR"] == "/mnt/models"
    assert server.env["PATH"].split(":")[0] == str(server_environment() / "bin")
