"""Unit tests of the test bed runner: no cluster is started; state goes to a temporary cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubedl_prefect.testbed.upstream import cache_root


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A private ``cache_root()``; Go keeps using the shared module and build caches."""
    shared = cache_root()
    monkeypatch.setenv("GOMODCACHE", str(shared / "go" / "mod"))
    monkeypatch.setenv("GOCACHE", str(shared / "go" / "build"))
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
