"""The deployments of flows/prefect.yaml: ``prefect deploy`` creates them on a real Prefect server
with their schedules, the production work pool's job template renders to a Job the API server
accepts, and every deployment names a flow and parameters that exist."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.templating import apply_values

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
TEMPLATE = ROOT / "deploy" / "prefect-work-pool.json"
PREFECT_YAML = ROOT / "flows" / "prefect.yaml"
JOBS = ResourceKind("batch", "v1", "Job", "jobs")
NIGHTLY = ["--name", "nightly"]


def production_deployment() -> dict[str, Any]:
    deployments = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
    return next(d for d in deployments if d["name"] == "nightly-production")


def rendered_job(namespace: str) -> dict[str, Any]:
    """The Job a Kubernetes worker would create for the production deployment's flow run."""
    template = json.loads(TEMPLATE.read_text())
    variables = {
        name: schema["default"]
        for name, schema in template["variables"]["properties"].items()
        if "default" in schema
    }
    values = {
        **variables,
        **production_deployment()["work_pool"]["job_variables"],
        "namespace": namespace,
        "name": "nightly-production-abc12",
        "command": "prefect flow-run execute",
    }
    configuration = apply_values(template["job_configuration"], values)
    manifest: dict[str, Any] = configuration["job_manifest"]
    # As the Kubernetes worker does: the environment becomes the container's env list.
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in configuration["env"].items()]
    container["args"] = configuration["command"].split()
    return manifest


def test_the_job_template_renders_a_job_the_api_server_accepts(
    namespace: str, admin_kubeconfig: Path
) -> None:
    manifest = rendered_job(namespace)
    pod = manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "kubedl-prefect"  # the ServiceAccount of deploy/rbac.yaml
    assert pod["automountServiceAccountToken"] is True  # in-cluster credentials
    assert manifest["metadata"]["namespace"] == namespace
    assert pod["containers"][0]["image"] == "ghcr.io/example/kubedl-prefect-flows:0.1.0"
    assert {"name": "KUBEDL_PREFECT_PROJECT_DIR", "value": "/opt/flows"} in pod["containers"][0][
        "env"
    ]
    assert "{{" not in json.dumps(manifest)

    async def dry_run() -> dict[str, Any]:
        client = await KubeClient.from_kubeconfig(str(admin_kubeconfig))
        try:
            return await client.create(JOBS, namespace, manifest, dry_run=True)
        finally:
            await client.close()

    accepted = KubeRuntime.get().block_on(dry_run())
    assert accepted["kind"] == "Job"
    assert accepted["spec"]["template"]["spec"]["serviceAccountName"] == "kubedl-prefect"


def test_the_deployments_name_existing_flows_and_their_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect.client.schemas.schedules import CronSchedule

    monkeypatch.chdir(ROOT)
    for deployment in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]:
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        accepted = set(inspect.signature(flow.fn).parameters)
        assert set(deployment["parameters"]) <= accepted, deployment["name"]
        for schedule in deployment["schedules"]:
            CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])
        assert flow.on_cancellation_hooks
        assert flow.on_crashed_hooks
    nightly = next(
        d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"] if d["name"] == "nightly"
    )
    assert (ROOT / nightly["parameters"]["spec"]).exists()


def test_prefect_deploy_creates_the_nightly_deployment_with_its_schedule(
    prefect_server: dict[str, str],
) -> None:
    # A newcomer's environment: the server, and no PYTHONPATH of the tests'.
    env = {k: v for k, v in prefect_server.items() if k != "PYTHONPATH"}
    env["KUBEDL_PREFECT_PROJECT_DIR"] = str(ROOT)
    # The commands of the tutorial (docs/tutorial.md), as a newcomer types them.
    for command in (
        ["prefect", "work-pool", "create", "local", "--type", "process"],
        ["prefect", "--no-prompt", "deploy", "--prefect-file", str(PREFECT_YAML), *NIGHTLY],
    ):
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    async def read() -> Any:
        async with get_client() as client:
            return await client.read_deployment_by_name("retrain/nightly")

    deployment = asyncio.run(read())
    assert deployment.entrypoint == "flows/training.py:retrain"
    assert deployment.work_pool_name == "local"
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in deployment.schedules] == [
        ("0 2 * * *", "UTC", True)
    ]
    assert deployment.parameters["cluster"] == "testbed"
    assert deployment.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}
    ]
