"""Every replica's log lines in the Prefect run's log, labelled, and rate-limited per replica.

Lines arrive from the lifecycle's log follower on a thread of their own and go to the run's
log as ``worker-1 | <text>``, each replica under a logger name of its own,
``kubedl.replica.<replica>`` (:func:`replica_logger_name`): the Prefect API stores a log's
logger name with the line, the UI shows it beside the line, so one replica's lines can be told
apart and filtered. The lines still go through the run logger's handlers (so they reach the run,
with its flow run and task run ids), only the record's name is the replica's.

A replica that prints faster than the Prefect API should take (``rate`` lines a second after a
``burst``) has its extra lines held back — counted, not queued — and the next line that gets
through, or the end of the job, says how many were held back. So a chatty job never grows a
backlog: the watch and the job go on at their own pace, and the Prefect API sees at most
``burst + rate x seconds`` lines per replica.

:class:`TokenBucket` is pure (the clock is passed in); :class:`LogForwarder` writes to a logger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from kubedl_prefect.lifecycle.backend import LogLine
from kubedl_prefect.prefect.context import Logger

DEFAULT_RATE: Final = 20.0
"""Lines per second, per replica, sent to the Prefect API (after the burst)."""
DEFAULT_BURST: Final = 200
"""Lines a replica may send at once before the rate applies."""
REPLICA_LOGGER: Final = "kubedl.replica"
"""The stem of the replicas' logger names: ``kubedl.replica.worker-1``."""


def replica_logger_name(replica: str) -> str:
    """The logger name a replica's lines carry in the run's log (every attempt the same).

    Example:
        >>> replica_logger_name("worker-1")
        'kubedl.replica.worker-1'
    """
    return f"{REPLICA_LOGGER}.{replica}"


@dataclass
class TokenBucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` saved up.

    Example:
        >>> bucket = TokenBucket(rate=1.0, burst=2, tokens=2.0, at=0.0)
        >>> [bucket.take(0.0), bucket.take(0.0), bucket.take(0.0), bucket.take(1.0)]
        [True, True, False, True]
    """

    rate: float
    burst: int
    tokens: float
    at: float

    def take(self, now: float) -> bool:
        """Take one token at time ``now``; whether there was one."""
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class ReplicaLog:
    """What one replica sent and held back."""

    bucket: TokenBucket
    sent: int = 0
    held: int = 0
    held_total: int = 0


@dataclass
class LogForwarder:
    """Writes log lines to a logger, labelled with their replica, rate-limited per replica.

    Args:
        logger: Where lines go (the Prefect run's logger).
        rate: Lines a second per replica after the burst.
        burst: Lines a replica may send at once.
        clock: The monotonic clock (tests pass their own).

    Example:
        >>> import logging
        >>> from kubedl_prefect.lifecycle.backend import LogLine
        >>> forward = LogForwarder(logging.getLogger("doc"), rate=1.0, burst=1, clock=lambda: 0.0)
        >>> for text in ("a", "b", "c"):
        ...     forward(LogLine("worker-1", "pytorch", "", text))
        >>> forward.replicas["worker-1"].sent, forward.replicas["worker-1"].held
        (1, 2)
    """

    logger: Logger
    rate: float = DEFAULT_RATE
    burst: int = DEFAULT_BURST
    clock: Callable[[], float] = time.monotonic
    replicas: dict[str, ReplicaLog] = field(default_factory=dict)

    def _replica(self, name: str) -> ReplicaLog:
        replica = self.replicas.get(name)
        if replica is None:
            now = self.clock()
            replica = ReplicaLog(TokenBucket(self.rate, self.burst, float(self.burst), now))
            self.replicas[name] = replica
        return replica

    def __call__(self, line: LogLine) -> None:
        """Forward one line, or count it as held back."""
        label = _label(line)
        replica = self._replica(label)
        if not replica.bucket.take(self.clock()):
            replica.held += 1
            replica.held_total += 1
            return
        if replica.held:
            self._report_held(label, line.replica, replica)
        replica.sent += 1
        self._log(line.replica, logging.INFO, "%s | %s", label, line.text)

    def _log(self, replica: str, level: int, message: str, *args: object) -> None:
        """Log through the run logger's handlers, under the replica's logger name."""
        log(self.logger, replica_logger_name(replica), level, message, *args)

    def _report_held(self, label: str, name: str, replica: ReplicaLog) -> None:
        self._log(
            name,
            logging.WARNING,
            "%s | held back %d log line%s (more than %g lines/s); read them with kubectl logs",
            label,
            replica.held,
            "" if replica.held == 1 else "s",
            self.rate,
        )
        replica.held = 0

    def flush(self) -> None:
        """Say how many lines each replica still has held back (at the end of the job)."""
        for label, replica in sorted(self.replicas.items()):
            if replica.held:
                self._report_held(label, label.split(" ", 1)[0], replica)

    @property
    def held_total(self) -> int:
        """Lines held back over all replicas."""
        return sum(r.held_total for r in self.replicas.values())

    @property
    def sent_total(self) -> int:
        """Lines sent over all replicas."""
        return sum(r.sent for r in self.replicas.values())


def log(logger: Logger, name: str, level: int, message: str, *args: object) -> None:
    """Log ``message % args`` through ``logger``'s handlers as a record named ``name``.

    ``logger`` is the run's logger (a Prefect adapter carrying the flow run and task run ids as
    extras) or a plain one; the record gets the adapter's extras, so Prefect's API handler sends
    it to the run, and the name the Prefect UI shows beside the line.

    Example:
        >>> import logging
        >>> records = []
        >>> handler = logging.Handler()
        >>> handler.emit = records.append
        >>> base = logging.getLogger("doc.run")
        >>> base.addHandler(handler)
        >>> log(logging.LoggerAdapter(base, {"task_run_id": "t1"}), "kubedl.replica.worker-1",
        ...     logging.WARNING, "%s | %s", "worker-1", "hello")
        >>> records[0].name, records[0].getMessage(), records[0].task_run_id
        ('kubedl.replica.worker-1', 'worker-1 | hello', 't1')
    """
    if isinstance(logger, logging.LoggerAdapter):
        base = logger.logger
        _, kwargs = logger.process(message, {})
        extra = dict(kwargs.get("extra") or {})
    else:
        base, extra = logger, {}
    if not base.isEnabledFor(level):
        return
    record = base.makeRecord(name, level, __file__, 0, message, args, None, extra=extra)
    base.handle(record)


def _label(line: LogLine) -> str:
    """``worker-1``; ``worker-1 (attempt 2)`` for a later attempt's lines."""
    if line.attempt > 1:
        return f"{line.replica} (attempt {line.attempt})"
    return line.replica
