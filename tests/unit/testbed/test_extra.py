"""Without the extra `testbed`, the test bed says which extra to install, not a traceback.

The extra installs the distribution kubedl-prefect-testbed (the package kubedl_prefect.testbed),
which brings cryptography: either can be missing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# A fresh interpreter in which the test bed's dependency cannot be found.
HIDE = "import sys; sys.modules['cryptography'] = None; "
ADVICE = "pip install 'kubedl-prefect[testbed]'"


def _run(code: str, hide: str = HIDE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", hide + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_the_cli_group_names_the_extra() -> None:
    done = _run(
        "sys.argv = ['kubedl-prefect', 'testbed', 'up']\n"
        "from kubedl_prefect.cli import main\n"
        "main()"
    )
    assert done.returncode == 1, done.stderr
    assert "error: the test bed (kubedl_prefect.testbed) needs cryptography" in done.stderr
    assert ADVICE in done.stderr
    assert "Traceback" not in done.stderr


def test_the_cli_group_names_the_extra_without_the_distribution(tmp_path: Path) -> None:
    # kubedl_prefect as a plain `pip install kubedl-prefect` has it: without its testbed
    # package (tests/unit/test_packaging.py checks that the wheel leaves it out), first on the path.
    shutil.copytree(
        ROOT / "kubedl_prefect",
        tmp_path / "kubedl_prefect",
        ignore=lambda folder, _: ["testbed"] if Path(folder).name == "kubedl_prefect" else [],
    )
    done = _run(
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "sys.argv = ['kubedl-prefect', 'testbed', 'status']\n"
        "from kubedl_prefect.cli import main\n"
        "main()",
        hide="import sys; ",
    )
    assert done.returncode == 1, done.stderr
    assert (
        "error: the test bed (kubedl_prefect.testbed) needs kubedl-prefect-testbed, "
        "which is not installed" in done.stderr
    )
    assert ADVICE in done.stderr
    assert "Traceback" not in done.stderr


def test_the_rest_of_the_cli_works_without_it() -> None:
    done = _run(
        "sys.argv = ['kubedl-prefect', '--help']\nfrom kubedl_prefect.cli import main\nmain()"
    )
    assert done.returncode == 0, done.stderr
    assert "testbed" in done.stdout


def test_every_module_of_the_test_bed_raises_the_error() -> None:
    done = _run(
        "from kubedl_prefect.errors import MissingExtraError\n"
        "try:\n"
        "    import kubedl_prefect.testbed.pki\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra, exc.missing, isinstance(exc, ImportError), exc.hint)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("testbed ('cryptography',) True")
    assert ADVICE in done.stdout
