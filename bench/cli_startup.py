"""Start-up time of ``kubedl-prefect validate`` and ``render``, against a bare ``python -c pass``.

``uv run python -m bench.cli_startup [--runs 21] [--bytecode both|as-is|cached] [--source DIR]``

Each round runs, one after the other (interleaved, so that a change of machine load hits every
command alike): ``python -c pass``, ``kubedl-prefect validate examples/pytorch-mnist.yaml`` and
``kubedl-prefect render examples/pytorch-mnist.yaml --dialect kubedl``, each to exit 0 with its
output discarded. It reports per command the median, minimum and maximum wall time, the median
CPU time (user + system) of the process, and the ratio of the median to the baseline's.

Python's bytecode cache decides much of a start: without ``.pyc`` files every imported module is
compiled from source on every start. Two settings are measured:

- ``as-is``: this process's environment unchanged (a development machine that sets
  ``PYTHONDONTWRITEBYTECODE=1`` over a virtual environment installed without bytecode compiles
  pydantic, typer and the package at each start);
- ``cached``: ``PYTHONDONTWRITEBYTECODE`` unset and ``PYTHONPYCACHEPREFIX`` a private folder,
  warmed by one run of each command first: what an installation with bytecode sees (``pip``
  compiles at install, ``uv sync --compile-bytecode`` too, and Python writes the caches on the
  first start wherever it may).

``--source DIR`` runs the command line of another checkout (``git archive HEAD kubedl_prefect |
tar -x -C DIR`` gives the last commit's) through the same interpreter, for before/after
comparisons; by default the console script of this environment runs, as a user types it.
``--before DIR`` runs that checkout's ``validate`` and ``render`` in the same rounds (through
the same launcher), so that a before/after comparison sees the same machine load.
Results go to stdout and to ``bench/results/cli-startup.json`` (``--out``). Timings are this
machine's, under whatever else runs on it: the load average is recorded next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPEC = "examples/pytorch-mnist.yaml"
TARGET_S = 0.3
"""The start-up the issue asks for: median wall time of ``validate`` and ``render``."""

_LAUNCHER = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'kubedl-prefect'; "
    "from kubedl_prefect.cli import main; main()"
)


def _cli(source: Path | None) -> list[str]:
    python = sys.executable
    if source is None:
        return [str(Path(python).with_name("kubedl-prefect"))]
    return [python, "-c", _LAUNCHER, str(source.resolve())]


def commands(source: Path | None, before: Path | None = None) -> dict[str, list[str]]:
    """The measured command lines, by name (``pass`` first: the baseline).

    With ``before`` (another checkout), its ``validate`` and ``render`` run in the same rounds,
    named ``validate-before`` and ``render-before``.
    """
    named = {"pass": [sys.executable, "-c", "pass"]}
    for suffix, cli in (("", _cli(source)), ("-before", _cli(before) if before else None)):
        if cli is not None:
            named[f"validate{suffix}"] = [*cli, "validate", SPEC]
            named[f"render{suffix}"] = [*cli, "render", SPEC, "--dialect", "kubedl"]
    return named


def shown(command: Sequence[str]) -> str:
    """A command line as the results file names it (the launcher replaced by the checkout)."""
    if len(command) > 3 and command[1:3] == ["-c", _LAUNCHER]:
        return f"kubedl-prefect (from {command[3]}) {' '.join(command[4:])}"
    if command[0].endswith("kubedl-prefect"):
        return " ".join(["kubedl-prefect", *command[1:]])
    return " ".join(["python", *command[1:]])


def run_once(command: Sequence[str], env: Mapping[str, str]) -> tuple[float, float]:
    """Run ``command`` to exit 0; return its wall time and CPU time (user + system), seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        command, cwd=REPO, env=dict(env), stdout=subprocess.DEVNULL, check=True, timeout=120
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(
    named: Mapping[str, Sequence[str]], env: Mapping[str, str], runs: int
) -> dict[str, dict[str, float]]:
    """``runs`` interleaved rounds of every command; the statistics of each."""
    walls: dict[str, list[float]] = {name: [] for name in named}
    cpus: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(runs):
        for name, command in named.items():
            wall, cpu = run_once(command, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    base = statistics.median(walls["pass"])
    return {
        name: {
            "median_s": round(statistics.median(walls[name]), 3),
            "min_s": round(min(walls[name]), 3),
            "max_s": round(max(walls[name]), 3),
            "cpu_median_s": round(statistics.median(cpus[name]), 3),
            "ratio_to_pass": round(statistics.median(walls[name]) / base, 1),
            "over_pass_s": round(statistics.median(walls[name]) - base, 3),
        }
        for name in named
    }


def environment(mode: str, cache: Path) -> dict[str, str]:
    """The environment of the commands for a bytecode ``mode``."""
    env = dict(os.environ)
    if mode == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def run(
    runs: int,
    modes: Sequence[str],
    source: Path | None,
    before: Path | None = None,
    before_label: str | None = None,
) -> dict[str, Any]:
    """Measure every mode; return the results with what they were measured under."""
    named = commands(source, before)
    results: dict[str, Any] = {
        "runs": runs,
        "target_s": TARGET_S,
        "commands": {name: shown(command) for name, command in named.items()},
        "source": str(source) if source is not None else "console script of this environment",
        "before": str(before) if before is not None else None,
        "before_label": before_label,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="cli-startup-pyc-") as cache:
        for mode in modes:
            env = environment(mode, Path(cache))
            if mode == "cached":
                for command in named.values():  # write the caches once
                    run_once(command, env)
            stats = measure(named, env, runs)
            results["modes"][mode] = {
                "commands": stats,
                # The 1-minute load average at its end: what ran beside these rounds.
                "load_average_1m": round(os.getloadavg()[0], 2),
                "meets_target": all(
                    stats[name]["median_s"] <= TARGET_S for name in ("validate", "render")
                ),
            }
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return results


def main() -> None:
    """Parse the command line, measure, print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--bytecode", choices=("both", "as-is", "cached"), default="both")
    parser.add_argument("--source", type=Path, help="a checkout's root to run the CLI from")
    parser.add_argument("--before", type=Path, help="another checkout's root, measured alongside")
    parser.add_argument("--before-label", help="what --before is, for the results (a commit...)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cli-startup.json")
    args = parser.parse_args()
    modes = ("as-is", "cached") if args.bytecode == "both" else (args.bytecode,)
    results = run(args.runs, modes, args.source, args.before, args.before_label)
    for mode, found in results["modes"].items():
        print(f"{mode} bytecode ({args.runs} runs, target {TARGET_S} s):")
        for name, stats in found["commands"].items():
            print(
                f"  {name:<15} median {stats['median_s']:.3f} s  "
                f"({stats['min_s']:.3f} - {stats['max_s']:.3f}), cpu {stats['cpu_median_s']:.3f} s,"
                f" x{stats['ratio_to_pass']} of python -c pass"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
