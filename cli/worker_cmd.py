"""``inflight worker``: run a long-lived worker (Redis in, SQL out) until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from cli.engine_flags import add_engine_flags, engine_kwargs_from
from worker.engine.grammar_service import DEFAULT_TIMEOUT_S
from worker.service.config import WorkerConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``worker``."""
    p = subparsers.add_parser(
        "worker",
        help="run a worker: pull jobs from Redis, generate, write results to SQL",
        description="SIGTERM/SIGINT drains (stop reading, finish in-flight work up to "
        "--drain-timeout, hand the rest back, exit 0); a second signal stops at once.",
    )
    p.add_argument(
        "--redis-url", default=None, help="overrides REDIS_URL (default redis://127.0.0.1:6379/0)"
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="overrides DATABASE_URL (default sqlite:///inflight.db)",
    )
    p.add_argument(
        "--name", default=None, help="consumer name, stable across restarts (default: host name)"
    )
    p.add_argument("--prefix", default="inflight", help="Redis key prefix")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients name in requests, the streams this worker reads "
                   "and what GET /v1/models lists (default: the --model spec, or a local "
                   "path's directory or file name)")
    p.add_argument("--migrate", action="store_true", help="run the migrations before starting")
    add_engine_flags(p)  # --model and every engine option, as for generate and bench
    q = p.add_argument_group("queue")
    q.add_argument("--prefetch", type=int, default=4, help="jobs read ahead of engine capacity")
    q.add_argument(
        "--max-deliveries", type=int, default=WorkerConfig.max_deliveries,
        help="dead-letter after this many deliveries, even without proof the job is the poison"
    )
    q.add_argument(
        "--claim-idle-ms", type=int, default=60_000, help="take over entries idle this long"
    )
    q.add_argument("--claim-interval", type=float, default=5.0)
    q.add_argument("--heartbeat-interval", type=float, default=2.0)
    q.add_argument("--lock-ttl", type=float, default=15.0)
    q.add_argument("--reconcile-interval", type=float, default=30.0)
    q.add_argument("--reconcile-grace", type=float, default=30.0)
    q.add_argument("--worker-timeout", type=float, default=30.0)
    q.add_argument("--trim-interval", type=float, default=30.0)
    q.add_argument("--drain-timeout", type=float, default=30.0)
    q.add_argument("--grammar-timeout", type=float, default=None,
                   help="seconds one structured-output grammar may take to compile before its "
                   "job fails (default INFLIGHT_GRAMMAR_TIMEOUT, else 5)")
    q.add_argument("--no-traces", action="store_true", help="do not write the iterations table")
    p.add_argument("--gil-switch-ms", type=float, default=GIL_SWITCH_MS,
                   help="the interpreter's thread switch interval in this process (Python's "
                   "default is 5): the engine thread gives up the GIL in every torch op, and "
                   "while another of the worker's threads runs Python it waits this long to "
                   "get it back, each time (docs/benchmarks.md, \"interjected steps\")")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


# A step of a few sequences makes hundreds of torch calls, each giving the GIL up and
# taking it back: at Python's 5 ms a 150-token prompt's step took 4.5 s instead of 36 ms
# beside a thread busy in Python, 0.33 s at 0.2 ms (docs/benchmarks.md).
GIL_SWITCH_MS = 0.2


def config_from_args(args: argparse.Namespace):
    """The WorkerConfig these flags (and REDIS_URL / DATABASE_URL) describe."""
    from worker.queue.connection import redis_url
    from worker.store.db import database_url

    return WorkerConfig(
        database_url=database_url(args.database_url),
        redis_url=redis_url(args.redis_url),
        model=args.model,
        served_model_name=args.served_model_name or None,
        engine_kwargs=engine_kwargs_from(args),
        name=args.name,
        prefix=args.prefix,
        prefetch=args.prefetch,
        max_deliveries=args.max_deliveries,
        claim_idle_ms=args.claim_idle_ms,
        claim_interval=args.claim_interval,
        heartbeat_interval=args.heartbeat_interval,
        lock_ttl=args.lock_ttl,
        reconcile_interval=args.reconcile_interval,
        reconcile_grace=args.reconcile_grace,
        worker_timeout=args.worker_timeout,
        trim_interval=args.trim_interval,
        drain_timeout=args.drain_timeout,
        grammar_timeout=(args.grammar_timeout if args.grammar_timeout is not None
                         else float(os.environ.get("INFLIGHT_GRAMMAR_TIMEOUT") or DEFAULT_TIMEOUT_S)),
        write_traces=not args.no_traces,
    )


def run(args: argparse.Namespace) -> int:
    """Run the worker until it is drained; its exit code."""
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.gil_switch_ms > 0:
        print("inflight worker: error: --gil-switch-ms must be > 0", file=sys.stderr)
        return 2
    sys.setswitchinterval(args.gil_switch_ms / 1000)
    config = config_from_args(args)
    if args.migrate:
        from migrations.run import upgrade

        upgrade(url=config.database_url)
    from worker.service.worker import EngineStartError, WorkerProcess
    from worker.telemetry.setup import configure_telemetry, shutdown_telemetry

    configure_telemetry("inflight-worker")
    try:
        return WorkerProcess(config).run()
    except EngineStartError as exc:
        print(f"inflight worker: error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutdown_telemetry()
