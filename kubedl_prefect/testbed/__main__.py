"""``python -m kubedl_prefect.testbed up|down|status``: the test bed without the main CLI."""

from kubedl_prefect.testbed.cli import app

if __name__ == "__main__":
    app()
