"""Whether this machine can run a job's replicas at once, and if not, why.

Pure but for :func:`machine_capacity`, which reads the machine.

A gang on a cluster is admitted when every replica fits on some node; locally there is one node,
this machine, and nothing frees up by waiting (other local jobs aside), so admission is
immediate or refused. A job is refused when, in all, its replicas ask for more processes, CPU
cores, memory or GPUs than the machine offers. Requests are compared with the machine's total
(as a scheduler compares them with a node's allocatable), not with what is free at the moment;
limits are not enforced on the processes (there are no cgroups), only checked here.

The process limit defaults to the number of CPUs this process may run on: replicas of a
synchronous data-parallel job wait for each other at every step, so more replicas than cores
makes the job slower than fewer replicas would.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psutil

from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.spec import TrainingJobSpec
from kubedl_prefect.spec.quantity import parse_quantity


@dataclass(frozen=True)
class LocalCapacity:
    """What this machine offers the replicas of one local job.

    Args:
        processes: Replicas that may run at once.
        cpus: CPU cores.
        memory_bytes: Memory, in bytes.
        gpus: GPUs.

    Example:
        >>> LocalCapacity(processes=4, cpus=4, memory_bytes=16 * 2**30, gpus=0).describe()
        '4 processes, 4 CPUs, 16Gi of memory, 0 GPUs'
    """

    processes: int
    cpus: float
    memory_bytes: int
    gpus: int = 0

    def describe(self) -> str:
        """One line for messages."""
        return (
            f"{self.processes} processes, {self.cpus:g} CPUs, {_bytes(self.memory_bytes)} of "
            f"memory, {self.gpus} GPUs"
        )


@dataclass(frozen=True)
class LocalRequest:
    """What a job's replicas ask for in all."""

    processes: int
    cpus: Decimal
    memory_bytes: Decimal
    gpus: int


def requested(spec: TrainingJobSpec) -> LocalRequest:
    """What every replica of ``spec`` asks for, summed (unset CPU or memory counts as 0)."""
    processes, gpus = 0, 0
    cpus, memory = Decimal(0), Decimal(0)
    for role in spec.resolved_roles():
        processes += role.count
        resources = role.resources
        if resources is None:
            continue
        gpus += resources.gpus * role.count
        if resources.cpu is not None:
            cpus += parse_quantity(resources.cpu) * role.count
        if resources.memory is not None:
            memory += parse_quantity(resources.memory) * role.count
    return LocalRequest(processes, cpus, memory, gpus)


def admit(
    spec: TrainingJobSpec, capacity: LocalCapacity, *, host: str = "this machine"
) -> AdmissionState:
    """Admit ``spec``'s replicas on this machine, or say what does not fit.

    The reason follows the scheduler's wording (``Insufficient cpu``) so that it reads, and is
    classified, like a cluster's.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "big", "image": "x", "command": ["python"],
        ...                    "replicas": {"master": 1, "worker": 7}, "resources": {"cpu": 1}})
        >>> state = admit(spec, LocalCapacity(processes=2, cpus=2, memory_bytes=2**33))
        >>> state.admitted, str(state.blocker)
        (False, 'InsufficientResources')
        >>> state.reason.split(":")[0]
        'this machine cannot run the 8 replicas at once'
    """
    want = requested(spec)
    short: list[str] = []
    blocker = AdmissionBlocker.INSUFFICIENT_RESOURCES
    if want.processes > capacity.processes:
        short.append(
            f"too many processes ({want.processes} replicas, {capacity.processes} allowed)"
        )
    if want.cpus > Decimal(str(capacity.cpus)):
        short.append(f"Insufficient cpu ({want.cpus.normalize():f} asked, {capacity.cpus:g} here)")
    if want.memory_bytes > capacity.memory_bytes:
        short.append(
            f"Insufficient memory ({_bytes(int(want.memory_bytes))} asked, "
            f"{_bytes(capacity.memory_bytes)} here)"
        )
    if want.gpus > capacity.gpus:
        short.append(f"Insufficient nvidia.com/gpu ({want.gpus} asked, {capacity.gpus} here)")
        blocker = AdmissionBlocker.INSUFFICIENT_GPU
    if short:
        return AdmissionState(
            admitted=False,
            blocker=blocker,
            reason=f"{host} cannot run the {want.processes} replicas at once: {'; '.join(short)}",
            scheduled=0,
            expected=want.processes,
        )
    return AdmissionState(
        admitted=True,
        reason=f"admitted on {host}: {want.processes} replicas within {capacity.describe()}",
        scheduled=want.processes,
        expected=want.processes,
    )


def _bytes(value: int) -> str:
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value}"


_GPU_DEVICE = re.compile(r"^nvidia\d+\Z")


def gpu_ids(dev: Path = Path("/dev")) -> list[int]:
    """The NVIDIA GPUs of this machine, by device number (none where there is no ``/dev``)."""
    try:
        names = [p.name for p in dev.iterdir()]
    except OSError:
        return []
    return sorted(int(n.removeprefix("nvidia")) for n in names if _GPU_DEVICE.match(n))


def machine_capacity() -> LocalCapacity:
    """This machine's capacity: the CPUs this process may run on, its memory and GPUs."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return LocalCapacity(
        processes=cpus,
        cpus=float(cpus),
        memory_bytes=int(psutil.virtual_memory().total),
        gpus=len(gpu_ids()),
    )
