"""Deleting what an operator may leave of a cancelled job (a TrainJob's JobSet and PodGroup).

Deleting a Kubeflow Trainer ``TrainJob`` lets the garbage collector remove what it owns, but
Trainer v2.3.0 leaves a failed job's Volcano PodGroup behind (kubeflow/trainer#4033), and a
JobSet or PodGroup whose owner reference was lost would stay forever. Cancellation therefore
deletes the objects :meth:`~.dialects.JobObjects.leftovers` names, each only when it is the
job's: owned by the job's uid, or by nothing (named like the job, which carries its key's hash).
Each delete has the object's uid as precondition, so an object made again meanwhile is left
alone. The v1 operators delete what they made themselves: nothing is read for their jobs.
"""

from __future__ import annotations

import logging

from kubedl_prefect.errors import ConflictError, ForbiddenError, KubeAPIError, NotFoundError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.kubernetes.dialects import JobObjects
from kubedl_prefect.spec import Dialect

logger = logging.getLogger(__name__)


def is_the_jobs(obj: KubeObject, job_uid: str) -> bool:
    """Whether a leftover found by name belongs to the job of ``job_uid`` (or to no one).

    Example:
        >>> is_the_jobs({"metadata": {"ownerReferences": [{"uid": "u2"}]}}, "u1")
        False
        >>> is_the_jobs({"metadata": {"ownerReferences": [{"uid": "u1"}]}}, "u1")
        True
        >>> is_the_jobs({"metadata": {}}, "u1")
        True
    """
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    if not owners:
        return True
    return bool(job_uid) and any(owner.get("uid") == job_uid for owner in owners)


async def adelete_leftovers(client: KubeClient, ref: JobRef) -> list[str]:
    """Delete the job's leftovers that are still there; returns ``Kind/name`` of each deleted.

    A read or delete that is refused (RBAC) or fails is logged and skipped: the cancellation's
    wait then names what is left.
    """
    deleted: list[str] = []
    for kind, name in JobObjects(Dialect(ref.dialect), ref.name).leftovers():
        try:
            obj = await client.get(kind, ref.namespace, name)
        except NotFoundError:
            continue
        except (ForbiddenError, KubeAPIError) as exc:
            logger.info("could not read %s %s/%s: %s", kind.kind, ref.namespace, name, exc)
            continue
        if not is_the_jobs(obj, ref.uid):
            continue
        uid = (obj.get("metadata") or {}).get("uid")
        try:
            await client.delete(kind, ref.namespace, name, uid=str(uid) if uid else None)
        except (ConflictError, NotFoundError):
            continue  # made again meanwhile (another uid), or gone
        except (ForbiddenError, KubeAPIError) as exc:
            logger.info("could not delete %s %s/%s: %s", kind.kind, ref.namespace, name, exc)
            continue
        deleted.append(f"{kind.kind}/{name}")
    return deleted
