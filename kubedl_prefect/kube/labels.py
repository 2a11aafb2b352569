"""The label every object kubedl-prefect creates carries, whatever the layer that creates it."""

from __future__ import annotations

from typing import Final

LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "kubedl-prefect"
