"""Workers and worker groups (Ray actors with group fan-out and futures)."""

from rlinf.sched.worker.group import GroupFuture, WorkerDiedError, WorkerError, WorkerGroup
from rlinf.sched.worker.worker import Worker

__all__ = ["GroupFuture", "Worker", "WorkerDiedError", "WorkerError", "WorkerGroup"]
