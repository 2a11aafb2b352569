r"""The ``train-and-serve`` flow: kubedl_prefect.prefect.flows.train_and_serve.

The flow ships in the wheel; this file re-exports it so that ``flows/train_and_serve.py:...``
entrypoints and ``from flows.train_and_serve import train_and_serve`` keep working. Run it once
against the test bed and a tracking server::

    uv run python flows/train_and_serve.py flows/specs/testbed-mnist.yaml --cluster testbed \
        --tracking-uri http://127.0.0.1:5000 --model mnist --serve none
"""

from kubedl_prefect.prefect.flows.train_and_serve import (
    Serve,
    TrainAndServeResult,
    main,
    registry_block,
    service_name,
    serving_block,
    train_and_serve,
)

__all__ = [
    "Serve",
    "TrainAndServeResult",
    "main",
    "registry_block",
    "service_name",
    "serving_block",
    "train_and_serve",
]

if __name__ == "__main__":
    main()
