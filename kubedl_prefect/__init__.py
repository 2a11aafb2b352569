"""kubedl-prefect: distributed training on Kubernetes as first-class Prefect flows."""

__version__ = "0.1.0"
