"""Example training programs shipped with kubedl-prefect (never imported by the library).

- :mod:`kubedl_prefect_examples.ddp_train`: PyTorch DDP on the CPU (gloo), run with
  ``python -m kubedl_prefect_examples.ddp_train`` on the local backend, the test bed or a cluster.

They need the ``torch`` extra: ``pip install 'kubedl-prefect[torch]'``.
"""
