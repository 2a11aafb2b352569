"""Each kind of credentials connects (to the in-memory API server), and no secret leaks.

The HTTPS cases use the fake server with its own CA, so TLS verification (the CA as PEM text, as
a file, from a kubeconfig, from the ServiceAccount mount) is exercised for real.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kubedl_prefect.errors import ForbiddenError, KubeConnectionError, UnauthenticatedError
from kubedl_prefect.kube import credentials as credentials_module
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import (
    BearerToken,
    Credentials,
    InCluster,
    KubeconfigContent,
    KubeconfigFile,
    connect,
)
from kubedl_prefect.kube.resources import PODS
from tests.support.fakeapi import FakeKubeAPI

SECRET = "s3cr3t-token-value-0123456789"


@pytest.fixture
async def tls_api() -> AsyncIterator[FakeKubeAPI]:
    async with FakeKubeAPI(tls=True, token=SECRET) as server:
        yield server


async def lists_pods(credentials: Credentials) -> KubeClient:
    """Connect, list pods (a real authenticated request), and return the closed client."""
    client = await connect(credentials)
    try:
        assert (await client.list(PODS, "ns")).items == []
    finally:
        await client.close()
    return client


def assert_hidden(error: BaseException, *secrets: str) -> None:
    text = f"{error!s} {error!r} {getattr(error, 'hint', '')}"
    for secret in secrets:
        assert secret not in text


# -- each kind connects ------------------------------------------------------------------------


async def test_bearer_token_over_http(fake_api: FakeKubeAPI) -> None:
    credentials = BearerToken(server=fake_api.url + "/", token=fake_api.token)
    client = await lists_pods(credentials)
    assert client.server == fake_api.url
    assert client.cluster_id == credentials.session_key()
    assert fake_api.counts["list"] == 1


async def test_bearer_token_over_https_with_the_ca_as_text_or_file(tls_api: FakeKubeAPI) -> None:
    assert tls_api.ca_pem is not None
    await lists_pods(BearerToken(server=tls_api.url, token=SECRET, ca_cert=tls_api.ca_pem))
    await lists_pods(BearerToken(server=tls_api.url, token=SECRET, ca_file=tls_api.ca_file))
    await lists_pods(BearerToken(server=tls_api.url, token=SECRET, insecure_skip_tls_verify=True))
    assert tls_api.counts["list"] == 3


async def test_a_token_is_never_sent_in_clear_text_off_this_machine() -> None:
    for server in ("http://k8s.example:6443", "http://10.0.0.1", "HTTP://[2001:db8::1]:8080"):
        with pytest.raises(KubeConnectionError, match="in clear text") as refused:
            await connect(BearerToken(server=server, token=SECRET))
        assert "https://" in (refused.value.hint or "")
        assert not refused.value.retryable
        assert_hidden(refused.value, SECRET)


async def test_a_token_over_http_to_a_loopback_address_is_accepted() -> None:
    # kubectl proxy, a port-forward: the token never leaves the machine.
    for server in ("http://127.0.0.1:8001", "http://localhost:8001", "http://[::1]:8001"):
        client = await connect(BearerToken(server=server, token=SECRET))
        await client.close()


async def test_skipping_tls_verification_is_warned_once_and_not_mixed_with_a_ca(
    tls_api: FakeKubeAPI, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credentials_module, "_warned_insecure", set())  # another test's server
    insecure = BearerToken(server=tls_api.url, token=SECRET, insecure_skip_tls_verify=True)
    with caplog.at_level(logging.WARNING, logger=credentials_module.__name__):
        await lists_pods(insecure)
        await lists_pods(insecure)
    warned = [r for r in caplog.records if "TLS verification is off" in r.getMessage()]
    assert len(warned) == 1
    assert tls_api.url in warned[0].getMessage()
    assert SECRET not in caplog.text
    assert tls_api.ca_pem is not None
    with pytest.raises(KubeConnectionError, match="insecure_skip_tls_verify and a CA"):
        await connect(replace(insecure, ca_cert=tls_api.ca_pem))


async def test_an_unknown_ca_fails_the_first_request_without_the_token(
    tls_api: FakeKubeAPI,
) -> None:
    client = await connect(BearerToken(server=tls_api.url, token=SECRET))
    try:
        with pytest.raises(KubeConnectionError, match="cannot reach the API server") as failed:
            await client.list(PODS, "ns")
    finally:
        await client.close()
    assert failed.value.retryable
    assert_hidden(failed.value, SECRET)
    assert tls_api.counts["list"] == 0


async def test_a_wrong_token_is_unauthenticated_not_forbidden(fake_api: FakeKubeAPI) -> None:
    client = await connect(BearerToken(server=fake_api.url, token="wrong-" + SECRET))
    try:
        with pytest.raises(UnauthenticatedError) as refused:
            await client.list(PODS, "ns")
    finally:
        await client.close()
    assert not isinstance(refused.value, ForbiddenError)
    assert refused.value.status == 401
    assert not refused.value.retryable
    hint = refused.value.hint or ""
    assert "expired" in hint
    assert "invalid" in hint
    assert "rbac" not in hint.lower()
    assert_hidden(refused.value, SECRET)


async def test_a_missing_permission_is_forbidden_with_the_rbac_hint(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    fake_api.fail_next("list", "/api/v1", 403, "Forbidden")
    with pytest.raises(ForbiddenError) as refused:
        await fake_client.list(PODS, "ns")
    assert refused.value.status == 403
    assert "deploy/rbac.yaml" in (refused.value.hint or "")


async def test_kubeconfig_content_with_a_token_user_and_embedded_ca(tls_api: FakeKubeAPI) -> None:
    content = tls_api.kubeconfig()
    client = await lists_pods(KubeconfigContent(content))
    assert client.server == tls_api.url
    assert client.cluster_id == KubeconfigContent(content).session_key()
    assert tls_api.count("list") == 1


async def test_kubeconfig_file_from_a_path_and_from_kubeconfig_env(
    fake_api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config"
    path.write_text(fake_api.kubeconfig())
    monkeypatch.chdir(tmp_path)
    relative = KubeconfigFile("config")
    assert relative.paths() == (str(path),)
    client = await lists_pods(relative)
    assert client.cluster_id == f"kubeconfig-file:{path}#"
    assert client.server == fake_api.url

    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{path}")
    from_env = KubeconfigFile(context="fake")
    assert from_env.paths() == (str(tmp_path / "missing"), str(path))
    await lists_pods(from_env)
    legacy = await KubeClient.from_kubeconfig(str(path))
    try:
        assert legacy.cluster_id == KubeconfigFile(str(path)).session_key()
        assert (await legacy.list(PODS, "ns")).items == []
    finally:
        await legacy.close()


async def test_in_cluster_service_account(
    tls_api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls_api.ca_pem is not None
    (tmp_path / "token").write_text(SECRET)
    (tmp_path / "ca.crt").write_text(tls_api.ca_pem)
    monkeypatch.setattr(credentials_module, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", tls_api.url.rsplit(":", 1)[1])
    client = await lists_pods(InCluster())
    assert client.server == tls_api.url
    assert client.cluster_id == "in-cluster"
    legacy = KubeClient.from_incluster()
    try:
        assert (await legacy.list(PODS, "ns")).items == []
    finally:
        await legacy.close()


# -- secrets stay secret -----------------------------------------------------------------------


def test_repr_str_and_session_keys_hide_secrets(fake_api: FakeKubeAPI) -> None:
    token = BearerToken(server="https://k8s.example:6443", token=SECRET, ca_cert="PEM")
    content = KubeconfigContent(fake_api.kubeconfig(token=SECRET), context="fake")
    for credentials in (token, content):
        for text in (repr(credentials), str(credentials), credentials.session_key()):
            assert SECRET not in text
    assert "https://k8s.example:6443" in repr(token)
    assert repr(content) == (
        f"KubeconfigContent(content=<{len(content.content)} characters>, context='fake', "
        "trusted=False)"
    )


def test_session_keys_are_stable_and_differ_per_identity(tmp_path: Path) -> None:
    server = "https://k8s.example:6443"
    assert BearerToken(server, SECRET).session_key() == BearerToken(server, SECRET).session_key()
    assert BearerToken(server, SECRET).session_key() != BearerToken(server, "other").session_key()
    assert (
        BearerToken(server, SECRET).session_key()
        != BearerToken("https://other:6443", SECRET).session_key()
    )
    assert BearerToken(server, SECRET).session_key().startswith(f"bearer-token:{server}#")
    assert KubeconfigContent("a").session_key() != KubeconfigContent("b").session_key()
    assert (
        KubeconfigContent("a").session_key()
        != KubeconfigContent("a", context="other").session_key()
    )
    # A client made from trusted content is never handed to the same content untrusted.
    assert (
        KubeconfigContent("a").session_key() != KubeconfigContent("a", trusted=True).session_key()
    )
    assert KubeconfigFile(str(tmp_path / "x"), "ctx").session_key() == (
        f"kubeconfig-file:{tmp_path / 'x'}#ctx"
    )
    assert InCluster().session_key() == "in-cluster"


# -- bad input: our errors, with a hint, without secrets -----------------------------------------


@pytest.mark.parametrize(
    ("credentials", "problem"),
    [
        (BearerToken(server="k8s.example:6443", token=SECRET), "not an http"),
        (BearerToken(server=f"https://user:{SECRET}@k8s.example", token="t"), "user info"),
        (BearerToken(server="https://k8s.example", token="  "), "token is empty"),
        (
            BearerToken(server="https://k8s.example", token=SECRET, ca_cert="x", ca_file="y"),
            "both ca_cert and ca_file",
        ),
        (BearerToken(server="https://k8s.example", token=SECRET, ca_file="/nope"), "not exist"),
        (BearerToken(server="https://k8s.example", token=SECRET, ca_cert="junk"), "not a PEM"),
        (KubeconfigContent(f"users: [{{token: {SECRET}\n"), "invalid YAML: .* at line"),
        (KubeconfigContent("users: [{user: {password: on}}]\n"), "invalid YAML: .* line 1"),
        (KubeconfigContent(f"just-a-string-{SECRET}"), "not a kubeconfig"),
        (KubeconfigFile("/nonexistent/kubeconfig"), "no such file"),
    ],
)
async def test_unusable_credentials_raise_our_error_with_a_hint(
    credentials: Credentials, problem: str
) -> None:
    with pytest.raises(KubeConnectionError, match=problem) as failed:
        await connect(credentials)
    assert failed.value.hint
    assert not failed.value.retryable
    assert_hidden(failed.value, SECRET)
    assert failed.value.__cause__ is None, "the loader's exception may quote the secret"


async def test_an_unknown_context_lists_the_known_ones(fake_api: FakeKubeAPI) -> None:
    content = fake_api.kubeconfig(token=SECRET)
    with pytest.raises(KubeConnectionError) as failed:
        await connect(KubeconfigContent(content, context="prod"))
    assert "its contexts are: fake" in str(failed.value.hint)
    assert_hidden(failed.value, SECRET)


async def test_a_kubeconfig_whose_user_data_is_broken_does_not_quote_it(tmp_path: Path) -> None:
    document = yaml.safe_load(
        FakeKubeAPI(token=SECRET).kubeconfig().replace("http://127.0.0.1:0", "https://k8s:1")
    )
    document["users"][0]["user"]["client-certificate-data"] = base64.b64encode(
        SECRET.encode()
    ).decode()
    document["users"][0]["user"]["client-key-data"] = base64.b64encode(SECRET.encode()).decode()
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(document))
    for credentials in (KubeconfigFile(str(path)), KubeconfigContent(path.read_text())):
        with pytest.raises(KubeConnectionError, match="TLS material") as failed:
            await connect(credentials)
        assert_hidden(failed.value, SECRET)
        assert failed.value.hint


async def test_in_cluster_outside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(credentials_module, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    with pytest.raises(KubeConnectionError, match="not running in a Kubernetes pod") as failed:
        await connect(InCluster())
    assert "KubeconfigFile" in str(failed.value.hint)
    with pytest.raises(KubeConnectionError, match="not running in a Kubernetes pod"):
        KubeClient.from_incluster()


async def test_something_else_is_refused() -> None:
    with pytest.raises(KubeConnectionError, match="not Kubernetes credentials: str"):
        await connect("https://k8s.example")  # type: ignore[arg-type]


# -- kubeconfig content is data, not code ------------------------------------------------------


def exec_user(marker: Path, token: str) -> dict[str, object]:
    """A kubeconfig user whose exec plugin leaves ``marker`` and prints ``token``."""
    credential = json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "kind": "ExecCredential",
            "status": {"token": token},
        }
    )
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "/bin/sh",
            "args": ["-c", f"touch {marker}; echo '{credential}'"],
        }
    }


def with_user(fake_api: FakeKubeAPI, user: dict[str, object]) -> str:
    document = yaml.safe_load(fake_api.kubeconfig())
    document["users"][0]["user"] = user
    return yaml.safe_dump(document)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("user", "exec", {"apiVersion": "client.authentication.k8s.io/v1", "command": "id"}),
        ("user", "auth-provider", {"name": "gcp", "config": {"cmd-path": "/usr/bin/id"}}),
        ("user", "tokenFile", "/var/run/secrets/kubernetes.io/serviceaccount/token"),
        ("user", "client-certificate", "/etc/kubernetes/pki/admin.crt"),
        ("user", "client-key", "/etc/kubernetes/pki/admin.key"),
        ("cluster", "certificate-authority", "/etc/kubernetes/pki/ca.crt"),
    ],
)
async def test_kubeconfig_content_may_not_run_commands_or_read_files(
    fake_api: FakeKubeAPI, section: str, key: str, value: object
) -> None:
    document = yaml.safe_load(fake_api.kubeconfig(token=SECRET))
    entry = document["users" if section == "user" else "clusters"][0]
    entry[section][key] = value
    with pytest.raises(KubeConnectionError) as refused:
        await connect(KubeconfigContent(yaml.safe_dump(document)))
    name = entry["name"]
    assert f"{section} {name!r} has {key}" in refused.value.message
    assert "trust_kubeconfig" in (refused.value.hint or "")
    assert "--flatten" in (refused.value.hint or "")
    assert not refused.value.retryable
    assert_hidden(refused.value, SECRET)
    assert fake_api.counts["list"] == 0


async def test_an_exec_plugin_runs_only_when_the_content_is_trusted(
    fake_api: FakeKubeAPI, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    content = with_user(fake_api, exec_user(marker, fake_api.token))
    with pytest.raises(KubeConnectionError, match="user 'fake-user' has exec"):
        await connect(KubeconfigContent(content))
    assert not marker.exists()
    await lists_pods(KubeconfigContent(content, trusted=True))
    assert marker.exists()


async def test_a_kubeconfig_file_of_this_machine_may_use_exec_and_token_files(
    fake_api: FakeKubeAPI, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "config"
    path.write_text(with_user(fake_api, exec_user(marker, fake_api.token)))
    await lists_pods(KubeconfigFile(str(path)))
    assert marker.exists()
    (tmp_path / "token").write_text(fake_api.token)
    path.write_text(with_user(fake_api, {"tokenFile": str(tmp_path / "token")}))
    await lists_pods(KubeconfigFile(str(path)))


async def test_a_kubeconfig_alias_bomb_is_refused_at_once() -> None:
    levels = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 8)]
    bomb = "\n".join(
        [
            "apiVersion: v1",
            *levels,
            "clusters: [{name: c, cluster: {server: 'https://k:6443'}}]",
            "users: [{name: u, user: {token: t, lol: *l7}}]",
            "contexts: [{name: x, context: {cluster: c, user: u}}]",
        ]
    )
    started = time.monotonic()
    with pytest.raises(KubeConnectionError, match="more than 100,000 nodes") as refused:
        await connect(KubeconfigContent(bomb, context="missing"))
    assert time.monotonic() - started < 3
    assert refused.value.hint


async def test_reading_kubeconfig_content_leaves_the_event_loop_running() -> None:
    filler = ", ".join(["a"] * 99_000)  # just under the node limit: a long read, refused after
    content = f"apiVersion: v1\nkind: Config\nclusters: []\npreferences: {{filler: [{filler}]}}\n"
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker is waiting on its first sleep
    started = ticks
    try:
        with pytest.raises(KubeConnectionError, match="no clusters"):
            await connect(KubeconfigContent(content))
        during = ticks - started
    finally:
        ticker.cancel()
    # Read on the loop, the document would stop the ticker for the whole read (0 ticks).
    assert during >= 3


async def test_kubeconfig_content_over_the_size_limit_is_refused() -> None:
    content = "apiVersion: v1\n# " + "x" * (credentials_module.MAX_KUBECONFIG_BYTES + 1) + "\n"
    with pytest.raises(KubeConnectionError, match=r"at most 1\.0 MiB") as refused:
        await connect(KubeconfigContent(content))
    assert "--minify" in (refused.value.hint or "")
