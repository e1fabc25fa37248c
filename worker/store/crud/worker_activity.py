"""Data access for ``inflight top``: each worker's heartbeat, its latest engine step and
its throughput over the last few seconds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.models import Iteration, Job, Worker, WorkerStatus

# windowed sums look at most this many of a worker's latest steps, so each query is a
# bounded range of the (worker_id, step) primary key / (worker_id, first_step) index
STEP_BOUND = 100_000


@dataclass
class WorkerActivity:
    """One worker as ``inflight top`` shows it. Step fields are None without iterations
    rows (a worker that has not stepped yet, or runs with ``--no-traces``)."""

    id: str
    host: str
    model: str
    status: str
    heartbeat_age_s: float
    alive: bool  # not stopped, and beat within the worker timeout
    step: int | None = None  # latest step
    step_at: datetime | None = None
    running: int | None = None  # batch size at the latest step
    waiting: int | None = None
    running_interactive: int | None = None  # of them, interactive (None: not recorded)
    waiting_interactive: int | None = None
    kv_used: int | None = None
    kv_total: int | None = None
    steps_per_s: float = 0.0
    tokens_per_s: float = 0.0  # prefill + decode tokens computed
    decode_tokens_per_s: float = 0.0
    jobs_per_s: float = 0.0  # jobs it finished

    @property
    def kv_use(self) -> float | None:
        """KV blocks used at the latest step, as a fraction of the pool."""
        if self.kv_used is None or not self.kv_total:
            return None
        return self.kv_used / self.kv_total


def worker_activity(
    *,
    session: Session,
    window_s: float = 5.0,
    now: datetime | None = None,
    worker_timeout_s: float = 30.0,
    include_stopped: bool = False,
) -> list[WorkerActivity]:
    """Every worker (stopped ones only with ``include_stopped``), by id, with its latest
    step and its rates over the ``window_s`` seconds before ``now``: engine steps, tokens
    (prefill + decode, and decode alone) from ``iterations``, finished jobs from
    ``jobs.finished_at``."""
    now = now or utcnow()
    since = now - timedelta(seconds=window_s)
    stmt = select(Worker).order_by(Worker.id)
    if not include_stopped:
        stmt = stmt.where(Worker.status != WorkerStatus.STOPPED.value)
    out = []
    for w in session.scalars(stmt):
        age = (now - w.heartbeat_at).total_seconds()
        act = WorkerActivity(
            id=w.id, host=w.host, model=w.model, status=w.status, heartbeat_age_s=age,
            alive=w.status != WorkerStatus.STOPPED.value and age <= worker_timeout_s,
        )  # fmt: skip
        last = session.scalars(
            select(Iteration)
            .where(Iteration.worker_id == w.id)
            .order_by(Iteration.step.desc())
            .limit(1)
        ).first()
        if last is not None:
            act.step, act.step_at = last.step, last.time
            act.running, act.waiting = last.num_running, last.num_waiting
            act.running_interactive = last.num_running_interactive
            act.waiting_interactive = last.num_waiting_interactive
            act.kv_used, act.kv_total = last.kv_blocks_used, last.kv_blocks_total
            row = session.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(Iteration.num_prefill_tokens), 0),
                    func.coalesce(func.sum(Iteration.num_decode_tokens), 0),
                ).where(
                    Iteration.worker_id == w.id,
                    Iteration.step > last.step - STEP_BOUND,
                    Iteration.time > since,
                    Iteration.time <= now,
                )
            ).one()
            act.steps_per_s = int(row[0]) / window_s
            act.tokens_per_s = (int(row[1]) + int(row[2])) / window_s
            act.decode_tokens_per_s = int(row[2]) / window_s
        finished = session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.worker_id == w.id, Job.finished_at > since, Job.finished_at <= now)
        )
        act.jobs_per_s = int(finished or 0) / window_s
        out.append(act)
    return out
