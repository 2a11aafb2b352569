"""The flow ``train-function``: kubedl_prefect.prefect.flows.function_training.

A training step written as a Python function (``distributed_task``) trains the example model on
2 local replicas and returns rank 0's metrics. The flow ships in the wheel; this file re-exports
it, as ``flows/training.py`` does the training flows. Run it once (torch needed)::

    uv run python flows/function_training.py --epochs 4
"""

from kubedl_prefect.prefect.flows.function_training import main, train_function, train_spirals

__all__ = ["main", "train_function", "train_spirals"]

if __name__ == "__main__":
    main()
