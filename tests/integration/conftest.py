"""Fixtures of the integration tests: the real test bed, a fresh namespace, least-privilege access.

The session's test bed is ``$KUBEDL_PREFECT_TESTBED`` (default ``default``). A test bed that is
already up is reused and left running; otherwise it is started (built first when needed: minutes
on a cold cache) and stopped at the end of the session, unless the session has workers
(``pytest -n``): then it stays up. Tests of several workers share it; ``exclusive`` ones run
alone. Without Go the fixture errors out with the reason: integration tests never skip.

Fixtures hand out kubeconfig paths, so tests may use any client. ``pod_log`` says what a pod's
containers print (see kubedl_prefect/testbed/podlogs.py); ``testbed.restart(component)`` crashes
and restarts a component.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.testbed import process, supervise
from kubedl_prefect.testbed.operators import OPERATOR_COMPONENTS
from kubedl_prefect.testbed.podlogs import PodLog
from kubedl_prefect.testbed.testbed import Testbed
from tests.support.exclusive import hold_test_bed


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """The session's test bed, up (reused when it was running already)."""
    bed = Testbed(os.environ.get("KUBEDL_PREFECT_TESTBED", "default"))
    was_up = bed.status().up
    bed.up()
    yield bed
    # A worker of a parallel run (pytest-xdist) cannot know whether another still uses it: the
    # test bed stays up (`make test` stops the one it started; `testbed down` stops it by hand).
    if not was_up and "PYTEST_XDIST_WORKER" not in os.environ:
        bed.down()


@pytest.fixture(autouse=True)
def test_bed_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """The test bed for a test that uses it: shared with other workers' tests, or alone.

    ``@pytest.mark.exclusive`` marks a test that restarts or stops a component, or that counts
    what the whole cluster holds (tests/support/exclusive.py). Tests of the local backend, which
    need no test bed, neither wait nor start one.
    """
    if "testbed" not in request.fixturenames:
        yield
        return
    bed: Testbed = request.getfixturevalue("testbed")
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with hold_test_bed(bed.layout.root, exclusive=exclusive):
        yield


def operator_processes(testbed: Testbed) -> dict[str, tuple[int, float, int]]:
    """``{component: (pid, start time, restarts)}`` of the running operators (absent: down)."""
    running: dict[str, tuple[int, float, int]] = {}
    supervised = supervise.load(testbed.layout)
    for component in OPERATOR_COMPONENTS:
        record = process.read(testbed.layout.pid_file(component.name))
        if record is not None and process.is_alive(record):
            restarts = supervised.get(component.name, supervise.Supervised()).restarts
            running[component.name] = (record.pid, record.started_at, restarts)
    return running


@pytest.fixture
def unchanged_operators(testbed: Testbed) -> Iterator[None]:
    """Fails the test when an operator (Trainer, JobSet, Volcano...) died or was restarted."""
    before = operator_processes(testbed)
    assert set(before) == {c.name for c in OPERATOR_COMPONENTS}, f"operators down: {before}"
    yield
    after = operator_processes(testbed)
    logs = {
        name: process.log_tail(testbed.layout.log_file(name), 20)
        for name in before
        if after.get(name) != before[name]
    }
    assert after == before, f"operator processes changed: {before} -> {after}; logs: {logs}"


@pytest.fixture(scope="session")
def admin_kubeconfig(testbed: Testbed) -> Path:
    """Path of the test bed's administrator kubeconfig (``system:masters``)."""
    return testbed.kubeconfig


@pytest.fixture
def namespace(testbed: Testbed, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, deleted (in the background) afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{stem}-{uuid.uuid4().hex[:6]}"
    testbed.create_namespace(name, labels={"kubedl-prefect.io/test": "true"})
    yield name
    testbed.delete_namespace(name)


@pytest.fixture
def service_account_kubeconfig(testbed: Testbed, tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``(namespace, rules, name="least-privilege") -> kubeconfig path``.

    Creates a ServiceAccount bound to a Role with ``rules`` in ``namespace`` and returns a
    kubeconfig that authenticates as it with a TokenRequest token (namespace preset).
    """

    def make(
        namespace: str, rules: Sequence[Mapping[str, Any]], name: str = "least-privilege"
    ) -> Path:
        return testbed.service_account_kubeconfig(
            namespace,
            name,
            [dict(rule) for rule in rules],
            path=tmp_path / f"{namespace}.{name}.kubeconfig",
        )

    return make


@pytest.fixture
def pod_log(testbed: Testbed) -> Callable[..., PodLog]:
    """Factory: ``(namespace, pod, container="main") -> PodLog`` to write what a container prints.

    The pod need not exist yet; ``GET .../pods/<pod>/log?container=...`` (follow, timestamps,
    sinceTime, tailLines) then reads what ``PodLog.write(*lines)`` appends.
    """

    def make(namespace: str, pod: str, container: str = "main") -> PodLog:
        return testbed.pod_log(namespace, pod, container)

    return make
