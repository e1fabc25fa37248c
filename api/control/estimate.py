"""The estimate of a batch's (or a job's) work and completion time: what a quote answers
(``"dry_run": true``), what admission against the deadline refuses, and what the beat
keeps up to date as a batch runs (``estimated_completion_at``).

The work: the exact prompt tokens (``api/tokenizer.py``; token-id prompts as they are),
the output tokens the requests allow (``max_tokens`` times ``n``; a chat request naming
none: the context's end when ``INFLIGHT_MAX_MODEL_LEN`` is set, else the cap the API writes
into it) and those expected, the bound times the share the tenant's recent jobs produced of
theirs (the bound itself without history). Everything is per model: the work runs on its
model's workers, behind its model's queue. Its engine-seconds, at the live workers'
measured step cost (``worker/store/crud/throughput.py``: a fixed part per step plus a cost
per prompt row and per output row, fitted to their recent ``iterations``): the prompt
tokens the prefix cache is not expected to serve (the tenant's recent share), the
expected output tokens, and the steps they take at the concurrency the workers reach
(:func:`engine_seconds`).

The completion time: now plus the engine-seconds of the open work ahead of it and its own,
divided by what the live workers give to non-interactive work (one engine-second per
second each, less the share of their recent time interactive rows took: a worker idle
between interactive requests has that time for a batch). Workers read
batch work by its deadline (least slack first, ``worker.queue.slack``), so the work ahead
of a new batch is the remaining estimate of every open batch due no later than it and every
open job submitted alone in the batch class due by then (counted by deadline: the work a
worker reads first, the slack refinements aside); ahead of an interactive job only the
open interactive jobs (interactive work goes first).
With no live worker that has run anything, there is no throughput to go by: the estimate
has no engine-seconds and no completion time, and nothing is refused.

Where the batch estimate is computed: at ``POST /v1/batches``, before anything is written,
from the input file, which is stored already and which the request streams anyway to count
its lines. A refusal is an answer to that request (400 ``completion_window_unmeetable``
with the earliest window that can be met), and a quote must create nothing, so neither can
wait for the background expansion; the expansion, which parses every line again, only
turns the lines into jobs. The pass reads the file once, a line at a time, counting
prompts a thousand at a time through the tokenizer; lines that do not parse are left out
(they fail at expansion and cost nothing)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from api.context import Context
from api.control.input_lines import capped_lines
from api.control.submit import allowed_output_tokens
from api.errors import ApiError
from api.views import epoch
from worker.protocol.openai_batch import GenerationRequest, RequestParseError, parse_request_line
from worker.queue.slack import DEFAULT_WINDOW_S
from worker.store.base import utcnow
from worker.store.crud.throughput import (
    OpenBatch,
    StepCosts,
    TenantHistory,
    open_batches,
    open_single_jobs,
    step_costs,
    tenant_history,
)

CHUNK = 1000  # prompts counted through the tokenizer at once
MAX_WINDOW_HOURS = 9999  # the longest completion_window ("<N>h", N up to 4 digits)


@dataclass
class Work:
    """The requests of a batch or a job, summed."""

    requests: int = 0
    prompt_tokens: int = 0
    prompt_tokens_exact: bool = True
    output_bound: int = 0
    longest_output: int = 0  # the largest output bound of one request

    def add(self, ctx: Context, reqs: list[GenerationRequest]) -> None:
        """Count ``reqs``' prompt tokens (one tokenizer pass) and output bounds."""
        if not reqs:
            return
        counts = ctx.prompt_tokens.count(reqs)
        exact = ctx.prompt_tokens.exact
        for req, n in zip(reqs, counts, strict=True):
            self.requests += 1
            self.prompt_tokens += n
            self.prompt_tokens_exact &= exact or isinstance(req.prompt, list)
            bound = output_bound(ctx, req, n)
            self.output_bound += bound
            self.longest_output = max(self.longest_output, bound)


def output_bound(ctx: Context, req: GenerationRequest, prompt_tokens: int) -> int:
    """The output tokens ``req`` may produce, all samples (see the module docstring)."""
    allowed = allowed_output_tokens(req)
    if allowed is not None:
        return allowed
    limit = ctx.settings.max_model_len
    per_sample = (max(1, limit - prompt_tokens) if limit is not None
                  else ctx.settings.max_tokens_limit)
    return per_sample * req.params.n


def request_work(ctx: Context, reqs: list[GenerationRequest]) -> Work:
    """The work of parsed requests."""
    work = Work()
    work.add(ctx, reqs)
    return work


def batch_work(ctx: Context, path: str, endpoint: str) -> Work:
    """The work of a batch input file's lines for ``endpoint`` (read once, a line at a
    time; lines that do not parse, name another url or pass the byte limit are left out)."""
    work = Work()
    chunk: list[GenerationRequest] = []
    with open(path, "rb") as src:
        for line_no, (raw, _) in enumerate(
                capped_lines(src, max_bytes=ctx.settings.max_batch_line_bytes), start=1):
            if raw is None or not raw.strip():
                continue
            try:
                req = parse_request_line(raw, line_number=line_no)
            except RequestParseError:
                continue
            if req.endpoint == endpoint:
                chunk.append(req)
            if len(chunk) >= CHUNK:
                work.add(ctx, chunk)
                chunk = []
    work.add(ctx, chunk)
    return work


@dataclass
class Quote:
    """A work estimate priced at the measured throughput, and when it would be done."""

    work: Work
    created_at: datetime
    output_expected: int
    costs: StepCosts | None
    history: TenantHistory
    engine_seconds: float | None = None
    ahead_seconds: float | None = None
    completion_at: datetime | None = None
    window: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def meets_window(self) -> bool | None:
        """Whether it is done within its window (None: no window, or no estimate)."""
        if self.window is None or self.completion_at is None:
            return None
        return self.completion_at <= self.created_at + window_delta(self.window)

    @property
    def earliest_window(self) -> str | None:
        """The shortest ``<N>h`` window that holds the estimated completion (None when
        unknown, or past the longest window)."""
        if self.completion_at is None:
            return None
        hours = max(1, math.ceil((self.completion_at - self.created_at).total_seconds() / 3600))
        return f"{hours}h" if hours <= MAX_WINDOW_HOURS else None

    def view(self) -> dict[str, Any]:
        """The quote as answered (and stored on the batch as ``estimate``)."""
        w, c, h = self.work, self.costs, self.history
        return {
            "requests": w.requests,
            "prompt_tokens": w.prompt_tokens,
            "prompt_tokens_exact": w.prompt_tokens_exact,
            "output_tokens": {"bound": w.output_bound, "expected": self.output_expected},
            "engine_seconds": _round(self.engine_seconds),
            "queue_ahead_engine_seconds": _round(self.ahead_seconds),
            "estimated_completion_at": epoch(self.completion_at),
            "completion_window": self.window,
            "meets_window": self.meets_window,
            "earliest_completion_window": self.earliest_window,
            "basis": {
                "live_workers": c.workers if c else 0,
                "max_running": c.max_running if c else None,
                "step_seconds": _round(c.step_s if c else None, 9),
                "prompt_seconds_per_token": _round(c.prefill_s if c else None, 9),
                "output_seconds_per_token": _round(c.decode_s if c else None, 9),
                "interactive_share": _round(c.interactive_share if c else None),
                "history_jobs": h.jobs,
                "output_ratio": _round(h.output_ratio),
                "cached_ratio": _round(h.cached_ratio),
            },
            **self.extra,
        }


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


def window_delta(window: str) -> timedelta:
    """A ``<N>h`` completion window as a duration."""
    return timedelta(hours=int(window[:-1]))


def price(ctx: Context, tenant: str, work: Work, *, model: str, window: str | None,
          interactive: bool = False, due_at: datetime | None = None) -> Quote:
    """``work`` on ``model`` at the measured throughput of the live workers serving it,
    behind the open work of that model due no later than it (``due_at``, else now plus
    ``window``, else a day from now: a batch job's default deadline; see the module
    docstring), as of now."""
    now = utcnow()
    due = due_at or now + (window_delta(window) if window else timedelta(seconds=DEFAULT_WINDOW_S))
    with ctx.reads() as session:
        costs = step_costs(session=session, model=model,
                           worker_timeout=timedelta(seconds=ctx.settings.worker_timeout))
        history = tenant_history(session=session, tenant=tenant)
        batches = [] if interactive else [
            b for b in open_batches(session=session, model=model)
            if b.due_at is None or b.due_at <= due]
        singles = open_single_jobs(session=session, model=model, due_by=due)
    ratio = 1.0 if history.output_ratio is None else history.output_ratio
    quote = Quote(work=work, created_at=now, output_expected=round(work.output_bound * ratio),
                  costs=costs, history=history, window=window)
    if costs is None:
        return quote
    quote.engine_seconds = engine_seconds(work, costs, history)
    if interactive:
        quote.ahead_seconds = singles.seconds(interactive_only=True)
        capacity = float(costs.workers)
    else:
        quote.ahead_seconds = (sum(b.remaining_seconds for b in batches)
                               + singles.batch * (singles.mean_engine_seconds or 0.0))
        capacity = costs.batch_capacity
    quote.completion_at = now + timedelta(
        seconds=(quote.ahead_seconds + quote.engine_seconds) / capacity)
    return quote


def engine_seconds(work: Work, costs: StepCosts, history: TenantHistory) -> float:
    """The engine-seconds of ``work`` run on its own: its steps' fixed part, plus its
    computed prompt tokens (those the prefix cache is not expected to serve) and its
    expected output tokens at their cost per row. Its requests spread over the live
    workers (at most one worker per request), each running as many at once as the most
    any of them ran recently (at most its share of the requests); the steps are the
    output rows a worker has to produce at that concurrency, and never fewer than its
    longest request needs."""
    ratio = 1.0 if history.output_ratio is None else history.output_ratio
    expected = work.output_bound * ratio
    computed = work.prompt_tokens * (1.0 - (history.cached_ratio or 0.0))
    if not work.requests:
        return 0.0
    workers = min(costs.workers, work.requests)
    at_once = max(1.0, min(float(costs.max_running), work.requests / workers))
    steps = workers * max(expected / (workers * at_once), work.longest_output * ratio)
    return costs.step_s * steps + computed * costs.prefill_s + expected * costs.decode_s


def admit(ctx: Context, quote: Quote) -> None:
    """400 ``completion_window_unmeetable`` (with ``earliest_completion_window``) when the
    estimate ends after the window, unless the operator chose best effort
    (``INFLIGHT_DEADLINE_ADMISSION=0``)."""
    if quote.meets_window is not False or not ctx.settings.deadline_admission:
        return
    earliest = quote.earliest_window
    assert quote.completion_at is not None and quote.engine_seconds is not None
    raise ApiError(
        400,
        f"the batch cannot be completed within its {quote.window} window: its estimated "
        f"{quote.engine_seconds:.0f} engine-seconds behind {quote.ahead_seconds or 0:.0f} "
        f"queued ahead of it, at the live workers' measured throughput, end at "
        f"{quote.completion_at.isoformat(timespec='seconds')}; "
        + (f"the earliest window that can be met is {earliest}" if earliest
           else "no window can be met"),
        code="completion_window_unmeetable",
        param="completion_window",
        extra={"earliest_completion_window": earliest,
               "estimated_completion_at": epoch(quote.completion_at)},
    )


def refresh_estimates(ctx: Context) -> int:
    """Re-estimate the completion of every open batch (the beat, every 30 s): its
    remaining estimate behind the open batches of its model created before it and the
    open jobs of that model submitted alone in the batch class, at the throughput of the
    live workers serving it now; returns how many were written."""
    from sqlalchemy import select, update

    from worker.store.crud.tenant_usage import OPEN_BATCH_STATUSES
    from worker.store.models import Batch

    now = utcnow()
    etas: dict[str, datetime | None] = {}
    with ctx.reads() as session:
        models = sorted(m for m in session.scalars(select(Batch.model).distinct().where(
            Batch.status.in_(OPEN_BATCH_STATUSES))) if m is not None)
    for model in models:  # each model's batches queue behind that model's work only
        with ctx.reads() as session:
            costs = step_costs(session=session, model=model,
                               worker_timeout=timedelta(seconds=ctx.settings.worker_timeout))
            batches = open_batches(session=session, model=model)
            singles = open_single_jobs(session=session, model=model)
        etas |= completion_times(batches, costs, now,
                                 singles.batch * (singles.mean_engine_seconds or 0.0))
    with ctx.session_factory.begin() as session:
        for batch_id, eta in etas.items():
            session.execute(update(Batch).where(Batch.id == batch_id)
                            .values(estimated_completion_at=eta))
    return len(etas)


def completion_times(batches: Iterable[OpenBatch], costs: StepCosts | None, now: datetime,
                     singles_seconds: float) -> dict[str, datetime | None]:
    """Each open batch's completion time, taken in the order given (soonest due first, as
    workers read them; None without throughput, or for a batch with no estimate)."""
    out: dict[str, datetime | None] = {}
    ahead = singles_seconds
    for b in batches:
        ahead += b.remaining_seconds
        if costs is None or b.estimated_engine_seconds is None:
            out[b.id] = None
        else:
            out[b.id] = now + timedelta(seconds=ahead / costs.batch_capacity)
    return out
