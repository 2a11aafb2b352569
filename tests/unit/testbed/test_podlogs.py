"""Pod logs as kwok serves them: the CRI line format, the Logs objects, where files live."""

from __future__ import annotations

import datetime as dt
import re
import threading
from pathlib import Path

import pytest

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import podlogs
from kubedl_prefect.testbed.podlogs import PodLog

# What the kubelet's CRI parser accepts: RFC 3339 time, stream, tag, then the text.
CRI_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z) (stdout|stderr) F (.*)$", re.MULTILINE
)


def test_lines_are_written_in_the_cri_format_with_the_current_time(tmp_path: Path) -> None:
    log = PodLog("ns", "pod", "main", tmp_path / "main.log")
    before = dt.datetime.now(dt.UTC)
    log.write("epoch 1", "epoch 2")
    log.write("oops", stream="stderr")
    after = dt.datetime.now(dt.UTC)
    found = CRI_LINE.findall(log.text())
    assert [(stream, text) for _, stream, text in found] == [
        ("stdout", "epoch 1"),
        ("stdout", "epoch 2"),
        ("stderr", "oops"),
    ]
    for stamp, _, _ in found:
        moment = dt.datetime.fromisoformat(stamp[:26] + "+00:00")  # to the microsecond
        assert before - dt.timedelta(microseconds=1) <= moment <= after
    assert log.text().endswith("\n")


def test_an_explicit_time_is_kept_and_converted_to_utc(tmp_path: Path) -> None:
    log = PodLog("ns", "pod", "main", tmp_path / "main.log")
    paris = dt.timezone(dt.timedelta(hours=1))
    log.write("old news", at=dt.datetime(2025, 3, 4, 13, 0, 0, 250000, tzinfo=paris))
    assert log.text() == "2025-03-04T12:00:00.250000000Z stdout F old news\n"
    with pytest.raises(TestbedError, match="time zone"):
        log.write("naive", at=dt.datetime(2025, 3, 4))


def test_a_text_with_newlines_becomes_several_lines_and_streams_are_checked() -> None:
    text = podlogs.cri_lines(["a\nb", ""], at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
    assert [t for _, _, t in CRI_LINE.findall(text)] == ["a", "b", ""]
    with pytest.raises(TestbedError, match="stdout or stderr"):
        podlogs.cri_lines(["x"], stream="stdin")  # type: ignore[arg-type]


def test_concurrent_writers_never_interleave_within_a_call(tmp_path: Path) -> None:
    log = PodLog("ns", "pod", "main", tmp_path / "main.log")

    def writer(tag: str) -> None:
        for i in range(50):
            log.write(*(f"{tag}{i}-{j}" for j in range(5)))

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    texts = [t for _, _, t in CRI_LINE.findall(log.text())]
    assert len(texts) == 2 * 50 * 5
    for start in range(0, len(texts), 5):  # each call's five lines stay together, in order
        call = texts[start : start + 5]
        prefix = call[0].rsplit("-", 1)[0]
        assert call == [f"{prefix}-{j}" for j in range(5)]


def test_paths_are_per_namespace_pod_and_container(tmp_path: Path) -> None:
    path = podlogs.pod_log_path(tmp_path, "team-a", "mnist-worker-1", "pytorch")
    assert path == tmp_path / "team-a" / "mnist-worker-1" / "pytorch.log"
    assert podlogs.previous_path(path) == path.with_name("pytorch.previous.log")
    for bad in (("..", "p", "c"), ("ns", "a/b", "c"), ("ns", "p", "")):
        with pytest.raises(TestbedError, match="not a valid name"):
            podlogs.pod_log_path(tmp_path, *bad)


def test_logs_object_lists_each_container_then_a_default(tmp_path: Path) -> None:
    files = {"worker": tmp_path / "w.log", "main": tmp_path / "m.log"}
    manifest = podlogs.logs_manifest("ns", "job-worker-0", files, tmp_path / "empty.log")
    assert manifest["apiVersion"] == "kwok.x-k8s.io/v1alpha1"
    assert manifest["kind"] == "Logs"
    assert manifest["metadata"] == {"name": "job-worker-0", "namespace": "ns"}
    entries = manifest["spec"]["logs"]
    assert [e.get("containers") for e in entries] == [["main"], ["worker"], None]
    assert entries[0]["previousLogsFile"] == str(tmp_path / "m.previous.log")
    assert entries[-1] == {"logsFile": str(tmp_path / "empty.log"), "follow": True}
    assert podlogs.listed_containers(manifest) == files


def test_default_cluster_logs_has_no_selector_and_no_previous_file(tmp_path: Path) -> None:
    default = podlogs.default_cluster_logs(tmp_path / "empty.log")
    assert default["kind"] == "ClusterLogs"
    assert "selector" not in default["spec"]  # every pod
    assert default["spec"]["logs"] == [{"logsFile": str(tmp_path / "empty.log"), "follow": True}]
