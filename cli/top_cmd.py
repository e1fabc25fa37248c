"""``inflight top``: a live terminal view of the workers (batch size, waiting, KV use,
tokens/s, jobs/s, heartbeat) and the queue depths per stream."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


def _positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds greater than zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a number of seconds > 0")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``top``."""
    p = subparsers.add_parser(
        "top",
        help="live view of the workers and the queues",
        description="Per worker: status, heartbeat age, latest step, batch size (running "
        "sequences), waiting sequences, KV use, tokens/s, decode tokens/s and jobs/s over the "
        "last --window seconds, then running/waiting sequences per service class (INTER: "
        "interactive, BATCH R/W: batch) (from the iterations and jobs tables). Per stream of each "
        "model a worker served within the last hour (the interactive stream, each batch lane in "
        "least-slack order, the dead letters): length, pending (delivered, not acked) and "
        "undelivered entries of the consumer group, and a lane's deadline and slack.",
    )
    p.add_argument(
        "--interval", type=_positive_seconds, default=1.0, help="seconds between frames (1)"
    )
    p.add_argument("--window", type=_positive_seconds, default=5.0,
                   help="seconds the rates are averaged over (5)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--all", action="store_true", help="show stopped workers too")
    p.add_argument("--worker-timeout", type=float, default=30.0,
                   help="a worker silent this long is shown as stale (30 s)")  # fmt: skip
    p.add_argument("--redis-url", default=None, help="overrides REDIS_URL")
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.add_argument("--prefix", default="inflight", help="Redis key prefix")
    p.set_defaults(func=run)


def _n(value: Any) -> str:
    return "-" if value is None else str(value)


def _classes(w: Any) -> str:
    """Running/waiting sequences of each class at the latest step: interactive, batch."""
    ri, wi = getattr(w, "running_interactive", None), getattr(w, "waiting_interactive", None)
    if ri is None or wi is None or w.running is None or w.waiting is None:
        return f"{'-':>9} {'-':>9}"
    return f"{f'{ri}/{wi}':>9} {f'{w.running - ri}/{w.waiting - wi}':>9}"


def format_workers(workers: list[Any]) -> list[str]:
    """The workers table of a frame."""
    lines = [
        f"{'WORKER':24} {'STATUS':9} {'HB AGE':>7} {'STEP':>8} {'BATCH':>5} {'WAIT':>5} "
        f"{'KV%':>5} {'TOK/S':>9} {'DEC/S':>8} {'JOBS/S':>7} {'INTER':>9} {'BATCH R/W':>9}  MODEL"
    ]
    if not workers:
        lines.append("  (no workers)")
    for w in workers:
        status = w.status if w.alive or w.status == "stopped" else f"{w.status}?"
        kv = "-" if w.kv_use is None else f"{100 * w.kv_use:.0f}"
        lines.append(
            f"{w.id[:24]:24} {status[:9]:9} {w.heartbeat_age_s:>6.1f}s {_n(w.step):>8} "
            f"{_n(w.running):>5} {_n(w.waiting):>5} {kv:>5} {w.tokens_per_s:>9.1f} "
            f"{w.decode_tokens_per_s:>8.1f} {w.jobs_per_s:>7.2f} {_classes(w)}  {w.model}"
        )
    if any(not w.alive and w.status != "stopped" for w in workers):
        lines.append("  (status? : no heartbeat within the worker timeout; dead or stuck)")
    return lines


def _span(seconds: float | None) -> str:
    """Seconds as a signed short span: ``+2h05m``, ``-40s``; ``-`` for None."""
    if seconds is None:
        return "-"
    sign, left = ("-" if seconds < 0 else "+"), int(abs(seconds))
    if left < 60:
        return f"{sign}{left}s"
    if left < 3600:
        return f"{sign}{left // 60}m{left % 60:02d}s"
    if left < 86400:
        return f"{sign}{left // 3600}h{left % 3600 // 60:02d}m"
    return f"{sign}{left // 86400}d{left % 86400 // 3600:02d}h"


def format_streams(depths: list[Any], now: float | None = None) -> list[str]:
    """The queue table of a frame: one row per stream of each model (its batch lanes in
    the order the workers read them, least slack first, each with its deadline from now
    and its slack)."""
    now = time.time() if now is None else now
    lines = [f"{'MODEL':32} {'STREAM':11} {'LENGTH':>8} {'PENDING':>8} {'UNDELIVERED':>11} "
             f"{'CONSUMERS':>9} {'DUE':>8} {'SLACK':>8}"]
    if not depths:
        lines.append("  (no model served recently)")
    for d in depths:
        lag = f"~{d.lag}" if d.lag_estimated else _n(d.lag)
        due = None if d.deadline is None else d.deadline - now
        lines.append(
            f"{(d.model or '-')[:32]:32} {d.kind[:11]:11} {d.length:>8} {_n(d.pending):>8} "
            f"{lag:>11} {_n(d.consumers):>9} {_span(due):>8} {_span(d.slack):>8}"
        )
    if any(d.lag_estimated for d in depths):
        lines.append("  (~: Redis cannot tell the lag after deletions; length less pending)")
    if any(d.kind == "batch" for d in depths):
        lines.append("  (batch: one lane per deadline bucket; DUE: its earliest deadline; SLACK: "
                     "DUE less its remaining work at the measured rate)")
    return lines


class _Sources:
    """The database and Redis connections a running ``top`` reuses between frames."""

    def __init__(self, args: argparse.Namespace) -> None:
        from worker.queue.connection import make_redis, redis_url
        from worker.queue.keys import QueueKeys
        from worker.store.db import database_url, make_engine, make_session_factory

        self.args = args
        self.db = make_engine(url=database_url(args.database_url))
        self.session_factory = make_session_factory(engine=self.db)
        self.redis_url = redis_url(args.redis_url)
        # short timeouts: an unreachable Redis must not freeze the view
        self.redis = make_redis(url=self.redis_url, connect_timeout=1, timeout=2)
        self.keys = QueueKeys(prefix=args.prefix)

    def close(self) -> None:
        self.redis.close()
        self.db.dispose()

    def frame(self) -> str:
        """One frame of the view, as text."""
        from datetime import timedelta

        from worker.queue.stream_stats import stream_stats
        from worker.store.base import utcnow
        from worker.store.crud.served_models import models_seen
        from worker.store.crud.worker_activity import worker_activity

        args = self.args
        now = utcnow()
        lines = [
            f"inflight top  {now.strftime('%Y-%m-%d %H:%M:%S')} UTC  rates over {args.window:g} s"
            + ("" if args.once else f", every {args.interval:g} s (Ctrl-C quits)"),
            "",
        ]
        try:
            with self.session_factory() as s:
                workers = worker_activity(
                    session=s, window_s=args.window, now=now,
                    worker_timeout_s=args.worker_timeout, include_stopped=args.all,
                )  # fmt: skip
            lines += format_workers(workers)
        except Exception as exc:
            lines.append(f"store: unreachable ({type(exc).__name__}: {_first_line(exc)})")
        lines.append("")
        try:
            with self.session_factory() as s:
                seen = models_seen(session=s, live_within=timedelta(seconds=args.worker_timeout),
                                   recent_within=timedelta(hours=1), now=now)
        except Exception:
            seen = None  # the store's error is in the workers table's place already
        try:
            self.redis.ping()
            depths = [
                d
                for model in sorted(seen.recent if seen else ())
                for d in stream_stats(redis_client=self.redis, keys=self.keys.for_model(model))
            ]
            lines += format_streams(depths)
        except Exception as exc:
            lines.append(f"redis: unreachable ({_display_url(self.redis_url)}: {_first_line(exc)})")
        return "\n".join(lines) + "\n"


def _display_url(url: str) -> str:
    """``url`` without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    auth, at, hosts = parts.netloc.rpartition("@")  # a cluster URL names several hosts
    if not at or ":" not in auth:
        return url
    netloc = f"{auth.partition(':')[0]}:***@{hosts}"
    return urlunsplit(parts._replace(netloc=netloc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def run(args: argparse.Namespace) -> int:
    """Print frames every ``--interval`` seconds until interrupted (one with ``--once``)."""
    sources = _Sources(args)
    try:
        if args.once:
            sys.stdout.write(sources.frame())
            return 0
        while True:
            frame = sources.frame()
            sys.stdout.write(CLEAR + frame)
            sys.stdout.flush()
            time.sleep(max(args.interval, 0.05))
    except KeyboardInterrupt:
        return 0
    finally:
        sources.close()
