"""A real distributed training program: PyTorch DDP on the CPU, checkpointed, logged to MLflow.

Run it as every replica of a PyTorch job::

    command: [python, -m, kubedl_prefect_examples.ddp_train]
    args: [--epochs, "6"]

It reads only what the operators (and kubedl-prefect's local backend) give a replica:

- ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``: the rendezvous (gloo), as
  ``env://`` reads them, but with the store listening on ``MASTER_ADDR`` only when that is a
  loopback address (:mod:`.rendezvous`: torch's own store would listen on every interface);
  without them it trains alone;
- ``KUBEDL_PREFECT_CHECKPOINT_DIR``: where rank 0 writes ``checkpoint.pt`` after every epoch
  (model, optimizer, epoch, metrics; written aside and renamed, so a kill never leaves half a
  file) and where every rank resumes from at start-up: a retried attempt goes on at the next
  epoch instead of starting over. The checkpoint holds tensors and plain values only and is
  loaded with ``weights_only=True``: a crafted file is refused, not run;
- the model handoff (:mod:`kubedl_prefect.spec.handoff`): with ``MLFLOW_RUN_ID`` set, rank 0
  logs the parameters, one metric point per epoch and the model into that run
  (``run`` mode), or saves the MLflow model to ``KUBEDL_PREFECT_MODEL_DIR`` (``output`` mode).

The model is an ``nn.Sequential`` of built-in layers, logged with the ``pickle`` serialization
format pinned: loading it needs torch and nothing of this package, so a model server (MLServer's
MLflow runtime, ``mlflow models serve``) loads it; MLflow 3.14+'s default, ``pt2``, is not
readable by the MLflow 2.x inside KServe's stock runtime. A pickled model is code to whatever
loads it: register only models whose origin you trust.

The data need no download: a three-class spiral in two dimensions, generated from a fixed seed
(the same on every rank and every attempt), split 80/20 into training and validation sets; each
rank trains on its shard of the training set (``DistributedSampler``). A linear model cannot
separate the spirals; the network reaches over 90 % validation accuracy in a few epochs.

Progress goes to standard output as JSON lines that the Prefect surface turns into a progress
bar: ``{"step": 120, "total": 600, "epoch": 2, "loss": 0.41}``; every other line is plain text.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from kubedl_prefect.spec.handoff import HandoffMode, is_rank_zero, read_handoff
from kubedl_prefect.spec.types import CHECKPOINT_ENV
from kubedl_prefect_examples.rendezvous import init_process_group

CHECKPOINT_FILE = "checkpoint.pt"
FEATURES = 2
CLASSES = 3


@dataclass(frozen=True)
class Settings:
    """The training's parameters (logged to MLflow as they are)."""

    epochs: int = 6
    batch_size: int = 64
    lr: float = 0.01
    hidden: int = 64
    samples: int = 3000
    seed: int = 7
    epoch_pause_s: float = 0.0


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """Settings from the command line."""
    parser = argparse.ArgumentParser(prog="python -m kubedl_prefect_examples.ddp_train")
    defaults = Settings()
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--hidden", type=int, default=defaults.hidden)
    parser.add_argument("--samples", type=int, default=defaults.samples)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--epoch-pause-s",
        type=float,
        default=defaults.epoch_pause_s,
        help="sleep after each epoch (to watch a run, or to interrupt one in a test)",
    )
    args = parser.parse_args(argv)
    return Settings(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        hidden=args.hidden,
        samples=args.samples,
        seed=args.seed,
        epoch_pause_s=args.epoch_pause_s,
    )


def spirals(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` points of three interleaved noisy spirals, and their class."""
    generator = torch.Generator().manual_seed(seed)
    per_class = samples // CLASSES
    points, labels = [], []
    for label in range(CLASSES):
        radius = torch.linspace(0.05, 1.0, per_class)
        angle = (
            label * 2 * math.pi / CLASSES
            + radius * 4.0
            + 0.2 * torch.randn(per_class, generator=generator)
        )
        points.append(torch.stack([radius * torch.sin(angle), radius * torch.cos(angle)], dim=1))
        labels.append(torch.full((per_class,), label, dtype=torch.long))
    x, y = torch.cat(points), torch.cat(labels)
    order = torch.randperm(len(x), generator=generator)
    return x[order], y[order]


def build_model(hidden: int) -> nn.Sequential:
    """The network: built-in layers only, so that loading it needs nothing but torch."""
    return nn.Sequential(
        nn.Linear(FEATURES, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


def say(**fields: Any) -> None:
    """One JSON line on standard output (progress and metrics), flushed at once."""
    print(json.dumps(fields, sort_keys=True), flush=True)


def log(text: str) -> None:
    """One plain line, flushed (``PYTHONUNBUFFERED=0``, as the operators set it, buffers)."""
    print(text, flush=True)


def checkpoint_dir() -> Path:
    """``$KUBEDL_PREFECT_CHECKPOINT_DIR``, else ``./checkpoints``."""
    return Path(os.environ.get(CHECKPOINT_ENV) or "checkpoints")


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The latest checkpoint, if there is one: tensors and plain values, never code.

    Raises:
        RuntimeError: The file holds anything else (an object whose loading could run code).
    """
    target = path / CHECKPOINT_FILE
    if not target.exists():
        return None
    try:
        data: dict[str, Any] = torch.load(target, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise RuntimeError(
            f"refusing to load {target}: it holds more than tensors and plain values, and "
            f"loading it could run code ({str(exc).splitlines()[0]}); delete it to start over"
        ) from exc
    return data


def save_checkpoint(path: Path, data: dict[str, Any]) -> None:
    """Write the checkpoint aside, then rename it into place: never half a file.

    ``data`` holds tensors and plain values only, so that :func:`load_checkpoint` reads it with
    ``weights_only=True``.
    """
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{CHECKPOINT_FILE}.{os.getpid()}"
    torch.save(data, tmp)
    os.replace(tmp, path / CHECKPOINT_FILE)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Loss and accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(dim=1) == y).float().mean().item()
    model.train()
    return loss, accuracy


def train(settings: Settings) -> dict[str, float]:
    """Train (resuming from the checkpoint), hand the model over; the final metrics."""
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed and not dist.is_initialized():  # a function task's bootstrap joined it
        init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(settings.seed)
    threads = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(int(threads) if threads and threads.isdigit() else 1)

    x, y = spirals(settings.samples, settings.seed)
    cut = int(len(x) * 0.8)
    train_set = TensorDataset(x[:cut], y[:cut])
    x_val, y_val = x[cut:], y[cut:]
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train_set, num_replicas=world, rank=rank, seed=settings.seed
    )
    loader = DataLoader(train_set, batch_size=settings.batch_size, sampler=sampler)

    model = build_model(settings.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    where = checkpoint_dir()
    saved = load_checkpoint(where)
    start, history = 0, []
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start, history = int(saved["epoch"]) + 1, list(saved["history"])
        log(f"rank {rank}: resuming from {where / CHECKPOINT_FILE} at epoch {start}")
    else:
        log(f"rank {rank}: starting from scratch ({world} replicas, checkpoints in {where})")
    ddp: nn.Module = DistributedDataParallel(model) if distributed else model

    steps_per_epoch = len(loader)
    total = steps_per_epoch * settings.epochs
    for epoch in range(start, settings.epochs):
        sampler.set_epoch(epoch)
        running = 0.0
        for step, (features, labels) in enumerate(loader, start=1):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(features), labels)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            running += loss.item()
            if rank == 0 and (step % 10 == 0 or step == steps_per_epoch):
                say(
                    step=epoch * steps_per_epoch + step,
                    total=total,
                    epoch=epoch,
                    loss=round(running / step, 4),
                )
        val_loss, val_accuracy = evaluate(model, x_val, y_val)
        metrics = {
            "train_loss": running / max(steps_per_epoch, 1),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
        }
        history.append({"epoch": epoch, **metrics})
        if rank == 0:
            save_checkpoint(
                where,
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "history": history,
                    "settings": asdict(settings),
                },
            )
            log(
                f"epoch {epoch} done: train_loss={metrics['train_loss']:.4f} "
                f"val_loss={val_loss:.4f} val_accuracy={val_accuracy:.3f} (checkpoint saved)"
            )
        if distributed:
            dist.barrier()  # every rank resumes from the same epoch after a failure
        if settings.epoch_pause_s:
            time.sleep(settings.epoch_pause_s)

    final = history[-1] if history else {}
    if is_rank_zero():
        hand_over(model, settings, history)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return {k: float(v) for k, v in final.items()}


def hand_over(model: nn.Sequential, settings: Settings, history: list[dict[str, float]]) -> None:
    """Log parameters, metrics and the model through the handoff (nothing without one)."""
    handoff = read_handoff()
    if handoff is None:
        log("no model handoff in the environment (MLFLOW_RUN_ID unset): the model is not logged")
        return
    import mlflow
    import mlflow.pytorch
    from mlflow.models import infer_signature

    example = spirals(8, settings.seed + 1)[0]
    model.eval()
    with torch.no_grad():
        signature = infer_signature(example.numpy(), model(example).numpy())
    if handoff.mode is HandoffMode.OUTPUT and handoff.model_dir:
        mlflow.pytorch.save_model(
            model,
            handoff.model_dir,
            signature=signature,
            input_example=example.numpy(),
            serialization_format="pickle",
        )
        log(f"saved the MLflow model to {handoff.model_dir}")
        return
    with mlflow.start_run(run_id=handoff.run_id):
        mlflow.log_params(asdict(settings))
        for point in history:
            epoch = int(point["epoch"])
            mlflow.log_metrics({k: v for k, v in point.items() if k != "epoch"}, step=epoch)
        logged = mlflow.pytorch.log_model(
            model,
            name=handoff.model_artifact,
            signature=signature,
            input_example=example.numpy(),
            serialization_format="pickle",
        )
    log(f"logged the model to MLflow run {handoff.run_id} as {logged.model_uri}")


def main(argv: Sequence[str] | None = None) -> int:
    """Train with the settings of ``argv``; exit 0 on success."""
    final = train(parse_args(argv))
    if is_rank_zero() and final:
        say(final=final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
