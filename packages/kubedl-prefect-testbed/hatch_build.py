"""Build hook of kubedl-prefect-testbed: its one package, ``kubedl_prefect/testbed``.

The package's source stays where the rest of kubedl-prefect is, in the repository's
``kubedl_prefect/testbed`` (two levels above this file), so that imports, the import contracts,
mypy and the tests see one tree; kubedl-prefect's own wheel leaves it out. This hook puts it in
this distribution's sdist and wheel; a wheel built from that sdist finds it beside this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = "kubedl_prefect/testbed"


def package_files(root: Path) -> dict[str, str]:
    """Every file of the package (no bytecode), by its path in the distribution.

    Raises:
        FileNotFoundError: The package is neither beside ``root`` (an unpacked sdist) nor two
            levels above it (the repository).
    """
    for tree in (root / PACKAGE, root.parents[1] / PACKAGE):
        if tree.is_dir():
            break
    else:
        raise FileNotFoundError(
            f"{PACKAGE} is neither in {root} nor two levels above it: build "
            "kubedl-prefect-testbed from a kubedl-prefect checkout or from its sdist"
        )
    return {
        str(path): f"{PACKAGE}/{path.relative_to(tree).as_posix()}"
        for path in sorted(tree.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


class TestbedPackage(BuildHookInterface):  # type: ignore[type-arg]
    """Adds ``kubedl_prefect/testbed`` to the sdist and to a standard wheel."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Force-include the package's files (none in an editable wheel)."""
        if version == "editable":
            # A checkout imports the package from the checkout itself, through kubedl-prefect's
            # own editable install: a copy in site-packages would only go stale.
            return
        build_data["force_include"].update(package_files(Path(self.root).resolve()))
