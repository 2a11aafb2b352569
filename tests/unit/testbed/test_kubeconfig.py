"""Kubeconfig files: embedded credentials, owner-only permissions."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from kubedl_prefect.testbed.kubeconfig import render_kubeconfig, write_kubeconfig


def test_client_certificate_kubeconfig_embeds_everything(tmp_path: Path) -> None:
    ca, crt, key = (tmp_path / n for n in ("ca.crt", "c.crt", "c.key"))
    for path in (ca, crt, key):
        path.write_bytes(f"pem of {path.name}".encode())
    document = render_kubeconfig(
        cluster="c", server="https://127.0.0.1:1", ca_file=ca, user="u", client_cert=(crt, key)
    )
    path = write_kubeconfig(tmp_path / "out" / "kubeconfig", document)
    loaded = yaml.safe_load(path.read_text())
    cluster = loaded["clusters"][0]["cluster"]
    user = loaded["users"][0]["user"]
    assert cluster["server"] == "https://127.0.0.1:1"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"pem of ca.crt"
    assert base64.b64decode(user["client-certificate-data"]) == b"pem of c.crt"
    assert base64.b64decode(user["client-key-data"]) == b"pem of c.key"
    assert loaded["current-context"] == "c"
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_token_kubeconfig_presets_the_namespace(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"ca")
    document = render_kubeconfig(
        cluster="c", server="https://x", ca_file=ca, user="sa", token="t0k", namespace="ns"
    )
    assert document["users"][0]["user"] == {"token": "t0k"}
    assert document["contexts"][0]["context"] == {"cluster": "c", "user": "sa", "namespace": "ns"}
