"""Start-up reliability of the test bed: ``up`` then ``down`` of one test bed, N times in a row.

``uv run python -m bench.testbed_starts [--cycles 20] [--name starts] [--port-base 28600]``

Each cycle starts a test bed of its own name and ports (never ``default``, which others may be
using), from a stopped state, and stops it again. It counts the starts that failed, telling the
false "exited during start-up" (a component reported dead while it was starting: the race fixed
in issue 7) from any other failure, and reports the median and spread of the ``up`` and
``down`` times. The binaries must be built (``kubedl-prefect testbed build``); the first cycle
of a never-started test bed also installs the CRDs and saves its seed, so it is reported apart.
Results go to stdout as JSON and, with ``--out``, to a file.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed.components import Ports
from kubedl_prefect.testbed.testbed import Testbed


def _seconds(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def run(cycles: int, name: str, port_base: int, operators: bool) -> dict[str, Any]:
    """Run ``cycles`` up/down cycles of test bed ``name``; return the counts and times."""
    if name == "default":
        raise SystemExit("use a test bed of its own (--name), not the shared default one")
    bed = Testbed(name, ports=Ports(port_base), operators=operators)
    bed.down()  # from a stopped state, whatever an earlier run left
    first_start = not (bed.layout.root / "seed" / "key").is_file()
    ups: list[float] = []
    downs: list[float] = []
    false_exits: list[str] = []
    other_failures: list[str] = []
    first: float | None = None
    for cycle in range(1, cycles + 1):
        started = time.monotonic()
        try:
            bed.up()
        except TestbedError as exc:
            message = str(exc)
            kind = false_exits if "exited during start-up" in message else other_failures
            kind.append(f"cycle {cycle}: {message[:2000]}")
            print(f"cycle {cycle}: FAILED: {message.splitlines()[0]}", file=sys.stderr)
        else:
            took = time.monotonic() - started
            if cycle == 1 and first_start:
                first = took  # CRDs installed, seed saved: not a warm start
            else:
                ups.append(took)
            print(f"cycle {cycle}: up in {took:.1f}s", file=sys.stderr)
        started = time.monotonic()
        bed.down()
        downs.append(time.monotonic() - started)
    return {
        "cycles": cycles,
        "test_bed": name,
        "operators": operators,
        "started": cycles - len(false_exits) - len(other_failures),
        "false_exited_during_start_up": len(false_exits),
        "other_failures": len(other_failures),
        "first_up_with_crd_install_s": None if first is None else round(first, 2),
        "up_s": _seconds(ups),
        "down_s": _seconds(downs),
        "failures": false_exits + other_failures,
    }


def main() -> None:
    """Parse the command line, run the cycles, print (and write) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--name", default="starts")
    parser.add_argument("--port-base", type=int, default=28600)
    parser.add_argument("--no-operators", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    results = run(args.cycles, args.name, args.port_base, operators=not args.no_operators)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if results["started"] != args.cycles:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
