"""Property: any spec the model accepts, rendered and then imported, gives the same spec back.

"The same" is what each role gets: every job-level field, and for each role its count, restart
policy and effective settings (top-level settings applied; the pod-template fragments merged).
Where the spec had a setting at the top level or under every role alike, the import puts it at
the top level: the resolved roles are equal either way. Only the defaults of the operator the
importer writes out may be new (KubeDL's XGBoost TTL). Moreover the imported spec renders to the
same job, and importing its render again gives it back unchanged (the import is canonical).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from spec_strategies import attempt, valid_spec_data
from test_spec_properties import PROPERTY_SETTINGS

from kubedl_prefect.spec import Dialect, Framework, TrainingJobSpec, parse_spec, render
from kubedl_prefect.spec.porting import import_manifest
from kubedl_prefect.spec.renderers.common import deep_merge, render_resources
from kubedl_prefect.spec.semantics import differences, normal_form, operator_view
from kubedl_prefect.spec.types import main_container_names

_JOB_FIELDS = (
    "name",
    "framework",
    "backoff_limit",
    "active_deadline_seconds",
    "ttl_seconds_after_finished",
    "clean_pod_policy",
    "volumes",
    "checkpoint",
    "elastic",
    "labels",
    "annotations",
    "slots_per_worker",
    "success_policy",
    "nproc_per_node",
)


def _empty_to_none(value: Any) -> Any:
    if value is None:
        return None
    dumped = value.model_dump(exclude_defaults=True)
    return dumped or None


def _merged_template(
    spec: TrainingJobSpec, fragments: tuple[dict[str, Any], ...], container_name: str | None
) -> Any:
    """The role's pod-template fragments merged, the main container under one name."""
    aliases = main_container_names(spec.framework, container_name)
    merged: dict[str, Any] = {}
    for fragment in fragments:
        pod = fragment.get("spec") or {}
        containers = [
            {**c, "name": "(main)"} if c.get("name") in aliases else c
            for c in pod.get("containers") or []
        ]
        renamed = (
            {**fragment, "spec": {**pod, "containers": containers}} if containers else fragment
        )
        merged = deep_merge(merged, renamed)
    return merged


def resolved(spec: TrainingJobSpec) -> dict[str, Any]:
    """What every role of ``spec`` gets, comparable between two specs."""
    view: dict[str, Any] = {name: getattr(spec, name) for name in _JOB_FIELDS}
    for name in ("labels", "annotations", "volumes"):
        view[name] = view[name] or None  # empty renders as none
    view["gang"] = _empty_to_none(spec.gang)
    view["network"] = _empty_to_none(spec.network)
    for role in spec.resolved_roles():
        settings = {
            name: getattr(role, name)
            for name in (
                "count",
                "restart_policy",
                "image",
                "image_pull_policy",
                "command",
                "args",
                "working_dir",
                "env",
                "node_selector",
                "tolerations",
                "affinity",
                "priority_class_name",
                "ports",
                "service_account_name",
                "image_pull_secrets",
                "container_name",
            )
        }
        for name in ("node_selector", "tolerations", "ports", "image_pull_secrets"):
            settings[name] = settings[name] or None  # empty renders as none
        settings["resources"] = render_resources(role.resources)
        # The render puts the main container first whatever the fragments' order: compare the
        # containers by name.
        settings["pod_template"] = normal_form(
            _merged_template(spec, role.pod_templates, role.container_name)
        )
        view[role.role.value] = settings
    return view


@PROPERTY_SETTINGS
@given(data=valid_spec_data())
def test_render_then_import_gives_the_spec_back(data: dict[str, Any]) -> None:
    spec = parse_spec(data)
    for dialect in (Dialect.KUBEDL, Dialect.KUBEFLOW):  # Trainer's own: test_trainer
        manifest, error = attempt(lambda d=dialect: render(spec, d))
        if error is not None:
            continue  # an operator rule (KubeDL: no elastic); the CRD property test covers it
        imported = import_manifest(manifest).spec
        expected = resolved(spec)
        if (
            dialect is Dialect.KUBEDL
            and spec.framework is Framework.XGBOOST
            and spec.ttl_seconds_after_finished is None
        ):
            expected["ttl_seconds_after_finished"] = 100  # KubeDL's default, written out
        assert resolved(imported) == expected
        again = render(imported, dialect)
        assert differences(operator_view(again), operator_view(manifest)) == []
        assert import_manifest(again).spec == imported


@PROPERTY_SETTINGS
@given(data=valid_spec_data())
def test_a_rendered_trainjob_imports_and_renders_back_the_same(data: dict[str, Any]) -> None:
    # A TrainJob has one template for every node, so the imported spec has one role: the
    # property is about the job, not the spec's shape.
    spec = parse_spec(data)
    manifest, error = attempt(lambda: render(spec, Dialect.TRAINER))
    if error is not None:
        return  # Trainer refuses much; test_trainer says what and why
    imported = import_manifest(manifest).spec
    again = render(imported, Dialect.TRAINER)
    assert differences(operator_view(again), operator_view(manifest)) == []
    assert import_manifest(again).spec == imported
