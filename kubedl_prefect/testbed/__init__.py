"""The local Kubernetes test bed: a real control plane on loopback with simulated GPU nodes.

``Testbed(name).up()`` returns an administrator kubeconfig; see :mod:`.testbed` and
docs/testbed.md. Importing this package is cheap: the runner is loaded on first use. It ships
as the distribution ``kubedl-prefect-testbed`` (``packages/kubedl-prefect-testbed``), which the
extra ``testbed`` installs (``pip install 'kubedl-prefect[testbed]'``) with its dependencies;
without them, importing it raises :class:`~kubedl_prefect.errors.MissingExtraError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubedl_prefect.errors import require_extra

# The test bed's own dependencies come with the extra `testbed` (pyproject.toml): every module of
# the package says so, as a MissingExtraError, instead of failing on an import deep inside.
require_extra("the test bed (kubedl_prefect.testbed)", "testbed", "cryptography")

if TYPE_CHECKING:
    from kubedl_prefect.testbed.testbed import Testbed, TestbedStatus

__all__ = ["Testbed", "TestbedStatus"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kubedl_prefect.testbed import testbed

        return getattr(testbed, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
