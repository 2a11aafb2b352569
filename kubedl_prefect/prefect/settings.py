"""kubedl-prefect's settings, read through Prefect's settings machinery.

Set them as ``PREFECT_INTEGRATIONS_KUBEDL_<NAME>`` environment variables, in a ``.env`` file,
in ``prefect.toml`` under ``[integrations.kubedl]``, or in ``pyproject.toml`` under
``[tool.prefect.integrations.kubedl]`` — as Prefect's own integrations (prefect-kubernetes,
prefect-aws) are configured. They are the worker's: whoever runs the flow sets them, not whoever
edits a block.

===========================================  ==========================================
variable                                     what
===========================================  ==========================================
``PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT``    the folder a block's ``spec_file`` must be in
``PREFECT_INTEGRATIONS_KUBEDL_LOCAL_WORKSPACE``  the default workspace of a ``LocalCluster``
``PREFECT_INTEGRATIONS_KUBEDL_LOG_BURST``    lines a replica may send to the run's log at once
===========================================  ==========================================

The variables of 0.1, ``KUBEDL_PREFECT_SPEC_ROOT`` and ``KUBEDL_PREFECT_LOCAL_WORKSPACE``, still
work for one release when the new one is not set, with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Final

from prefect.settings.base import PrefectBaseSettings, build_settings_config
from pydantic import Field

from kubedl_prefect.prefect.logs import DEFAULT_BURST

DEPRECATED_VARIABLES: Final = {
    "spec_root": "KUBEDL_PREFECT_SPEC_ROOT",
    "local_workspace": "KUBEDL_PREFECT_LOCAL_WORKSPACE",
}
"""Setting -> the variable that set it in 0.1 (read, with a warning, until the next release)."""


class KubeDLSettings(PrefectBaseSettings):
    """kubedl-prefect's settings (``PREFECT_INTEGRATIONS_KUBEDL_*``).

    Example:
        >>> import os
        >>> os.environ["PREFECT_INTEGRATIONS_KUBEDL_LOG_BURST"] = "50"
        >>> KubeDLSettings().log_burst
        50
        >>> del os.environ["PREFECT_INTEGRATIONS_KUBEDL_LOG_BURST"]
    """

    model_config = build_settings_config(("integrations", "kubedl"))

    spec_root: Path | None = Field(
        default=None,
        description=(
            "The folder a training job block's spec_file must be in (default: the flow's "
            "working directory)."
        ),
    )
    local_workspace: Path | None = Field(
        default=None,
        description=(
            "Where a LocalCluster without a workspace keeps jobs, logs, checkpoints and run "
            "records (default: ~/.cache/kubedl-prefect/local)."
        ),
    )
    log_burst: int = Field(
        default=DEFAULT_BURST,
        ge=1,
        description=(
            "Log lines a replica may send to the run's log at once, before the block's "
            "log_lines_per_second applies."
        ),
    )


def get_settings() -> KubeDLSettings:
    """The settings now (read each time: a test or a profile may change them)."""
    return KubeDLSettings()


def _deprecated(name: str) -> str | None:
    variable = DEPRECATED_VARIABLES[name]
    value = os.environ.get(variable)
    if not value:
        return None
    warnings.warn(
        f"{variable} is deprecated and will stop working in the next release: set "
        f"PREFECT_INTEGRATIONS_KUBEDL_{name.upper()} instead",
        DeprecationWarning,
        stacklevel=3,
    )
    return value


def spec_root() -> Path:
    """The folder spec files named by blocks must be in: the setting, else the cwd.

    Example:
        >>> import os
        >>> os.environ["PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT"] = "/srv/specs"
        >>> str(spec_root())
        '/srv/specs'
        >>> del os.environ["PREFECT_INTEGRATIONS_KUBEDL_SPEC_ROOT"]
    """
    configured = get_settings().spec_root or _deprecated("spec_root")
    return Path(configured).expanduser() if configured else Path.cwd()


def local_workspace() -> Path:
    """The default workspace of a :class:`~kubedl_prefect.prefect.blocks.LocalCluster`."""
    configured = get_settings().local_workspace or _deprecated("local_workspace")
    if configured:
        return Path(configured).expanduser()
    from kubedl_prefect.lifecycle.local.backend import default_workspace

    return default_workspace()
