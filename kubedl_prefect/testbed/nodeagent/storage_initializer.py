"""A local storage initializer: what KServe's ``kserve/storage-initializer`` image does.

A process node runs it for that image (``python -m <this module> SRC DEST ...``).

KServe's init container gets pairs of arguments, a model's ``storageUri`` and the folder to fill
(``/mnt/models``), and its entry point (``initializer-entrypoint`` of the ``kserve_storage``
package, v0.20) fetches each source into its folder before the model server starts. This is the
same contract for the URI schemes the test bed serves from:

- ``file://<path>`` (or a plain existing path): each entry of the folder (or the file) is
  **copied** into the destination; a single ``.tar``, ``.tar.gz``/``.tgz`` or ``.zip`` is
  unpacked there instead. KServe's ``_download_local`` links the entries instead of copying
  them; the MLflow 3 of the model server's environment refuses to load such a model
  (``MlflowException: Invalid path: resolved path is outside the artifact directory``, seen on
  the process node), so the files are copied;
- ``http://`` and ``https://``: the file is downloaded into the destination, and unpacked when it
  is one of those archives.

Other schemes (``s3://``, ``gs://``, ``hf://``, ...) are refused with exit code 1 and a message
naming what is supported, as KServe fails an unknown one. The usage error, the log lines and the
exit codes follow KServe's entry point.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

logger = logging.getLogger("kserve.storage-initializer")

USAGE = "Usage: initializer-entrypoint src_uri_0 dest_path_0 ... src_uri_n dest_path_n"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


@dataclass(frozen=True)
class Fetch:
    """How one source is fetched.

    Attributes:
        kind: ``local`` (linked) or ``http`` (downloaded).
        location: The local path, or the URL.
    """

    kind: str
    location: str


def plan_fetch(uri: str, *, exists: bool = False) -> Fetch | str:
    """How ``uri`` is fetched, or why it cannot be (``exists``: it names an existing path).

    Example:
        >>> plan_fetch("file:///srv/mlflow/1/models/m-ab/artifacts")
        Fetch(kind='local', location='/srv/mlflow/1/models/m-ab/artifacts')
        >>> plan_fetch("https://models.example/model.tar.gz").kind
        'http'
        >>> plan_fetch("s3://ml/1/models/m-ab/artifacts")[:60]
        'Cannot recognize storage type for s3://ml/1/models/m-ab/arti'

    """
    if uri.startswith("file://"):
        return Fetch("local", uri[len("file://") :])
    if exists:
        return Fetch("local", uri)
    scheme = urlsplit(uri).scheme
    if scheme in ("http", "https"):
        return Fetch("http", uri)
    return (
        f"Cannot recognize storage type for {uri}: this test bed's storage initializer fetches "
        "'file://', 'http://' and 'https://' (and local paths)"
    )


def is_archive(name: str) -> bool:
    """Whether KServe unpacks a file of this name (tar, gzipped tar, zip).

    Example:
        >>> [is_archive(n) for n in ("m.tgz", "m.tar.gz", "m.zip", "MLmodel", "model.pkl")]
        [True, True, True, False, False]
    """
    return name.endswith(ARCHIVE_SUFFIXES)


def _unpack(archive: Path, target: Path) -> None:
    logger.info("Unpacking: %s", archive)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as packed:
            packed.extractall(target)
    else:
        with tarfile.open(archive) as packed:
            packed.extractall(target, filter="data")
    archive.unlink()


def fetch_local(path: str, dest: Path) -> None:
    """Copy the entries of ``path`` (or the file) into ``dest``; unpack a single archive.

    Raises:
        RuntimeError: ``path`` does not exist or holds nothing.
    """
    source = Path(path)
    if not source.exists():
        raise RuntimeError(f"Local path file://{path} does not exist.")
    entries = sorted(source.iterdir()) if source.is_dir() else [source]
    if not entries:
        raise RuntimeError(f"Failed to fetch model. No model found in file://{path}.")
    for entry in entries:
        target = dest / entry.name
        logger.info("Copying: %s to %s", entry, target)
        if target.exists() or target.is_symlink():
            logger.info("File %s already exist", target)
        elif entry.is_dir():
            shutil.copytree(entry, target)
        else:
            shutil.copyfile(entry, target)
    if len(entries) == 1 and is_archive(entries[0].name):
        _unpack(dest / entries[0].name, dest)


def fetch_http(url: str, dest: Path) -> None:
    """Download ``url`` into ``dest`` (unpacked when an archive).

    Raises:
        RuntimeError: The server answered with an error or could not be reached.
    """
    name = os.path.basename(urlsplit(url).path) or "model"
    target = dest / name
    try:
        with urllib.request.urlopen(url, timeout=60) as answer, target.open("wb") as out:
            shutil.copyfileobj(answer, out)
    except OSError as exc:
        raise RuntimeError(f"URI: {url} could not be downloaded: {exc}") from exc
    if is_archive(name):
        _unpack(target, dest)


def download(uri: str, dest: str) -> None:
    """Fetch ``uri`` into the folder ``dest`` (made when missing).

    Raises:
        RuntimeError: The source cannot be fetched (unknown scheme, missing, empty, refused).
    """
    logger.info("Copying contents of %s to local", uri)
    plan = plan_fetch(uri, exists=os.path.exists(uri))
    if isinstance(plan, str):
        raise RuntimeError(plan)
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    if plan.kind == "local":
        fetch_local(plan.location, folder)
    else:
        fetch_http(plan.location, folder)
    logger.info("Successfully copied %s to %s", uri, dest)


def main(argv: list[str]) -> int:
    """Fetch each ``SRC DEST`` pair of ``argv``; the exit code (1: usage or a failed fetch)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s.%(msecs)03d %(process)d %(levelname)s %(message)s"
    )
    if len(argv) < 2 or len(argv) % 2 != 0:
        print(USAGE)
        return 1
    pairs = list(zip(argv[0::2], argv[1::2], strict=True))
    logger.info("Initializing, args: (src_uri, dest_path): %s", pairs)
    try:
        for uri, dest in pairs:
            download(uri, dest)
    except RuntimeError as exc:
        logger.error("Storage initialization failed: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
