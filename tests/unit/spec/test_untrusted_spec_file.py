"""Spec files named by untrusted input (a block's ``spec_file``): confined, never quoted
unless they are specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from spec_helpers import EXAMPLES

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import MAX_SPEC_BYTES, load_untrusted_spec

SPEC = "name: mnist\nimage: busybox:1.36\nreplicas: {master: 1, worker: 2}\n"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


SECRET = "root:$6$s3cr3t-hash:19000:0:99999:7:::\n"


def refused_file(path: str | Path, root: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_untrusted_spec(path, root=root)
    (issue,) = info.value.issues
    assert issue.path == "(file)"
    return issue.problem


def test_an_untrusted_spec_file_is_read_inside_its_root(tmp_path: Path) -> None:
    root = tmp_path / "project"
    write(root, "specs/mnist.yaml", (EXAMPLES / "pytorch-mnist.yaml").read_text())
    assert load_untrusted_spec("specs/mnist.yaml", root=root).name == "pytorch-mnist"
    assert load_untrusted_spec(root / "specs" / "mnist.yaml", root=root).name == "pytorch-mnist"


def test_an_untrusted_spec_file_outside_the_root_or_of_another_kind_is_not_read(
    tmp_path: Path,
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    shadow = write(tmp_path, "shadow", SECRET)
    key = write(tmp_path, "outside.yaml", "name: " + SECRET)
    (root / "link.yaml").symlink_to(key)
    write(root, "key.pem", SECRET)
    (root / "pem.yaml").symlink_to(root / "key.pem")
    for path, words in [
        (shadow, "only .yaml, .yml and .json files are read"),
        (root / "key.pem", "only .yaml, .yml and .json files are read"),
        (key, "outside the folder spec files are read from"),
        ("../outside.yaml", "outside the folder spec files are read from"),
        ("link.yaml", "outside the folder spec files are read from"),
        ("pem.yaml", "not a spec file"),
        ("specs", "only .yaml"),
    ]:
        problem = refused_file(path, root)
        assert words in problem
        assert "s3cr3t" not in problem


def test_a_file_that_is_not_a_spec_is_refused_without_quoting_it(tmp_path: Path) -> None:
    root = tmp_path
    kubeconfig = (
        "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: s3cr3t-token}\n"
    )
    for name, text, words in [
        ("kubeconfig.yaml", kubeconfig, "is not a spec document"),
        ("shadow.yaml", SECRET, "is not a spec document"),
        ("creds.json", '{"private_key": "s3cr3t", "client_email": "x"}', "is not a spec document"),
        ("broken.yml", "token: s3cr3t\n  bad: [\n", "not valid YAML"),
        ("dir.yaml/", "", "is not a file"),
    ]:
        if name.endswith("/"):
            (root / name).mkdir()
        else:
            write(root, name, text)
        problem = refused_file(name.rstrip("/"), root)
        assert words in problem
        assert "s3cr3t" not in problem
    big = write(root, "big.yaml", "name: x\n" + "#" * MAX_SPEC_BYTES)
    assert "at most" in refused_file(big.name, root)


def test_a_spec_file_is_quoted_once_it_parsed_as_a_spec(tmp_path: Path) -> None:
    write(
        tmp_path,
        "spec.yaml",
        SPEC.replace("busybox:1.36", "busybox:1.36\nimagePullPolicy: Sometimes"),
    )
    with pytest.raises(SpecError) as info:
        load_untrusted_spec("spec.yaml", root=tmp_path)
    (issue,) = info.value.issues
    assert issue.path == "imagePullPolicy"
    assert "'Sometimes'" in issue.problem
    assert "(line 3)" in issue.problem


def test_the_root_defaults_to_the_working_directory_or_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "a/spec.yaml", SPEC)
    monkeypatch.chdir(tmp_path / "a")
    assert load_untrusted_spec("spec.yaml").name == "mnist"
    monkeypatch.setenv("KUBEDL_PREFECT_SPEC_ROOT", str(tmp_path / "b"))
    (tmp_path / "b").mkdir()
    with pytest.raises(SpecError, match="outside the folder"):
        load_untrusted_spec(tmp_path / "a" / "spec.yaml")


def test_a_path_with_control_characters_is_shown_escaped(tmp_path: Path) -> None:
    problem = refused_file("x\nerror: forged.txt", tmp_path)
    assert "\n" not in problem
    assert problem.startswith("'x\\nerror: forged.txt' is not a spec file")
