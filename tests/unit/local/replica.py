"""A tiny training program for the local backend's tests (no torch): behaviour set by env.

It records what it was given (``env-<RANK>.json``) and each start (``starts-<name>``) in its
checkpoint directory, prints a few lines, then does what ``REPLICA_MODE`` says:

- ``ok``: exit 0;
- ``exit``: exit with ``REPLICA_EXIT`` on the replica named in ``REPLICA_WHO`` (others wait);
- ``sigkill-once``: on ``REPLICA_WHO``, SIGKILL itself during the first attempt only; resume
  from ``progress`` (the "checkpoint") otherwise;
- ``sleep``: print a tick every 0.1 s for ``REPLICA_SLEEP`` seconds;
- ``spawn``: start a child and a detached (setsid) grandchild that sleep for ever, write their
  pids to ``pids-<name>``, then sleep.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CONTRACT = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "TF_CONFIG",
    "PYTHONUNBUFFERED",
    "CUDA_VISIBLE_DEVICES",
    "KUBEDL_PREFECT_CHECKPOINT_DIR",
    "OMP_NUM_THREADS",
    "REPLICA_POD",
    "EXTRA",
)


def main() -> int:
    ckpt = Path(os.environ["KUBEDL_PREFECT_CHECKPOINT_DIR"])
    name = "-".join(os.environ["REPLICA_POD"].rsplit("-", 2)[-2:])  # <job>-worker-1
    mode = os.environ.get("REPLICA_MODE", "ok")
    who = os.environ.get("REPLICA_WHO", "")
    seen = {k: os.environ.get(k) for k in CONTRACT}
    seen["cwd"] = os.getcwd()
    seen["python"] = sys.executable
    (ckpt / f"env-{name}.json").write_text(json.dumps(seen))
    with open(ckpt / f"starts-{name}", "a") as starts:
        starts.write(f"{os.getpid()}\n")
    print(f"hello from {name}", flush=True)
    print(json.dumps({"step": 1, "total": 2}), flush=True)
    if mode == "exit":
        if name == who:
            print("failing on purpose", file=sys.stderr, flush=True)
            return int(os.environ.get("REPLICA_EXIT", "3"))
        time.sleep(30)
    elif mode == "sigkill-once":
        progress = ckpt / "progress"
        done = int(progress.read_text()) if progress.exists() else 0
        print(f"resuming at epoch {done}", flush=True)
        for epoch in range(done, 4):
            if name == "master-0":
                # Atomically: a replica starting meanwhile reads it (a truncated file is "").
                partial = ckpt / "progress.partial"
                partial.write_text(str(epoch + 1))
                partial.replace(progress)
            print(f"epoch {epoch}", flush=True)
            starts = (ckpt / f"starts-{name}").read_text().split()
            if name == who and epoch == 1 and len(starts) == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.1)
    elif mode == "sleep":
        until = time.monotonic() + float(os.environ.get("REPLICA_SLEEP", "30"))
        while time.monotonic() < until:
            print("tick", flush=True)
            time.sleep(0.1)
    elif mode == "spawn":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        daemon = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
        )
        (ckpt / f"pids-{name}").write_text(f"{child.pid} {daemon.pid}")
        print("spawned", flush=True)
        time.sleep(300)
    print(f"bye from {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
