"""``inflight trace JOB_ID``: one job's timeline, and what else was in its batch while it
waited in the queue, prefilled and decoded (from the ``iterations`` table); ``--plot``
draws batch occupancy and KV use over its lifetime."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.store.crud.job_trace import JobTrace, PhaseStats


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``trace``."""
    p = subparsers.add_parser(
        "trace",
        help="one job's timeline and what else was in its batch",
        description="Print a job's timeline (queued, started, first token, finished; queue "
        "wait, time to first token, time per output token, end to end) and, for each phase "
        "(queue wait, prefill, decode), the batch it was in: steps, batch size, KV use, "
        "preemptions, step time and the other jobs that overlapped. Exit status 1 for an "
        "unknown job.",
    )
    p.add_argument("job_id")
    p.add_argument("--json", action="store_true", help="print the trace as one JSON object")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw batch occupancy and KV use over the job's lifetime")  # fmt: skip
    p.add_argument("--longest", type=int, default=5,
                   help="list this many of the longest overlapping jobs per phase (default 5)")  # fmt: skip
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.set_defaults(func=run)


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if abs(seconds) < 1.0:
        return f"{seconds * 1000:.1f} ms"
    if abs(seconds) < 120.0:
        return f"{seconds:.3f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _f(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def trace_dict(trace: JobTrace) -> dict[str, Any]:
    """A JSON-ready dict of a trace: timeline, derived latencies (seconds), phases."""
    phases = []
    for p in trace.phases:
        phases.append(
            {
                "name": p.name,
                "first_step": p.first_step,
                "last_step": p.last_step,
                "steps": p.steps,
                "start": _iso(p.start),
                "end": _iso(p.end),
                "mean_running": p.mean_running,
                "max_running": p.max_running,
                "mean_waiting": p.mean_waiting,
                "max_waiting": p.max_waiting,
                "mean_kv_used": p.mean_kv_used,
                "max_kv_used": p.max_kv_used,
                "kv_total": p.kv_total,
                "mean_kv_use": p.mean_kv_use,
                "max_kv_use": p.max_kv_use,
                "preemptions": p.preemptions,
                "prefill_tokens": p.prefill_tokens,
                "decode_tokens": p.decode_tokens,
                "mean_step_ms": p.mean_step_ms,
                "max_step_ms": p.max_step_ms,
                "overlapping": p.overlapping,
                "longest": [
                    {
                        "id": j.id,
                        "status": j.status,
                        "first_step": j.first_step,
                        "last_step": j.last_step,
                        "steps": j.steps,
                        "prompt_tokens": j.prompt_tokens,
                        "completion_tokens": j.completion_tokens,
                    }
                    for j in p.longest
                ],
            }
        )
    return {
        "id": trace.id,
        "status": trace.status,
        "worker_id": trace.worker_id,
        "attempts": trace.attempts,
        "error": trace.error,
        "isolation": trace.isolation,
        "finish_reason": trace.finish_reason,
        "prompt_tokens": trace.prompt_tokens,
        "completion_tokens": trace.completion_tokens,
        "queued_at": _iso(trace.queued_at),
        "started_at": _iso(trace.started_at),
        "first_token_at": _iso(trace.first_token_at),
        "finished_at": _iso(trace.finished_at),
        "first_step": trace.first_step,
        "last_step": trace.last_step,
        "queue_wait_s": trace.queue_wait_s,
        "ttft_s": trace.ttft_s,
        "prefill_s": trace.prefill_s,
        "tpot_s": trace.tpot_s,
        "e2e_s": trace.e2e_s,
        "phases": phases,
        "notes": list(trace.notes),
    }


def _steps(p: PhaseStats) -> str:
    if p.first_step is None or p.last_step is None or p.last_step < p.first_step:
        return "-"
    return f"{p.first_step}..{p.last_step}"


def format_trace(trace: JobTrace, *, now: datetime | None = None) -> str:
    """The human-readable trace ``inflight trace`` prints (``now``: for how long a job
    not started yet has been waiting)."""
    lines = [f"job {trace.id}", f"  status       {trace.status}"
             + (f" ({trace.finish_reason})" if trace.finish_reason else "")]  # fmt: skip
    steps = "-" if trace.first_step is None else f"{trace.first_step}..{trace.last_step}"
    lines.append(f"  worker       {trace.worker_id or '-'}    attempts {trace.attempts}    "
                 f"steps {steps}")  # fmt: skip
    if trace.prompt_tokens is not None or trace.completion_tokens is not None:
        lines.append(f"  tokens       prompt {trace.prompt_tokens}, completion "
                     f"{trace.completion_tokens}")  # fmt: skip
    if trace.error:
        lines.append(f"  error        {trace.error}")
    if trace.isolation:
        lines.append(f"  isolated     {trace.isolation}")
    lines.append("timeline")
    base = trace.queued_at
    for label, t in (("queued", trace.queued_at), ("started", trace.started_at),
                     ("first token", trace.first_token_at), ("finished", trace.finished_at)):  # fmt: skip
        if t is None:
            lines.append(f"  {label:12} -")
            continue
        rel = f"  (+{_dur((t - base).total_seconds())})" if base is not None and t != base else ""
        lines.append(f"  {label:12} {t.isoformat()}{rel}")
    lines.append(
        f"  queue wait {_dur(trace.queue_wait_s)}   time to first token {_dur(trace.ttft_s)}   "
        f"time per output token {_dur(trace.tpot_s)}   end to end {_dur(trace.e2e_s)}"
    )
    if not trace.started:
        waited = ""
        if now is not None and trace.queued_at is not None and trace.finished_at is None:
            waited = f", queued {_dur((now - trace.queued_at).total_seconds())} ago"
        lines.append(f"not started yet (status {trace.status}{waited}): no engine steps to show")
    if trace.phases:
        lines.append("batch, per phase (batch = running sequences; KV = blocks used of the pool)")
        lines.append(
            f"  {'PHASE':8} {'STEPS':>15} {'ROWS':>6} {'BATCH mean/max':>15} "
            f"{'WAITING mean/max':>17} {'KV mean/max':>12} {'PREEMPT':>7} {'STEP ms':>8} "
            f"{'OTHER JOBS':>10}"
        )
        for p in trace.phases:
            batch = (
                f"{_f(p.mean_running, '.2f')}/{p.max_running if p.max_running is not None else '-'}"
            )
            waiting = (
                f"{_f(p.mean_waiting, '.2f')}/{p.max_waiting if p.max_waiting is not None else '-'}"
            )
            kv = f"{_pct(p.mean_kv_use)}/{_pct(p.max_kv_use)}"
            lines.append(
                f"  {p.name:8} {_steps(p):>15} {p.steps:>6} {batch:>15} {waiting:>17} {kv:>12} "
                f"{p.preemptions:>7} {_f(p.mean_step_ms, '.2f'):>8} {p.overlapping:>10}"
            )
        for p in trace.phases:
            if not p.overlapping:
                continue
            shown = ", ".join(
                f"{j.id} ({j.steps} steps, {j.completion_tokens if j.completion_tokens is not None else '?'} "
                "out tokens)"
                for j in p.longest
            )
            more = p.overlapping - len(p.longest)
            lines.append(f"  {p.name}: {p.overlapping} other jobs; longest: {shown}"
                         + (f" and {more} more" if more > 0 else ""))  # fmt: skip
    for note in trace.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def plot_trace(*, trace: JobTrace, rows: list[Any], path: str) -> None:
    """Draw running/waiting sequences and KV use against time (seconds from the job's
    start) to ``path``, the job's span shaded, its first token marked. Needs matplotlib
    (the ``bench`` extra); without it, raises ``RuntimeError`` saying how to install it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install 'inflight[bench]'") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert trace.started_at is not None
    t0 = trace.started_at

    def rel(t: datetime) -> float:
        return (t - t0).total_seconds()

    xs = [rel(r.time) for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(11, 6))
    ax1.step(xs, [r.num_running for r in rows], where="post", label="running (batch size)")
    ax1.step(xs, [r.num_waiting for r in rows], where="post", linestyle="--", label="waiting")
    ax1.set_ylabel("sequences")
    kv = [100.0 * r.kv_blocks_used / r.kv_blocks_total if r.kv_blocks_total else 0.0 for r in rows]
    ax2.step(xs, kv, where="post", color="tab:green", label="KV blocks used")
    ax2.set_ylabel("KV use (%)")
    ax2.set_ylim(0, 105)
    ax2.set_xlabel(f"seconds from the job's start ({t0.isoformat()})")
    end = trace.finished_at
    for ax in (ax1, ax2):
        if trace.queued_at is not None and trace.queued_at < t0:
            ax.axvspan(rel(trace.queued_at), 0.0, color="tab:gray", alpha=0.12,
                       label="queued" if ax is ax1 else None)  # fmt: skip
        if end is not None:
            ax.axvspan(0.0, rel(end), color="tab:orange", alpha=0.2,
                       label="this job" if ax is ax1 else None)  # fmt: skip
        if trace.first_token_at is not None:
            ax.axvline(rel(trace.first_token_at), color="tab:red", linewidth=1,
                       label="first token" if ax is ax1 else None)  # fmt: skip
        ax.grid(True, alpha=0.3)
    for ax in (ax1, ax2):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax1.set_title(f"job {trace.id} on worker {trace.worker_id} ({trace.status})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_window(trace: JobTrace) -> tuple[datetime, datetime]:
    """The job's lifetime with context: a quarter of its span (at least a second) either
    side, and back to when it was queued."""
    from worker.store.base import utcnow

    assert trace.started_at is not None
    end = trace.finished_at or utcnow()
    pad = max((end - trace.started_at) / 4, timedelta(seconds=1))
    start = trace.started_at - pad
    if trace.queued_at is not None:
        start = min(start, trace.queued_at)
    return start, end + pad


def run(args: argparse.Namespace) -> int:
    """Print the trace (and draw it with --plot); 1 for an unknown job or nothing to plot."""
    from worker.store.crud.job_trace import iteration_series, job_trace
    from worker.store.db import database_url, make_engine, make_session_factory

    db = make_engine(url=database_url(args.database_url))
    try:
        with make_session_factory(engine=db)() as s:
            trace = job_trace(session=s, job_id=args.job_id, longest=args.longest)
            rows: list[Any] = []
            if trace is not None and args.plot and trace.started_at and trace.worker_id:
                start, end = _plot_window(trace)
                rows = iteration_series(session=s, worker_id=trace.worker_id, start=start, end=end)
    finally:
        db.dispose()
    if trace is None:
        print(f"inflight trace: no job {args.job_id!r}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(trace_dict(trace), indent=2))
    else:
        from worker.store.base import utcnow

        print(format_trace(trace, now=utcnow()))
    if args.plot:
        if not trace.started or not trace.worker_id:
            print(f"inflight trace: nothing to plot, job {trace.id} has not started",
                  file=sys.stderr)  # fmt: skip
            return 1
        if not rows:
            print(f"inflight trace: nothing to plot, no iterations rows of worker "
                  f"{trace.worker_id} around job {trace.id}", file=sys.stderr)  # fmt: skip
            return 1
        try:
            plot_trace(trace=trace, rows=rows, path=args.plot)
        except RuntimeError as exc:
            print(f"inflight trace: {exc}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
