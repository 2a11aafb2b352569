"""``python -m kubedl_prefect.cli``: the console script."""

from kubedl_prefect.cli import main

main()
