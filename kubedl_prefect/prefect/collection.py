"""Every block type of kubedl-prefect, for Prefect to register: the one module to name.

Importing this module defines (and so registers in this process) all five block types:

- ``kubedl-kubernetes-cluster`` (:class:`~kubedl_prefect.prefect.blocks.KubernetesCluster`) and
  ``kubedl-local-cluster`` (:class:`~kubedl_prefect.prefect.blocks.LocalCluster`), the clusters;
- ``kubedl-training-job`` (:class:`~kubedl_prefect.prefect.blocks.TrainingJob`);
- ``kubedl-mlflow-registry`` (:class:`~kubedl_prefect.prefect.model_blocks.MlflowRegistry`) and
  ``kubedl-kserve-serving`` (:class:`~kubedl_prefect.prefect.model_blocks.KServeServing`), the
  model chain.

It is what the package's ``prefect.collections`` entry point names (a self-hosted Prefect server
imports it at start-up) and what to give ``prefect block register -m`` (Prefect Cloud, or a
server running elsewhere): that command registers the block classes among a module's names,
which are exactly these. The block modules import each other only one way (``model_blocks``
imports ``blocks``), so each can also be imported alone; neither imports MLflow or the
Kubernetes client when it is loaded, and nor does this one.
"""

from __future__ import annotations

from kubedl_prefect.prefect.blocks import KubernetesCluster, LocalCluster, TrainingJob
from kubedl_prefect.prefect.model_blocks import KServeServing, MlflowRegistry

__all__ = [
    "BLOCK_TYPES",
    "KServeServing",
    "KubernetesCluster",
    "LocalCluster",
    "MlflowRegistry",
    "TrainingJob",
]

BLOCK_TYPES = (KubernetesCluster, LocalCluster, TrainingJob, MlflowRegistry, KServeServing)
"""The block classes, in the order the documentation lists them."""
