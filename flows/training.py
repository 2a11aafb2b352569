"""The training flows ``train`` and ``retrain``: kubedl_prefect.prefect.flows.training.

The flows ship in the wheel; this file re-exports them so that the entrypoints of
``flows/prefect.yaml`` (``flows/training.py:retrain``) and ``from flows.training import train``
keep working. Run it once::

    uv run python flows/training.py flows/specs/testbed-mnist.yaml --cluster testbed

Serve the nightly retraining deployment (02:00 UTC every day)::

    uv run python flows/training.py --serve
"""

from kubedl_prefect.prefect.flows.training import main, retrain, train, training_job

__all__ = ["main", "retrain", "train", "training_job"]

if __name__ == "__main__":
    main()
