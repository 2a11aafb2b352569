"""Each kind of credentials connects (to the in-memory API server), and no secret leaks.

The HTTPS cases use the fake server with its own CA, so TLS verification (the CA as PEM text, as
a file, from a kubeconfig, from the ServiceAccount mount) is exercised for real.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from kubedl_prefect.errors import ForbiddenError, KubeConnectionError
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


async def test_a_wrong_token_is_refused_by_the_server(fake_api: FakeKubeAPI) -> None:
    client = await connect(BearerToken(server=fake_api.url, token="wrong-" + SECRET))
    try:
        with pytest.raises(ForbiddenError) as refused:
            await client.list(PODS, "ns")
    finally:
        await client.close()
    assert refused.value.status == 401
    assert_hidden(refused.value, SECRET)


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
        f"KubeconfigContent(content=<{len(content.content)} characters>, context='fake')"
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
        (KubeconfigContent(f"users: [{{token: {SECRET}\n"), "invalid YAML at line"),
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
