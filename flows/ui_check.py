"""The UI check: a real Prefect server, a training flow on the test bed, the UI in Chromium.

It starts ``prefect server start`` (not the test harness) with a ``PREFECT_HOME`` of its own,
saves the test bed's blocks, occupies most of the test bed's GPUs with pods, runs the training
flow against the test bed (its job waits for GPUs, then its replicas print labelled lines and
the training's progress), opens the flow-run page while the job waits, deletes the pods (the
job is admitted) and looks again once the run completed (its artifacts, events and the
replicas' log lines), then the training-job block's form and the event feed; then it runs
``make demo``'s train-and-serve chain (LocalCluster, MLflow, local MLServer) and looks at its
flow-run page, its links to the MLflow run, the model version and the endpoint, and the
endpoint followed. All in headless Chromium (Debian's ``chromium`` package); screenshots under
``docs/images/``::

    uv run python flows/ui_check.py            # screenshots into docs/images/
    uv run python flows/ui_check.py --chain    # the chain's only (no test bed)

The browser test (tests/integration/test_prefect_ui.py) uses the same functions and checks
what the pages show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--hide-scrollbars",
)


@dataclass
class PrefectServer:
    """A ``prefect server start`` process and the environment that points clients at it."""

    process: subprocess.Popen[bytes]
    url: str
    env: dict[str, str]

    @property
    def api_url(self) -> str:
        """The REST API's URL."""
        return f"{self.url}/api"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def prefect_server(home: Path, *, timeout_s: float = 300.0) -> Iterator[PrefectServer]:
    """Start a real Prefect server (its own process group), stop it on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"{url}/api",
        "PREFECT_UI_API_URL": f"{url}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
        "PYTHONPATH": str(ROOT),
    }
    log = (home / "server.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the Prefect server did not start:\n"
                    + (home / "server.log").read_text(errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield PrefectServer(process, url, env)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        log.close()


def chromium() -> str:
    """The Chromium binary (Debian's package).

    Raises:
        RuntimeError: It is not installed.
    """
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise RuntimeError("Chromium is missing: apt-get install chromium")
    return found


def screenshot(url: str, path: Path, *, width: int = 1400, height: int = 1100) -> None:
    """Save a PNG of ``url`` once its scripts have run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--window-size={width},{height}",
            "--virtual-time-budget=20000",
            f"--screenshot={path}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def page_text(url: str) -> str:
    """The DOM of ``url`` once its scripts have run (what a reader of the page sees, and more)."""
    done = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, "--virtual-time-budget=20000", "--dump-dom", url],
        check=True,
        capture_output=True,
        timeout=120,
        text=True,
    )
    return done.stdout


class Browser:
    """Headless Chromium driven over the DevTools protocol (a page, clicks, text, screenshots).

    Args:
        width: The window's width in pixels.
        height: Its height.
    """

    def __init__(self, width: int = 1400, height: int = 1100):
        self.width, self.height = width, height
        self.port = free_port()
        self.profile = tempfile.TemporaryDirectory(prefix="kubedl-prefect-chromium-")
        self.process = subprocess.Popen(
            [
                chromium(),
                *CHROMIUM_FLAGS,
                f"--window-size={width},{height}",
                f"--remote-debugging-port={self.port}",
                f"--user-data-dir={self.profile.name}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._ids = 0
        self._session: Any = None
        self._socket: Any = None

    async def __aenter__(self) -> Browser:
        import aiohttp

        deadline = time.monotonic() + 60
        self._session = aiohttp.ClientSession()
        while True:
            try:
                async with self._session.get(f"http://127.0.0.1:{self.port}/json/list") as answer:
                    targets = await answer.json()
                page = next(t for t in targets if t.get("type") == "page")
                break
            except (aiohttp.ClientError, StopIteration):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("Chromium did not open its DevTools port") from None
                await asyncio.sleep(0.3)
        self._socket = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.call("Page.enable")
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._socket is not None:
            await self._socket.close()
        if self._session is not None:
            await self._session.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)
        self.profile.cleanup()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One DevTools command; its result."""
        self._ids += 1
        ident = self._ids
        await self._socket.send_json({"id": ident, "method": method, "params": params or {}})
        while True:
            message = await self._socket.receive_json(timeout=60)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        return result.get("result", {}).get("value")

    async def open(self, url: str) -> None:
        """Navigate to ``url``."""
        await self.call("Page.navigate", {"url": url})

    async def text(self) -> str:
        """What the page shows, as text."""
        return str(await self.evaluate("document.body ? document.body.innerText : ''") or "")

    async def wait_for_text(self, *needles: str, timeout_s: float = 30.0) -> str:
        """Wait until the page shows every one of ``needles``; return its text.

        Raises:
            TimeoutError: Some did not show up in time (the message says which, and the text).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            text = await self.text()
            missing = [n for n in needles if n not in text]
            if not missing:
                return text
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never showed {missing}; it shows:\n{text[:3000]}")
            await asyncio.sleep(0.5)

    async def click_text(self, label: str) -> None:
        """Click the innermost element whose own text is ``label`` (a tab, a button)."""
        found = await self.evaluate(
            "(() => { const all = [...document.querySelectorAll("
            "'button, a, [role=tab], li, span, div')]; const hit = all.reverse().find("
            f"e => e.innerText && e.innerText.trim() === {json.dumps(label)});"
            " if (!hit) return false; hit.click(); return true; })()"
        )
        if not found:
            raise RuntimeError(f"nothing to click labelled {label!r}")

    async def click_at(self, x: float, y: float) -> None:
        """A mouse click at page coordinates."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    async def screenshot(self, path: Path, *, height: int | None = None) -> bytes:
        """Save a PNG of what the page shows now (its top ``height`` pixels); return its bytes."""
        import base64

        params: dict[str, Any] = {"format": "png"}
        if height is not None:
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1}
        shot = await self.call("Page.captureScreenshot", params)
        data = base64.b64decode(shot["data"])
        await asyncio.to_thread(_write, path, data)
        return data


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


RUN_SCRIPT = """
import json, sys
from prefect import flow
from kubedl_prefect.prefect import CLEANUP_HOOKS, KubernetesCluster, TrainingJob, run_training_job
from kubedl_prefect.spec import load_spec

cluster = KubernetesCluster(kubeconfig_path=sys.argv[1], namespace=sys.argv[2])
cluster.save("testbed", overwrite=True)
job = TrainingJob(spec=load_spec(sys.argv[3]), cluster=KubernetesCluster.load("testbed"))
job.save("pytorch-mnist", overwrite=True)

@flow(name="train", **CLEANUP_HOOKS)
def train():
    return run_training_job("pytorch-mnist", key=sys.argv[4])

state = train(return_state=True)
print("FLOW_RUN", state.state_details.flow_run_id, state.type.value, flush=True)
"""


QUEUED_GPUS = 2
"""GPUs per replica of the queued run: 6 for its 3 replicas, more than the hogs leave free."""
HOG_GPUS = 6
"""GPUs each hog pod holds on its node (of 8): 2 left free per node while they run."""


def occupy_gpus(kubeconfig: Path, namespace: str, *, seconds: int = 1800) -> list[str]:
    """Hold most GPUs of every GPU node: one pod per node, until :func:`free_gpus` (or ``seconds``).

    Each pod asks :data:`HOG_GPUS` of its node's ``nvidia.com/gpu`` (a test bed pod that runs
    ``seconds``): a job that needs more than what is left waits for the scheduler meanwhile
    ("Insufficient nvidia.com/gpu"), and is admitted once they are gone.

    Returns:
        The pods' names.
    """
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.kube.resources import NODES, PODS

    async def occupy() -> list[str]:
        async with await KubeClient.from_kubeconfig(str(kubeconfig)) as client:
            nodes = [
                node["metadata"]["name"]
                for node in (await client.list(NODES, None)).items
                if int((node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", 0))
                >= HOG_GPUS
            ]
            for node in nodes:
                gpus = {"nvidia.com/gpu": str(HOG_GPUS)}
                await client.create(
                    PODS,
                    namespace,
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"gpu-hog-{node}",
                            "annotations": {
                                "testbed.kubedl-prefect.io/run-duration": f"{seconds}s"
                            },
                        },
                        "spec": {
                            "nodeName": node,
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "hog",
                                    "image": "busybox",
                                    "resources": {"requests": gpus, "limits": gpus},
                                }
                            ],
                        },
                    },
                )
            return [f"gpu-hog-{node}" for node in nodes]

    return asyncio.run(occupy())


def free_gpus(kubeconfig: Path, namespace: str, pods: list[str]) -> None:
    """Delete the pods of :func:`occupy_gpus`: their GPUs are free at once."""
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.kube.resources import PODS

    async def free() -> None:
        async with await KubeClient.from_kubeconfig(str(kubeconfig)) as client:
            for name in pods:
                await client.delete(PODS, namespace, name)

    asyncio.run(free())


def run_training(
    server: PrefectServer,
    namespace: str,
    work: Path,
    *,
    run_duration: str | None = None,
    gpus: int | None = None,
) -> str:
    """Run the training flow on the test bed against ``server``; return the flow run's id.

    The replicas print greetings and the training's progress (``{"step": .., "total": ..}``).
    ``run_duration`` replaces how long the test bed's replicas run (``5s``), ``gpus`` how many
    GPUs each asks for.
    """
    process = start_training(server, namespace, work, run_duration=run_duration, gpus=gpus)
    return finished_flow_run(process)


def start_training(
    server: PrefectServer,
    namespace: str,
    work: Path,
    *,
    run_duration: str | None = None,
    gpus: int | None = None,
) -> subprocess.Popen[str]:
    """Start :func:`run_training`'s flow; its process (:func:`finished_flow_run` waits for it)."""
    from kubedl_prefect.spec import dump_spec, job_name, load_spec, parse_spec, spec_to_data
    from kubedl_prefect.testbed.testbed import Testbed

    testbed = Testbed(os.environ.get("KUBEDL_PREFECT_TESTBED", "default"))
    spec_file = ROOT / "flows" / "specs" / "testbed-mnist.yaml"
    if run_duration is not None or gpus is not None:
        data = spec_to_data(load_spec(spec_file))
        if run_duration is not None:
            data["annotations"] = {
                **data.get("annotations", {}),
                "testbed.kubedl-prefect.io/run-duration": run_duration,
            }
        if gpus is not None:
            data["resources"] = {**data.get("resources", {}), "gpus": gpus}
        spec_file = work / "spec.yaml"
        spec_file.write_text(dump_spec(parse_spec(data)))
    key = f"ui-check-{uuid.uuid4().hex[:6]}"
    name = job_name(load_spec(spec_file).name, key, 1)
    for replica in ("master-0", "worker-0", "worker-1"):
        log = testbed.pod_log(namespace, f"{name}-{replica}", "pytorch")
        log.write(f"rank {replica}: dataset ready, 60000 images", f"{replica}: NCCL init done")
    testbed.pod_log(namespace, f"{name}-master-0", "pytorch").write(
        *(
            json.dumps({"step": step, "total": 300, "epoch": 1 + step // 100, "loss": 2.3 / step})
            for step in (30, 90, 150, 210, 270)
        )
    )
    script = work / "run_training.py"
    script.write_text(RUN_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), str(testbed.kubeconfig), namespace, str(spec_file), key],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process


def finished_flow_run(process: subprocess.Popen[str], timeout_s: float = 300) -> str:
    """Wait for the training flow's process (:func:`run_training`); the flow run's id.

    Raises:
        RuntimeError: The flow failed, or did not complete.
    """
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    line = next((x for x in stdout.splitlines() if x.startswith("FLOW_RUN ")), None)
    if process.returncode != 0 or line is None:
        raise RuntimeError(f"the training flow failed:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    _, flow_run_id, state = line.split()
    if state != "COMPLETED":
        raise RuntimeError(f"the training flow ended {state}:\n{stdout[-3000:]}")
    return flow_run_id


def running_flow_run(server: PrefectServer, timeout_s: float = 600) -> str:
    """The id of the flow run that runs on ``server`` now (the one the check started).

    Raises:
        TimeoutError: None ran within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    body = {"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}, "limit": 2}
    while time.monotonic() < deadline:
        runs = api(server, "POST", "/flow_runs/filter", body)
        if runs:
            return str(runs[0]["id"])
        time.sleep(0.5)
    raise TimeoutError(f"no flow run was running on {server.url} after {timeout_s:g}s")


def api(server: PrefectServer, method: str, path: str, body: Any = None) -> Any:
    """One request to the server's REST API."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{server.api_url}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


def replica_logs(server: PrefectServer, flow_run_id: str, replica: str) -> list[dict[str, Any]]:
    """One replica's log lines of a flow run, picked by its logger name through the REST API.

    Prefect 3.9.1's UI filters a run's logs by level only; its API's text search
    (``logs.text.query``) matches each line's message and logger name.
    """
    body = {
        "logs": {
            "flow_run_id": {"any_": [flow_run_id]},
            "text": {"query": f"kubedl.replica.{replica}"},
        },
        "limit": 200,
    }
    found: list[dict[str, Any]] = api(server, "POST", "/logs/filter", body)
    return found


def wait_for_event(
    server: PrefectServer, flow_run_id: str, name: str, timeout_s: float = 60
) -> None:
    """Wait until the server has stored event ``name`` of the flow run (events arrive late).

    Raises:
        TimeoutError: It did not arrive in time.
    """
    deadline = time.monotonic() + timeout_s
    body = {
        "filter": {
            "event": {"name": [name]},
            "related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
        },
        "limit": 1,
    }
    while time.monotonic() < deadline:
        if api(server, "POST", "/events/filter", body)["events"]:
            return
        time.sleep(0.5)
    raise TimeoutError(f"event {name} of flow run {flow_run_id} never reached the server")


def _is_task_bar(pixel: tuple[int, int, int]) -> bool:
    red, green, blue = pixel
    return green > 150 and red < 100 and blue < 140


def _is_event_marker(pixel: tuple[int, int, int]) -> bool:
    red, green, blue = pixel
    return blue > 180 and red > 100 and green < 110


def graph_targets(png: bytes) -> tuple[list[int], list[tuple[int, int]], int]:
    """Where the run graph of a screenshot draws things: artifact badges and event markers.

    Returns:
        The x of each artifact badge (on the row above the task's bar), the (x, y) of each
        cluster of event markers (along the bottom axis), and the badges' row.
    """
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    top = next(
        (
            y
            for y in range(80, min(height, 600))
            if any(_is_task_bar(image.getpixel((x, y))) for x in range(260, width // 2))
        ),
        None,
    )
    badges: list[int] = []
    row = (top - 14) if top is not None else 0
    if top is not None:
        # A badge is a run of its grey background (text glyphs interrupt it briefly).
        start: int | None = None
        last = -100
        for x in range(260, width - 10):
            red, green, blue = image.getpixel((x, row))
            if max(red, green, blue) < 46:  # the graph's background, between badges
                continue
            if x - last > 2:
                if start is not None and last - start >= 60:
                    badges.append(start + 12)
                start = x
            last = x
        if start is not None and last - start >= 60:
            badges.append(start + 12)
    markers: list[tuple[int, int]] = []
    for y in range(100, min(height, 600)):
        for x in range(260, width - 10):
            if _is_event_marker(image.getpixel((x, y))) and not any(
                abs(x - mx) < 20 and abs(y - my) < 20 for mx, my in markers
            ):
                markers.append((x + 3, y + 3))
    return badges, markers, row


TASK_RUN = "train pytorch-mnist"
"""The training task run's name on the page: flows/specs/testbed-mnist.yaml's spec."""


@dataclass
class FlowRunPage:
    """What the flow-run page showed: the text of each panel opened on it."""

    page: str
    badges: list[int]
    markers: list[tuple[int, int]]
    events: list[str]
    artifacts: list[str]
    artifacts_tab: str


async def look_at_flow_run(
    server: PrefectServer, flow_run_id: str, images: Path | None = None
) -> FlowRunPage:
    """Open the flow-run page, click its event markers and artifacts; screenshots to ``images``."""

    def shot(name: str) -> Path:
        return (images or Path(tempfile.gettempdir())) / f"prefect-{name}.png"

    await asyncio.to_thread(wait_for_event, server, flow_run_id, "kubedl.training-job.succeeded")
    async with Browser() as browser:
        await browser.open(f"{server.url}/runs/flow-run/{flow_run_id}")
        # The task run is named after the spec (tasks.py's task_run_name), not the task.
        page = await browser.wait_for_text("Completed", "Artifacts", TASK_RUN)
        await asyncio.sleep(3)  # the graph draws its events and artifacts
        png = await browser.screenshot(shot("flow-run"))
        badges, markers, row = graph_targets(png)
        url = f"{server.url}/runs/flow-run/{flow_run_id}"

        async def reopen() -> None:
            # A fresh page for each panel: clicks on a graph with a panel open toggle it.
            await browser.open(url)
            await browser.wait_for_text("Completed", TASK_RUN)
            await asyncio.sleep(2.5)

        events: list[str] = []
        for x, y in markers:
            await reopen()
            before = await browser.text()
            await browser.click_at(x, y)
            await asyncio.sleep(1.5)
            text = await browser.text()
            events.append(text.replace(before, "", 1) if before in text else text)
            if "kubedl.training-job." in text:  # the last such panel: the run's end
                await browser.screenshot(shot("flow-run-events"))
        artifacts: list[str] = []
        # One badge per artifact the run leaves: replicas, metrics, progress, summary, links.
        for x in badges[:6]:
            await reopen()
            await browser.click_at(x, row)
            await asyncio.sleep(1.5)
            text = await browser.text()
            artifacts.append(text)
            opened = re.search(r"-(replicas|metrics|progress|summary)\s*\nDescription", text)
            if opened is not None:
                await browser.screenshot(shot(f"flow-run-{opened.group(1)}"))
        await browser.open(f"{server.url}/runs/flow-run/{flow_run_id}")
        await browser.wait_for_text("Artifacts")
        await asyncio.sleep(1)
        await browser.click_text("Artifacts")
        tab = await browser.wait_for_text("TABLE", "PROGRESS", "MARKDOWN")
        await browser.screenshot(shot("flow-run-artifacts"))
    return FlowRunPage(page, badges, markers, events, artifacts, tab)


@dataclass
class QueuedPage:
    """What the flow-run page showed while its job waited for GPUs: the page's text."""

    page: str
    reason: str
    """The log line that says why the job waits (``training job … queued: …``)."""


async def look_at_queued_run(
    server: PrefectServer, flow_run_id: str, images: Path | None = None
) -> QueuedPage:
    """Open the page of a flow run whose job waits for GPUs; screenshot it while it waits.

    The replica table's description and the task run's log say why the job waits; the Logs tab
    (the page's first) shows the line as soon as the run's logs reach the server.
    """
    async with Browser(height=1000) as browser:
        await browser.open(f"{server.url}/runs/flow-run/{flow_run_id}")
        # Volcano's gang line ("queued: 3/1 tasks in gang unschedulable ...") may come first;
        # the scheduler's own reason follows within seconds.
        page = await browser.wait_for_text(
            "Running", "queued:", "Insufficient nvidia.com/gpu", timeout_s=300
        )
        await asyncio.sleep(2)  # the graph draws the task and its first artifact
        page = await browser.text()
        await browser.screenshot(
            (images or Path(tempfile.gettempdir())) / "prefect-flow-run-queued.png"
        )
    queued = [line for line in page.splitlines() if "queued:" in line]
    reason = next((line for line in queued if "nvidia.com/gpu" in line), queued[0])
    return QueuedPage(page, reason)


@dataclass
class LogsPage:
    """What the flow run's Logs tab showed.

    Attributes:
        text: The page's text.
        rows: Each log row's text (its level, message, time, task run and logger name).
    """

    text: str
    rows: list[str]


async def look_at_replica_logs(
    server: PrefectServer, flow_run_id: str, images: Path | None = None
) -> LogsPage:
    """The flow run's Logs tab, scrolled to the replicas' lines, each under its logger name."""
    async with Browser(height=900) as browser:
        await browser.open(f"{server.url}/runs/flow-run/{flow_run_id}")
        await browser.wait_for_text("Completed", "kubedl.replica.worker-1", timeout_s=60)
        # The log's first rows at the top, under the tab's level and sort controls.
        await browser.evaluate(
            "(() => { const hit = document.querySelector('.log-row');"
            " if (hit) { hit.scrollIntoView({block: 'start'}); window.scrollBy(0, -130); }"
            " return !!hit; })()"
        )
        await asyncio.sleep(1)
        text = await browser.text()
        rows = await browser.evaluate(
            "[...document.querySelectorAll('.log-row')].map(e => e.innerText)"
        )
        await browser.screenshot(
            (images or Path(tempfile.gettempdir())) / "prefect-flow-run-logs.png"
        )
    return LogsPage(text, [str(row) for row in rows or []])


async def look_at_blocks_and_events(
    server: PrefectServer, flow_run_id: str, images: Path | None = None
) -> dict[str, str]:
    """Open the training-job block's form, a new cluster block's form and the event feed."""
    from kubedl_prefect.prefect.events import JobEvent

    documents = api(
        server,
        "POST",
        "/block_documents/filter",
        {"block_types": {"slug": {"any_": ["kubedl-training-job"]}}, "limit": 1},
    )
    events = "&".join(f"events={e.event_name}" for e in JobEvent)
    urls = {
        "block-form": f"{server.url}/blocks/block/{documents[0]['id']}/edit",
        "cluster-form": f"{server.url}/blocks/catalog/kubedl-kubernetes-cluster/create",
        "event-feed": f"{server.url}/events?resource=prefect.flow-run.{flow_run_id}&{events}",
    }
    texts: dict[str, str] = {}
    async with Browser(height=1300) as browser:
        for name, url in urls.items():
            await browser.open(url)
            await asyncio.sleep(4)
            texts[name] = await browser.text()
            await browser.screenshot(
                (images or Path(tempfile.gettempdir())) / f"prefect-{name}.png"
            )
    return texts


CHAIN_SCRIPT = """
import json, os, sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from flows import demo

state = Path(sys.argv[2])
mlflow = demo.start_mlflow(state)
try:
    demo.wait_healthy([mlflow])
    os.environ["MLFLOW_TRACKING_URI"] = mlflow.url
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    artifacts = (state / "mlflow" / "artifacts").as_uri()
    summary, model = demo.run_chain(mlflow.url, artifacts, epochs=1, state=state)
    try:
        seen = {
            "flow_run_id": summary.flow_run_id,
            "mlflow": mlflow.url,
            "model_server": model.url,
            "run_id": summary.run_id,
            "version": summary.model_uri.rsplit("/", 1)[1],
        }
        print("CHAIN", json.dumps(seen), flush=True)
        sys.stdin.readline()  # served until the browser has looked
    finally:
        model.stop()
finally:
    demo.drain_prefect()
    mlflow.stop()
"""


@dataclass
class ChainRun:
    """A train-and-serve run of :func:`start_chain` whose servers still answer.

    Attributes:
        process: The flow's process; it stops the model and MLflow servers when told to
            (:func:`stop_chain`).
        flow_run_id: The flow run.
        mlflow: The MLflow server's URL.
        model_server: The local model server's URL.
        run_id: The MLflow run that trained the version.
        version: The registered version of ``ddp-spirals``.
    """

    process: subprocess.Popen[str]
    flow_run_id: str
    mlflow: str
    model_server: str
    run_id: str
    version: str

    @property
    def links(self) -> dict[str, str]:
        """Where the chain's three link artifacts must point, by key."""
        return {
            "ddp-spirals-mlflow-run": f"{self.mlflow}/#/runs/{self.run_id}",
            "ddp-spirals-model-version": (
                f"{self.mlflow}/#/models/ddp-spirals/versions/{self.version}"
            ),
            "ddp-spirals-endpoint": f"{self.model_server}/v2/models/ddp-spirals",
        }


def start_chain(server: PrefectServer, work: Path, timeout_s: float = 900) -> ChainRun:
    """Run ``make demo``'s chain (flows/demo.py: LocalCluster, MLflow, local MLServer) once.

    One epoch of the example's 2-replica DDP training, registration, gate and local serving,
    in a flow run on ``server``, with an MLflow server of its own under ``work``. Returns once
    the flow run completed, its MLflow and model servers still running: :func:`stop_chain`
    stops them.

    Raises:
        RuntimeError: The flow failed, or did not complete in ``timeout_s``.
    """
    work.mkdir(parents=True, exist_ok=True)
    script = work / "run_chain.py"
    script.write_text(CHAIN_SCRIPT)
    out, err = work / "chain.out", work / "chain.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(script), str(ROOT), str(work)],
            env=server.env,
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        line = next((x for x in out.read_text().splitlines() if x.startswith("CHAIN ")), None)
        if line is not None:
            seen = json.loads(line.removeprefix("CHAIN "))
            return ChainRun(process, **seen)
        if process.poll() is not None or time.monotonic() > deadline:
            stop_chain(process)
            raise RuntimeError(
                "the train-and-serve chain failed:\n"
                + out.read_text()[-2000:]
                + err.read_text(errors="replace")[-4000:]
            )
        time.sleep(1)


def stop_chain(process: subprocess.Popen[str]) -> None:
    """Let the chain's process stop its servers and exit (killed after two minutes)."""
    if process.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            if process.poll() is None:
                process.stdin.write("done\n")
            process.stdin.close()
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


@dataclass
class ChainPage:
    """What the chain's flow-run page showed, and where its links went.

    Attributes:
        page: The text of the flow run's Artifacts tab.
        targets: For each link artifact's key, the targets of the links its own page shows
            (``/artifacts/artifact/<id>``; Prefect's own navigation left out).
        artifact: The text of the endpoint link's artifact page.
        endpoint: What the endpoint link's target showed when the browser followed it.
    """

    page: str
    targets: dict[str, list[str]]
    artifact: str
    endpoint: str


CHAIN_LINKS = ("ddp-spirals-mlflow-run", "ddp-spirals-model-version", "ddp-spirals-endpoint")
"""The chain's link artifacts (model and service ``ddp-spirals``, as in flows/demo.py)."""


async def look_at_chain(
    server: PrefectServer, chain: ChainRun, images: Path | None = None
) -> ChainPage:
    """The chain's flow-run page with its Artifacts tab, each link's page, the endpoint followed.

    Screenshots: ``prefect-chain-flow-run.png`` (the graph, whose tasks carry the link badges,
    and the Artifacts tab's cards) and ``prefect-chain-endpoint.png`` (the endpoint link's page).
    """
    folder = images or Path(tempfile.gettempdir())
    own = json.dumps(server.url)
    hrefs_js = (
        "[...document.querySelectorAll('a[href]')].map(a => a.href)"
        f".filter(h => !h.startsWith({own}))"
    )
    targets: dict[str, list[str]] = {}
    # Tall enough for the graph and the Artifacts tab's three rows of cards (nine artifacts).
    async with Browser(height=1320) as browser:
        await browser.open(f"{server.url}/runs/flow-run/{chain.flow_run_id}")
        await browser.wait_for_text("Completed", "serve-locally", "Artifacts", timeout_s=120)
        await asyncio.sleep(1)
        await browser.click_text("Artifacts")
        page = await browser.wait_for_text(*CHAIN_LINKS, timeout_s=60)
        await asyncio.sleep(2)  # the graph draws its artifact badges
        await browser.screenshot(folder / "prefect-chain-flow-run.png")
        artifact = ""
        for key in CHAIN_LINKS:
            (found,) = api(
                server,
                "POST",
                "/artifacts/filter",
                {"artifacts": {"key": {"any_": [key]}}, "limit": 1},
            )
            await browser.open(f"{server.url}/artifacts/artifact/{found['id']}")
            await browser.wait_for_text(key, "Task Run", timeout_s=60)
            await asyncio.sleep(1)
            targets[key] = [str(h) for h in await browser.evaluate(hrefs_js)]
            if key == "ddp-spirals-endpoint":
                artifact = await browser.text()
                await browser.screenshot(folder / "prefect-chain-endpoint.png", height=385)
        # Followed: the endpoint answers with the served model's V2 metadata.
        await browser.open(targets["ddp-spirals-endpoint"][0])
        await browser.wait_for_text("ddp-spirals", timeout_s=60)
        # Chromium shows a JSON answer in a <pre> (with a pretty-print switch above it).
        endpoint = str(
            await browser.evaluate("(document.querySelector('pre') || document.body).innerText")
        )
    return ChainPage(page, targets, artifact, endpoint)


def look_at_the_chain(server: PrefectServer, work: Path) -> None:
    """Run the train-and-serve chain, look at its page, save its screenshots, say its links."""
    chain = start_chain(server, work / "chain")
    try:
        page = asyncio.run(look_at_chain(server, chain, IMAGES))
    finally:
        stop_chain(chain.process)
    for key, targets in page.targets.items():
        print(f"link {key}: {targets}")


def main(argv: list[str] | None = None) -> None:
    """Run the check and save the screenshots under docs/images/.

    ``--chain`` takes the train-and-serve chain's screenshots only (no test bed needed).
    """
    import argparse

    from kubedl_prefect.testbed.testbed import Testbed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chain", action="store_true", help="only the chain's screenshots")
    args = parser.parse_args(argv)
    if args.chain:
        with (
            tempfile.TemporaryDirectory(prefix="kubedl-prefect-ui-") as work,
            prefect_server(Path(work)) as server,
        ):
            look_at_the_chain(server, Path(work))
        return
    testbed = Testbed(os.environ.get("KUBEDL_PREFECT_TESTBED", "default"))
    namespace = f"ui-check-{uuid.uuid4().hex[:6]}"
    testbed.create_namespace(namespace, labels={"kubedl-prefect.io/test": "true"})
    try:
        with tempfile.TemporaryDirectory(prefix="kubedl-prefect-ui-") as work:
            home = Path(work)
            with prefect_server(home) as server:
                # Pods hold most GPUs: the job waits for them, and runs once they are gone.
                hogs = occupy_gpus(testbed.kubeconfig, namespace)
                process = start_training(server, namespace, home, gpus=QUEUED_GPUS)
                try:
                    flow_run_id = running_flow_run(server)
                    queued = asyncio.run(look_at_queued_run(server, flow_run_id, IMAGES))
                    print("queued:", queued.reason)
                finally:
                    free_gpus(testbed.kubeconfig, namespace, hogs)
                    flow_run_id = finished_flow_run(process)
                seen = asyncio.run(look_at_flow_run(server, flow_run_id, IMAGES))
                asyncio.run(look_at_replica_logs(server, flow_run_id, IMAGES))
                asyncio.run(look_at_blocks_and_events(server, flow_run_id, IMAGES))
                print(f"graph: artifact badges at x={seen.badges}, event markers {seen.markers}")
                for text in seen.artifacts:
                    print("artifact panel:", text[-300:].replace("\n", " | "))
                # The whole train-and-serve chain (make demo's): its links, one followed.
                look_at_the_chain(server, home)
                for image in sorted(IMAGES.glob("prefect-*.png")):
                    print(f"saved {image.relative_to(ROOT)}")
    finally:
        testbed.delete_namespace(namespace)


if __name__ == "__main__":
    main()
