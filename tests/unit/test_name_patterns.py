"""Name checks outside the spec take the whole text: a trailing newline is not a name."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubedl_prefect.errors import LocalServerError, RegistryError
from kubedl_prefect.registry.uris import parse_model_uri
from kubedl_prefect.serving.local import serve_locally
from kubedl_prefect.serving.spec import InferenceServiceSpec


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"name": "fraud\n"}, "name"),
        ({"namespace": "ml\n"}, "namespace"),
        ({"service_account": "server\n"}, "serviceAccount"),
        ({"env": {"LOG\n": "1"}}, "env.LOG\n"),
    ],
)
def test_inference_service_names_with_a_trailing_newline_are_refused(
    fields: dict[str, object], path: str
) -> None:
    assert InferenceServiceSpec(name="fraud", storage_uri="pvc://store/m").issues() == []
    spec = InferenceServiceSpec(**{"name": "fraud", "storage_uri": "pvc://store/m", **fields})
    assert path in [issue.path for issue in spec.issues()]


@pytest.mark.parametrize("uri", ["models:/fraud/3\n", "models:/fraud@champion\n", "models:/m-1a\n"])
def test_registry_uris_with_a_trailing_newline_are_refused(uri: str) -> None:
    parse_model_uri(uri.rstrip("\n"))
    with pytest.raises(RegistryError, match="is not a registry URI"):
        parse_model_uri(uri)


def test_a_local_model_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(LocalServerError, match="is not a DNS-1123 label"):
        serve_locally("models:/fraud/1", tracking_uri="http://127.0.0.1:5000", name="fraud\n")


def test_only_a_bare_python_command_is_swapped_for_the_interpreter() -> None:
    from kubedl_prefect.lifecycle.local.contract import resolve_argv

    assert resolve_argv(["python3", "train.py"], "/venv/bin/python") == (
        "/venv/bin/python",
        "train.py",
    )
    assert resolve_argv(["python3\n", "train.py"], "/venv/bin/python") == ("python3\n", "train.py")


def test_a_device_name_with_a_trailing_newline_is_no_gpu(tmp_path: Path) -> None:
    from kubedl_prefect.lifecycle.local.capacity import gpu_ids

    (tmp_path / "nvidia0").touch()
    (tmp_path / "nvidia1\n").touch()
    (tmp_path / "nvidiactl").touch()
    assert gpu_ids(tmp_path) == [0]
