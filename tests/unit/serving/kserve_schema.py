"""The strict offline checker of KServe's InferenceService CRD (the full one, with its schema).

The CRD comes from the KServe module the test bed pins (``kubedl_prefect.testbed.upstream.KSERVE``,
``config/crd/full/serving.kserve.io_inferenceservices.yaml``: the same file the test bed
installs), fetched into the Go module cache; it is never copied into this repository.
"""

from __future__ import annotations

from functools import cache

import yaml

from kubedl_prefect.kube.resources import INFERENCE_SERVICES
from kubedl_prefect.testbed.upstream import KSERVE, module_file
from tests.unit.spec.crd_schema import CRDSchema

CRD_FILE = "config/crd/full/serving.kserve.io_inferenceservices.yaml"


@cache
def inference_service_schema() -> CRDSchema:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with module_file(KSERVE, CRD_FILE).open(encoding="utf-8") as handle:
        crd = yaml.load(handle, Loader=loader)
    return CRDSchema(crd, INFERENCE_SERVICES.api_version, INFERENCE_SERVICES.kind)
