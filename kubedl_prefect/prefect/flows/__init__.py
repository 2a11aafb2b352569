"""Ready-made flows, shipped with the library: use them as they are or as the pattern to copy.

- :mod:`~kubedl_prefect.prefect.flows.training`: ``train`` (spec in, ``TrainingResult`` out) and
  ``retrain`` (the schedule slot as the key);
- :mod:`~kubedl_prefect.prefect.flows.train_and_serve`: ``train-and-serve`` (train, register,
  gate, serve with KServe or locally, roll back);
- :mod:`~kubedl_prefect.prefect.flows.function_training`: ``train-function`` (a training step
  written as a Python function, ``distributed_task``: the example model on 2 local replicas).

Import them from their modules (``from kubedl_prefect.prefect.flows.training import train``);
this package imports nothing itself. The checkout's ``flows/training.py`` and
``flows/train_and_serve.py`` re-export them, so the entrypoints of ``flows/prefect.yaml``
(``flows/training.py:retrain``) keep their paths. A deployment made from an installed package
names the module instead: ``python -m kubedl_prefect.prefect.flows.training --serve``.
"""
