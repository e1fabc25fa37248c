"""``inflight enqueue INPUT.jsonl``: one job per line (the ``inflight generate`` line
formats), made by the API's submission path (``api.control.submit.new_job``: the checks,
limits and custom_id rule of ``POST /v1/jobs`` and batch expansion), committed to SQL and
then published to Redis; prints the job ids."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

CHUNK = 1000


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``enqueue``."""
    p = subparsers.add_parser(
        "enqueue",
        help="enqueue every line of a JSONL file as a job",
        description="Each line is an OpenAI Batch line {custom_id, method, url, body} or a plain "
        '{"prompt": ...} / {"messages": [...]} line with sampling fields. Each line passes the '
        "API's submission checks (INFLIGHT_MAX_PROMPT_TOKENS, INFLIGHT_MAX_TOKENS_LIMIT, "
        "INFLIGHT_MAX_MODEL_LEN, the structured-output check); invalid lines are reported on "
        "stderr and not enqueued (exit status 1). Prints one job id per line.",
    )
    p.add_argument("input", help="JSONL file ('-' for stdin)")
    p.add_argument("--class", dest="queue_class", choices=("batch", "interactive"), default="batch")
    p.add_argument("--model", default=None,
                   help="the model of every line: a line naming none runs on it, a line naming "
                   "another is refused; queued even while no worker serves it (a warning "
                   "says so). Without it each line runs on the model it names, or on the "
                   "deployment's default model (INFLIGHT_DEFAULT_MODEL, else the one model "
                   "the workers serve)")
    p.add_argument("--tenant", default="default")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--batch-id", default=None,
                   help="attach the jobs to this batch id; job ids then derive from (batch id, "
                   "custom_id), so re-running the command after an interruption skips the "
                   "lines already enqueued")
    p.add_argument("--max-queue-depth", type=int, default=1_000_000,
                   help="stop (exit 75) instead of growing the stream past this many entries "
                   "(0: no bound)")
    p.add_argument("--redis-url", default=None, help="overrides REDIS_URL")
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.add_argument("--prefix", default="inflight", help="Redis key prefix")
    p.set_defaults(func=run)


def _lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Numbered non-blank lines, as bytes (the parser reports bad UTF-8 per line)."""
    for i, line in enumerate(stream, start=1):
        if line.strip():
            yield i, line


EX_TEMPFAIL = 75  # stopped by backpressure: re-run later


def run(args: argparse.Namespace) -> int:
    """Enqueue the file; 0 if every line was enqueued, 1 if some were invalid, 75 when the
    queue refused more (full, or Redis refusing writes): nothing is half-written, and a
    re-run with the same --batch-id continues without duplicates."""
    import redis

    from api.context import make_context
    from api.control.models import known_model
    from api.control.submit import LineError, Submission, new_job
    from api.settings import Settings
    from worker.jobs.enqueue import NotPublished, enqueue
    from worker.protocol.limits import LimitError, check_tenant
    from worker.queue.admission import QueueRefused
    from worker.store.schemas import NewJob
    from worker.telemetry.setup import configure_telemetry, shutdown_telemetry

    try:
        check_tenant(args.tenant)
    except LimitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_telemetry("inflight-enqueue")
    # the API's settings and context: its request limits and structured-output check
    ctx = make_context(Settings.from_env(
        database_url=args.database_url, redis_url=args.redis_url, prefix=args.prefix
    ))
    if args.model is not None and not known_model(ctx, args.model):
        print(f"warning: no worker served model {args.model!r} recently; its jobs wait for "
              "one (a worker started with --model or --served-model-name naming it)",
              file=sys.stderr)
    bad = 0
    total = 0
    pending: list[NewJob] = []
    seen: set[str | None] | None = set() if args.batch_id is not None else None
    stopped: str | None = None

    def printed(ids: list[str]) -> None:
        nonlocal total
        sys.stdout.write("".join(f"{i}\n" for i in ids))
        total += len(ids)

    def flush() -> None:
        while pending:
            model = str(pending[0].model)  # the leading run of jobs of one model
            same = next((i for i, j in enumerate(pending) if j.model != model), len(pending))
            part = pending[: admit_room(args, ctx.redis, ctx.keys.for_model(model), same)]
            try:
                ids = enqueue(
                    session_factory=ctx.session_factory,
                    redis_client=ctx.redis,
                    keys=ctx.keys,
                    jobs=part,
                    skip_existing=args.batch_id is not None,
                )
            except NotPublished as exc:  # committed (the reconciler publishes them): stop
                printed(exc.job_ids)
                raise
            printed(ids)
            del pending[: len(part)]

    stream = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # noqa: SIM115
    try:
        for number, line in _lines(stream):
            sub = Submission(tenant=args.tenant, request=line, line_no=number,
                             queue_class=args.queue_class, priority=args.priority,
                             batch_id=args.batch_id, model=args.model)
            try:
                pending.append(new_job(ctx, sub, seen).job)
            except LineError as exc:
                print(f"error: {exc.message}", file=sys.stderr)
                bad += 1
            if len(pending) >= CHUNK:
                flush()
        flush()
    except (QueueRefused, redis.RedisError) as exc:
        stopped = str(exc)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        ctx.close()
        shutdown_telemetry()  # exports the enqueue spans before the process ends
    print(
        f"enqueued {total} jobs"
        + (f", {bad} invalid line{'' if bad == 1 else 's'} skipped" if bad else ""),
        file=sys.stderr,
    )
    if stopped is not None:
        again = (
            "re-run the same command to continue (lines already enqueued are skipped)"
            if args.batch_id
            else "the lines after the last printed job id were not enqueued; re-running "
            "without --batch-id would enqueue the earlier ones again"
        )
        print(f"error: stopped: {stopped}; {again}", file=sys.stderr)
        return EX_TEMPFAIL
    return 1 if bad else 0


def admit_room(args: argparse.Namespace, client: Any, keys: Any, offered: int) -> int:
    """How many of ``offered`` jobs the queue of ``keys.model`` takes now; raises
    QueueRefused for none."""
    from worker.queue.admission import admit

    return admit(
        redis_client=client,
        keys=keys,
        queue_class=args.queue_class,
        offered=offered,
        max_depth=args.max_queue_depth,
    ).room
