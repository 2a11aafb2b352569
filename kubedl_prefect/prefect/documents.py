"""Block documents kept as YAML files (``blocks/*.yaml``), and the command that saves them.

A file lists blocks by type slug, name and fields::

    blocks:
      - type: kubedl-kubernetes-cluster
        name: testbed
        data:
          kubeconfig_path: ~/.cache/kubedl-prefect/testbed/default/kubeconfig
      - type: kubedl-training-job
        name: pytorch-mnist
        data:
          spec_file: flows/specs/testbed-mnist.yaml
          cluster: {block: testbed}        # the cluster block saved above, by name

Secrets stay out of the files: ``${NAME}`` in a value is replaced by the environment variable
``NAME`` (saving fails with the variable's name when it is unset), and Prefect stores the result
encrypted in its secret fields. Save every block of one or more files with::

    uv run python -m kubedl_prefect.prefect.documents blocks/testbed.yaml
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prefect.blocks.core import Block

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.prefect.blocks import KubernetesCluster, TrainingJob

BLOCK_TYPES: dict[str, type[Block]] = {
    KubernetesCluster.get_block_type_slug(): KubernetesCluster,
    TrainingJob.get_block_type_slug(): TrainingJob,
}
"""The block types a document may name, by slug."""

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class BlockDocument:
    """One block of a file: its type, the name to save it under, and the block."""

    slug: str
    name: str
    block: Block


def expand(value: Any, environ: Mapping[str, str]) -> Any:
    """``value`` with every ``${NAME}`` replaced by ``environ[NAME]``, recursively.

    Example:
        >>> expand({"token": "${T}", "n": 1}, {"T": "s3cr3t"})
        {'token': 's3cr3t', 'n': 1}

    Raises:
        KubeDLPrefectError: A variable is not set (named; its value would never be shown).
    """
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in environ:
                raise KubeDLPrefectError(
                    f"the block document uses ${{{name}}}, which is not set",
                    hint=f"export {name}=... before saving the blocks",
                )
            return environ[name]

        return _VARIABLE.sub(replace, value)
    if isinstance(value, dict):
        return {key: expand(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [expand(item, environ) for item in value]
    return value


def load_documents(
    path: str | Path, *, environ: Mapping[str, str] | None = None
) -> list[BlockDocument]:
    """The blocks a file describes, built and validated (nothing is saved).

    A field ``{block: NAME}`` refers to a block named earlier in the same file.

    Raises:
        KubeDLPrefectError: The file is malformed, names an unknown type, or uses an unset
            variable; pydantic's ``ValidationError`` for invalid fields.
    """
    file = Path(path)
    data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    entries = data.get("blocks") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise KubeDLPrefectError(
            f"{file}: a block document file holds a list under `blocks:`",
            hint="see blocks/README.md for the layout",
        )
    env = os.environ if environ is None else environ
    built: dict[str, Block] = {}
    documents: list[BlockDocument] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"type", "name"} <= set(entry):
            raise KubeDLPrefectError(
                f"{file}: block {index + 1} needs `type` and `name`",
                hint=f"types: {', '.join(sorted(BLOCK_TYPES))}",
            )
        slug, name = str(entry["type"]), str(entry["name"])
        kind = BLOCK_TYPES.get(slug)
        if kind is None:
            raise KubeDLPrefectError(
                f"{file}: block {name!r} has the unknown type {slug!r}",
                hint=f"types: {', '.join(sorted(BLOCK_TYPES))}",
            )
        fields = expand(dict(entry.get("data") or {}), env)
        for key, value in list(fields.items()):
            if isinstance(value, dict) and set(value) == {"block"}:
                if value["block"] not in built:
                    raise KubeDLPrefectError(
                        f"{file}: block {name!r} refers to {value['block']!r}, not defined above",
                        hint="define the referred block first in the same file",
                    )
                fields[key] = built[value["block"]]
        block = kind(**fields)
        built[name] = block
        documents.append(BlockDocument(slug, name, block))
    return documents


def save_documents(paths: Sequence[str | Path], *, overwrite: bool = True) -> list[str]:
    """Save every block of ``paths`` to the Prefect server; return ``slug/name`` of each."""
    saved: list[str] = []
    for path in paths:
        for document in load_documents(path):
            document.block.save(document.name, overwrite=overwrite)
            saved.append(f"{document.slug}/{document.name}")
    return saved


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kubedl_prefect.prefect.documents FILE...``: save the blocks of the files."""
    parser = argparse.ArgumentParser(
        prog="python -m kubedl_prefect.prefect.documents",
        description="Save the block documents of YAML files to the Prefect server.",
    )
    parser.add_argument("files", nargs="+", help="block document files (blocks/*.yaml)")
    parser.add_argument("--no-overwrite", action="store_true", help="keep existing documents")
    args = parser.parse_args(argv)
    try:
        saved = save_documents(args.files, overwrite=not args.no_overwrite)
    except (KubeDLPrefectError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name in saved:
        print(f"saved {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
