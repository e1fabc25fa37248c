"""What an estimate of a batch's work and completion time reads from the store: the live
workers' measured step cost (their recent ``iterations`` rows), a tenant's history
(produced against allowed output tokens, prompt tokens the prefix cache served) and the
open work queued now.

A step's time is modelled as a fixed part plus a cost per prompt row and per output row,
fitted to the recent steps: a token's share of a step (the engine-seconds accounting,
``worker/engine/step_cost.py``) depends on how many sequences share it, so a cost per
token averaged over the recent load would misprice a batch that runs at another."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from worker.store.crud.tenant_usage import OPEN_BATCH_STATUSES
from worker.store.crud.workers import live_worker_ids
from worker.store.job_lifecycle import OPEN, TERMINAL
from worker.store.models import Batch, Iteration, Job


@dataclass(frozen=True)
class StepCosts:
    """The live workers' measured step cost, ``step_s + prefill_s * prompt rows + decode_s
    * output rows`` (a least-squares fit over their recent steps: the fixed part is what a
    step costs whatever it computes, so a token's cost falls as more sequences share the
    steps), the share of their time interactive rows took, how many live workers
    there are and the most sequences one of them ran at once recently."""

    step_s: float
    prefill_s: float
    decode_s: float
    interactive_share: float
    workers: int
    max_running: int

    @property
    def batch_capacity(self) -> float:
        """Engine-seconds per second the workers give to work other than interactive."""
        return self.workers * max(0.05, 1.0 - self.interactive_share)


MIN_STEPS = 20  # fewer measured steps than this: no fit, no estimate
WARM_STEPS = 8
"""A worker's first steps are left out: a fresh engine's first step pays one-time costs
(SmolLM2-135M's took 27 s on the 2-core test machine, against 1 s for as many rows later),
which would price every prompt token at thirty times its cost."""


def step_costs(
    *, session: Session, worker_timeout: timedelta, model: str | None,
    steps_per_worker: int = 2000,
) -> StepCosts | None:
    """The costs over the last ``steps_per_worker`` steps of each live worker serving
    ``model`` (None: every live worker); None when they have not run enough prompt and
    output rows to measure. The interactive share is of the workers' time over those
    steps (first step's start to last step's end), not of the steps' time alone: a worker
    that ran a few interactive requests and idled between them gives nearly all its time
    to a batch that arrives, though every step it ran was interactive."""
    workers = sorted(live_worker_ids(session=session, within=worker_timeout, model=model))
    samples: list[tuple[int, int, float]] = []  # (prompt rows, output rows, seconds)
    interactive_s = total_s = wall_s = 0.0
    running = 0
    for worker_id in workers:
        rows = session.execute(
            select(Iteration.num_prefill_tokens, Iteration.num_decode_tokens,
                   Iteration.num_interactive_tokens, Iteration.num_running, Iteration.time,
                   (Iteration.schedule_ms + Iteration.forward_ms + Iteration.sample_ms).label("ms"))
            .where(Iteration.worker_id == worker_id, Iteration.step >= WARM_STEPS)
            .order_by(Iteration.step.desc())
            .limit(steps_per_worker)
        ).all()
        if rows:  # newest first: from the oldest step's start to the newest one's end
            wall_s += (rows[0].time - rows[-1].time).total_seconds() + rows[0].ms / 1000.0
        for p, d, inter, run, _, ms in rows:
            if p + d <= 0:
                continue
            t = ms / 1000.0
            samples.append((p, d, t))
            interactive_s += t * min(p + d, inter or 0) / (p + d)
            total_s += t
            running = max(running, run)
    fit = fit_step_cost(samples)
    if fit is None:
        return None
    return StepCosts(*fit, interactive_s / max(total_s, wall_s), len(workers), max(1, running))


def fit_step_cost(samples: list[tuple[int, int, float]]) -> tuple[float, float, float] | None:
    """``(step_s, prefill_s, decode_s)`` of ``t = step_s + prefill_s * p + decode_s * d``
    over (p, d, t) samples, by least squares, fitted again without the steps ten times
    further from the first fit than the median step (a stall: another process had the
    cores, the allocator grew). Where the steps vary too little to tell the
    three apart (a coefficient negative, or a cost per row not positive), one cost for
    every row and the fixed part; where even that fails, the accounting's own averages:
    each kind's share of the step times over its rows, no fixed part. None with too few
    samples, or none of a kind."""
    import numpy as np

    if len(samples) < MIN_STEPS or not any(p for p, _, _ in samples) \
            or not any(d for _, d, _ in samples):
        return None
    data = np.array(samples, dtype=float)  # [n, 3]: p, d, t
    p, d, t = data[:, 0], data[:, 1], data[:, 2]
    one = np.ones_like(p)

    def fit(*columns: Any) -> Any:
        return np.linalg.lstsq(np.column_stack(columns), t, rcond=None)[0]

    a, bp, bd = fit(one, p, d)
    residual = np.abs(t - (a + bp * p + bd * d))
    usual = residual <= 10 * max(float(np.median(residual)), 1e-9)  # a stall is no cost
    if usual.sum() >= MIN_STEPS and not usual.all():
        p, d, t, one = p[usual], d[usual], t[usual], one[usual]
        a, bp, bd = fit(one, p, d)
    if a >= 0 and bp > 0 and bd > 0:
        return float(a), float(bp), float(bd)
    a, b = fit(one, p + d)  # the kinds of row not told apart: one cost per row
    if a >= 0 and b > 0:
        return float(a), float(b), float(b)
    rows = p + d
    return 0.0, float((t * p / rows).sum() / p.sum()), float((t * d / rows).sum() / d.sum())


@dataclass(frozen=True)
class TenantHistory:
    """A tenant's recent finished jobs: the share of their allowed output tokens they
    produced, and of their prompt tokens the prefix cache served (both None without
    history)."""

    jobs: int
    output_ratio: float | None
    cached_ratio: float | None


def tenant_history(*, session: Session, tenant: str, jobs: int = 1000) -> TenantHistory:
    """Over the tenant's last ``jobs`` succeeded jobs that named their output bound."""
    recent = (
        select(Job.prompt_tokens, Job.completion_tokens, Job.cached_tokens, Job.max_tokens)
        .where(Job.tenant == tenant, Job.status == "succeeded", Job.max_tokens.is_not(None),
               Job.finished_at.is_not(None))
        .order_by(Job.finished_at.desc())
        .limit(jobs)
        .subquery()
    )
    n, prompt, produced, cached, allowed = session.execute(select(
        func.count(), func.sum(recent.c.prompt_tokens), func.sum(recent.c.completion_tokens),
        func.sum(recent.c.cached_tokens), func.sum(recent.c.max_tokens)))\
        .one()
    if not n:
        return TenantHistory(0, None, None)
    return TenantHistory(
        int(n),
        min(1.0, float(produced or 0) / float(allowed)) if allowed else None,
        float(cached or 0) / float(prompt) if prompt else None,
    )


@dataclass(frozen=True)
class OpenBatch:
    """An open batch's estimate, how many of its requests have ended, and when it is due
    (``expires_at``: workers read batch work by its deadline, ``worker.queue.slack``)."""

    id: str
    due_at: datetime | None
    estimated_engine_seconds: float | None
    requests: int
    ended: int

    @property
    def remaining_seconds(self) -> float:
        """Its estimated engine-seconds still to run: the share of its requests not ended."""
        if not self.estimated_engine_seconds or self.requests <= 0:
            return 0.0
        return self.estimated_engine_seconds * max(0, self.requests - self.ended) / self.requests


def open_batches(*, session: Session, model: str | None, limit: int = 10_000) -> list[OpenBatch]:
    """Every batch of ``model`` (None: of any) that has not ended, soonest due first, with
    its progress."""
    batches = session.execute(
        select(Batch.id, Batch.expires_at, Batch.estimated_engine_seconds, Batch.estimate,
               Batch.request_total)
        .where(Batch.status.in_(OPEN_BATCH_STATUSES),
               *(() if model is None else (Batch.model == model,)))
        .order_by(Batch.expires_at, Batch.id)
        .limit(limit)
    ).all()
    if not batches:
        return []
    ids = [b.id for b in batches]
    ended = dict(session.execute(
        select(Job.batch_id, func.count()).where(Job.batch_id.in_(ids), Job.status.in_(TERMINAL))
        .group_by(Job.batch_id)).tuples().all())
    return [OpenBatch(b.id, b.expires_at, b.estimated_engine_seconds,
                      int((b.estimate or {}).get("requests") or b.request_total or 0),
                      int(ended.get(b.id, 0)))
            for b in batches]


@dataclass(frozen=True)
class OpenJobs:
    """Jobs submitted alone (not in a batch) that are still open, per queue class, and the
    mean engine-seconds of such jobs recently finished (None without history)."""

    interactive: int
    batch: int
    mean_engine_seconds: float | None

    def seconds(self, *, interactive_only: bool = False) -> float:
        """Their estimated engine-seconds."""
        n = self.interactive + (0 if interactive_only else self.batch)
        return n * (self.mean_engine_seconds or 0.0)


def open_single_jobs(*, session: Session, model: str | None, due_by: datetime | None = None,
                     history: int = 500) -> OpenJobs:
    """The open jobs of ``model`` (None: of any) submitted alone (the batch-class ones due
    by ``due_by``, when given: those a worker reads first) and their recent mean cost."""
    of_model = () if model is None else (Job.model == model,)
    due = () if due_by is None else (
        (Job.queue_class != "batch") | Job.deadline.is_(None) | (Job.deadline <= due_by),)
    counts = dict(session.execute(
        select(Job.queue_class, func.count())
        .where(Job.batch_id.is_(None), Job.status.in_(OPEN), *of_model, *due)
        .group_by(Job.queue_class)).tuples().all())
    recent = (
        select(Job.engine_seconds)
        .where(Job.batch_id.is_(None), Job.engine_seconds.is_not(None), *of_model)
        .order_by(Job.finished_at.desc())
        .limit(history)
        .subquery()
    )
    mean = session.scalar(select(func.avg(recent.c.engine_seconds)))
    return OpenJobs(int(counts.get("interactive", 0)), int(counts.get("batch", 0)),
                    float(mean) if mean is not None else None)
