"""The table of ``docs/benchmarks.md``, from ``bench/results/monitor.json`` of one run.

``python -m bench.report`` rewrites the document from the saved results (``bench.monitor`` does
it at the end of a full run).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "bench" / "results" / "monitor.json"
OURS = "kubedl-prefect"
BASELINES = ("kubeflow-sdk", "poll-5s")
TARGET_JOBS = 100
TARGET_P50_MS = 20.0
TARGET_P99_MS = 100.0


def machine_info(versions: dict[str, str]) -> dict[str, Any]:
    """What the numbers were measured on; ``versions`` of the packages, by distribution name."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = int(line.split()[1]) / 2**20
                break
    except OSError:
        pass
    from kubedl_prefect.testbed.upstream import KUBEFLOW_TRAINING, KUBERNETES

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_gib, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "kubernetes_server": KUBERNETES.version,
        "training_operator_crds": KUBEFLOW_TRAINING.version,
        "kubedl_prefect": versions.get("kubedl-prefect", "?"),
        "kubeflow_training_sdk": versions.get("kubeflow-training", "?"),
        "kubernetes_python": versions.get("kubernetes", "?"),
        "kubernetes_asyncio": versions.get("kubernetes-asyncio", "?"),
    }


def _cell(value: Any, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if abs(value) < 1:
            text = f"{value:.2g}"
        else:
            text = f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"
        return text + suffix
    return f"{value}{suffix}"


def _find(rows: Sequence[dict[str, Any]], system: str, jobs: int, seconds: str) -> dict[str, Any]:
    for row in rows:
        if (row["system"], row["jobs"], row["job_seconds"]) == (system, jobs, seconds):
            return row
    return {}


def _ratio(numerator: Any, denominator: Any) -> str:
    if not numerator or not denominator:
        return "—"
    value = float(numerator) / float(denominator)
    return f"{value:,.0f}x" if value >= 10 else f"{value:,.1f}x"


def results_table(rows: Sequence[dict[str, Any]]) -> str:
    """The measured rows as a Markdown table, ours beside the baselines."""
    lines = [
        "| system | jobs | job run time (s) | p50 (ms) | p99 (ms) | waits over 100 ms | "
        "requests / job | requests | peak RSS (MB) | RSS before waiting (MB) | "
        "mean run time (s) | patch answer p50 (ms) | load (1 min) | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    f"**{row['system']}**" if row["system"] == OURS else row["system"],
                    str(row["jobs"]),
                    row["job_seconds"],
                    _cell(row["p50_ms"]),
                    _cell(row["p99_ms"]),
                    _cell(row.get("over_100ms")),
                    _cell(row["requests_per_job"]),
                    _cell(row.get("requests")),
                    _cell(row["rss_mb"]),
                    _cell(row["rss_start_mb"]),
                    _cell(row.get("run_s_mean")),
                    _cell(row.get("patch_p50_ms")),
                    _cell(row.get("load_1m")),
                    row.get("notes") or "",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def ratios_table(rows: Sequence[dict[str, Any]]) -> str:
    """Baseline figure divided by ours, per scale: how many times better ours is."""
    lines = [
        "| jobs | job run time (s) | baseline | p50 latency: baseline / ours | "
        "requests per job: baseline / ours | peak RSS: baseline / ours |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    keys = sorted({(r["jobs"], r["job_seconds"]) for r in rows if r["system"] == OURS})
    for jobs, seconds in keys:
        ours = _find(rows, OURS, jobs, seconds)
        for baseline in BASELINES:
            other = _find(rows, baseline, jobs, seconds)
            if not other:
                continue
            lines.append(
                f"| {jobs} | {seconds} | {baseline} | {_ratio(other['p50_ms'], ours['p50_ms'])} "
                f"| {_ratio(other['requests_per_job'], ours['requests_per_job'])} "
                f"| {_ratio(other['rss_mb'], ours['rss_mb'])} |"
            )
    return "\n".join(lines)


def findings(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Plain sentences: the targets, and whether requests per job depend on the run time."""
    found: list[str] = []
    at_target = [
        r for r in rows if r["system"] == OURS and r["jobs"] == TARGET_JOBS and r["p50_ms"]
    ]
    for row in at_target:
        p50_ok = row["p50_ms"] <= TARGET_P50_MS
        p99_ok = row["p99_ms"] <= TARGET_P99_MS
        verdict = "met" if p50_ok and p99_ok else "**not met**"
        found.append(
            f"Target at {TARGET_JOBS} jobs ({row['job_seconds']} s jobs): p50 ≤ "
            f"{TARGET_P50_MS:g} ms and p99 ≤ {TARGET_P99_MS:g} ms — {verdict} "
            f"(p50 {_cell(row['p50_ms'])} ms, p99 {_cell(row['p99_ms'])} ms)."
        )
    for row in rows:
        planned = float(row["job_seconds"].split("-")[-1])
        actual = row.get("run_s_mean")
        if actual and actual > 1.2 * planned:
            found.append(
                f"{row['system']} at {row['jobs']} jobs loaded the API server (and the machine's "
                "cores) so much that the "
                f"driver's status patches (the operator's writes) lagged: the jobs ran "
                f"{actual:.0f} s on average instead of {row['job_seconds']} s, which also "
                "inflates its requests per job."
            )
    for system in (OURS, *BASELINES):
        same = sorted(
            (r for r in rows if r["system"] == system and r["jobs"] == TARGET_JOBS),
            key=lambda r: float(r["job_seconds"].split("-")[0]),
        )
        if len(same) >= 2 and all(r["requests_per_job"] for r in same):
            parts = ", ".join(
                f"{_cell(r['requests_per_job'])} with {r['job_seconds']} s jobs" for r in same
            )
            found.append(f"Requests per job of {system} at {TARGET_JOBS} jobs: {parts}.")
    return found


def render(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The whole of ``docs/benchmarks.md``."""
    machine = (
        f"{meta['cores']} cores ({meta['cpu']}), {meta['memory_gib']} GiB, Linux "
        f"{meta['kernel']}, Python {meta['python']}"
    )
    software = (
        f"kube-apiserver {meta['kubernetes_server']} of the local test bed (no operators), "
        f"Kubeflow training-operator {meta['training_operator_crds']} CRDs; "
        f"kubedl-prefect {meta['kubedl_prefect']} (kubernetes_asyncio "
        f"{meta['kubernetes_asyncio']}), kubeflow-training {meta['kubeflow_training_sdk']} "
        f"(kubernetes {meta['kubernetes_python']})"
    )
    bullet_findings = "\n".join(f"- {line}" for line in findings(rows))
    return f"""# Benchmarks

<!-- Generated by `python -m bench.monitor` (or `python -m bench.report` from the saved results in
bench/results/monitor.json); edit bench/report.py, not this file. -->

## Monitoring: from the terminal condition to the wait returning

How long after the operator writes a training job's terminal condition does a wait on that job
return, how many API requests does waiting cost per job, and how much memory does the waiting
process hold, when many jobs are waited on at once — kubedl-prefect beside two polling
baselines.

All figures below come from **one run** ({meta["date"]}, {meta["elapsed_s"]} s, seed
{meta["seed"]}): `{meta["command"]}`.

- Machine: {machine}. The API server, the benchmark driver and the waiting process share these
  cores, so absolute figures are noisy; compare within the table.
- Software: {software}.

### Results

{results_table(rows)}

{bullet_findings}

Latency is measured from the moment just before the driver sends the status patch that writes the
terminal condition (`t0`) to the moment the wait returned in the waiting process (`t1`), both on
the machine's monotonic clock; p50 and p99 are over every job of the row. Requests per job are
all HTTP requests the waiting process made (lists, watches, GETs), divided by the number of jobs.
Peak RSS is the waiting process's high-water mark (`VmHWM`); "before waiting" is its resident
memory after imports and client set-up, so the difference is what waiting on that many jobs
costs. "Mean run time" is how long the jobs actually ran, from the moment every waiter had seen
its job to their terminal patch: longer than planned when the API server, loaded by the system
under test, answered the driver late. "Patch answer" is how long the API server took to answer
the terminal patch: the floor under any system's latency, since the watch event and the answer
leave the server at about the same time. "Load" is the machine's 1-minute load average at the
end of the row (other work on the machine included). The 1-job rows are one sample each.

Reading the tails: every latency includes the API server's own answer time (the "patch answer"
column), so a moment when the shared machine stalls shows in every system. Beyond that, the
p99 of kubedl-prefect at 1,000 jobs is sensitive to pauses of the waiting process: its informer
holds the 1,000 job objects, and a full garbage collection over them took about 100-160 ms of CPU on
this machine (measured with `BENCH_GC_LOG=1`, which logs each collection of the waiting process
on its stderr). "Waits over 100 ms" counts how many jobs such pauses touched.

### How ours compares (baseline ÷ ours, higher is better for ours)

{ratios_table(rows)}

### Systems

- `kubedl-prefect` (ours): `KubernetesBackend(dialect="kubeflow").wait_completed(ref)` per job,
  all awaited concurrently; the jobs, pods, PodGroups and events of the namespace are followed by
  one shared list-and-watch per kind (a list and a watch for each of the 4 kinds, plus a watch
  resumed now and then), so its requests grow neither with the number of jobs nor with their
  run time.
- `kubeflow-sdk`: the Kubeflow training SDK's `TrainingClient.wait_for_job_conditions(name)`
  with its defaults (a GET every 15 s, 600 s limit), one thread per job, as it blocks.
- `poll-5s`: one coroutine per job reading the job every 5 s with kubedl-prefect's `KubeClient`
  (the same HTTP stack as ours), the pace of prefect-kubernetes' job watcher.

### Method

- The test bed (`kubedl_prefect.testbed`) runs a real kube-apiserver, controller-manager,
  scheduler and kwok, **without operators**: the driver (`bench/monitor.py`) plays the training
  operator, so what is measured is monitoring, not the operator's pace.
- For each row the driver creates the jobs (Kubeflow `PyTorchJob`s rendered by kubedl-prefect
  from `examples/pytorch-mnist.yaml`) in a fresh namespace and marks them Running through the
  status subresource. It then starts the system in its own process (`bench/waiters.py`), waits
  until every waiter has seen its job once, and gives each job a run time drawn at random in the
  row's range — the same draws for every system. When a job's time is up it writes the
  `Succeeded` condition with a status-subresource patch, one patch after the other so that jobs
  end spread over time; `t0` is read per patch.
- The jobs run longer than the pollers' intervals, so polling costs show; the rows with 60-80 s
  jobs repeat the 100-job rows with jobs more than twice as long, to show which costs grow with a
  job's run time. The 1,000 jobs end over 40 s (20-60 s) rather than 20 s, about 25 patches a
  second, which the driver can send one at a time on this machine; patches in flight together
  would queue behind each other in the API server and add the driver's own load to every
  latency.
- Each row runs alone (one system, one namespace, deleted and gone before the next row starts).
- Reproduce: start nothing by hand; `uv run --group bench python -m bench.monitor` brings up a
  test bed named `bench` on ports 29400-29499 (without operators) if none runs, and stops it at
  the end. The waiting processes run in an environment of their own
  (`~/.cache/kubedl-prefect/bench-venv`, made with uv from `uv.lock`: the main dependencies, the
  `bench` group and this checkout). `--quick` is a smoke run (1 and 10 jobs of 5-10 s) that writes
  `bench/results/monitor-quick.json` and leaves this page alone.
"""


def rerun_section() -> str:
    """A section for a targeted re-run (``monitor-rerun.json``), when one was saved.

    A change to the waiting path is checked against the targets without the full 17-minute run;
    its rows stand apart from the table above, with their own date and command.
    """
    path = RESULTS.with_name("monitor-rerun.json")
    if not path.exists():
        return ""
    rows = json.loads(path.read_text())
    meta = json.loads(RESULTS.with_name("monitor-rerun-meta.json").read_text())
    lines = [
        "",
        "### Targeted re-run",
        "",
        f"{meta.get('why', 'a re-run of some rows').capitalize()} ({meta['date']}, one run): "
        f"`{meta['command']}`.",
        "",
        "| system | jobs | job run time (s) | p50 (ms) | p99 (ms) | requests / job "
        "| load (1 min) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['system']} | {row['jobs']} | {row['job_seconds']} | {_cell(row['p50_ms'])} "
            f"| {_cell(row['p99_ms'])} | {_cell(row['requests_per_job'])} "
            f"| {_cell(row['load_1m'])} |"
        )
    lines += [
        "",
        "Requests per job now include the one write that records how the attempt ended (the "
        "run record a replay reads after the job is cleaned up); it is sent after the wait has "
        "returned, so it adds no latency.",
        "",
    ]
    return "\n".join(lines)


def write_docs(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Rewrite ``docs/benchmarks.md``, keeping the sections other benchmarks generate."""
    kept = ""
    if DOCS.exists():
        text = DOCS.read_text()
        start = text.find("<!-- section: ")
        if start >= 0:
            kept = "\n" + text[start:]
    DOCS.write_text(render(rows, meta) + rerun_section() + kept)


def main() -> int:
    rows = json.loads(RESULTS.read_text())
    meta = json.loads(RESULTS.with_name("monitor-meta.json").read_text())
    write_docs(rows, meta)
    print(f"wrote {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
