"""Waiting on one job from an async route, without polling SQL in a loop: the job's event
stream (``worker.queue.job_events``: text deltas, then its end once the result is
committed) is read with a blocking XREAD on an asyncio Redis client. SQL is asked only
when the stream stays quiet (backing off from 0.5 s to 5 s), which also covers a job that
ended without an event (cancelled while queued, dead-lettered, a worker that died)."""

from __future__ import annotations

import json
import time
import weakref
from asyncio import AbstractEventLoop, get_running_loop
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import redis
import redis.asyncio as aioredis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from api.context import Context
from worker.queue.connection import make_async_redis
from worker.store.crud.jobs import get_job
from worker.store.models import Job

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
_BLOCK_S = 1.0  # longest XREAD block: how often a disconnect or the deadline is looked at
_FIRST_CHECK_S, _MAX_CHECK_S = 0.5, 5.0  # SQL while the stream is quiet

# One asyncio client per event loop and URL (an API process runs one loop; tests may run
# the same app under several), closed with the loop's app lifespan.
_clients: weakref.WeakKeyDictionary[AbstractEventLoop, dict[str, aioredis.Redis]] = (
    weakref.WeakKeyDictionary()
)


def async_redis(url: str) -> aioredis.Redis:
    """The running loop's asyncio client for ``url``."""
    per_loop = _clients.setdefault(get_running_loop(), {})
    client = per_loop.get(url)
    if client is None:
        client = make_async_redis(url=url)
        per_loop[url] = client
    return client


async def close_async_redis() -> None:
    """Close the running loop's clients (the app's lifespan ends)."""
    for client in _clients.pop(get_running_loop(), {}).values():
        await client.aclose()


@dataclass
class TextDelta:
    """New text of choice ``index`` starting at character ``pos`` of that choice, with the
    scores (stored form) of the positions it completes from position ``lp_pos`` on, when the
    request asked for logprobs."""

    index: int
    pos: int
    text: str
    lp_pos: int = 0
    logprobs: list[dict[str, Any]] | None = None


@dataclass
class Ended:
    """The job reached ``status`` (its result, if any, is in SQL)."""

    status: str


@dataclass
class Stopped:
    """Waiting ended without the job's end: ``timeout`` or ``disconnected``."""

    why: str


Event = TextDelta | Ended | Stopped


def read_job(ctx: Context, job_id: str) -> Job | None:
    """The job row (a blocking SQL read: run it in the thread pool)."""
    with ctx.reads() as session:
        return get_job(session=session, job_id=job_id)


async def job_events(
    ctx: Context, job_id: str, *, request: Request, deadline: float
) -> AsyncIterator[Event]:
    """The events of ``job_id`` until it ends (``Ended``), the client goes away or
    ``deadline`` (``time.monotonic()``) passes (``Stopped``)."""
    client = async_redis(ctx.settings.redis_url)
    key = ctx.keys.deltas(job_id)
    last = "0-0"
    check_every = _FIRST_CHECK_S
    next_check = time.monotonic() + check_every
    while True:
        now = time.monotonic()
        if now >= deadline:
            yield Stopped("timeout")
            return
        if await request.is_disconnected():
            yield Stopped("disconnected")
            return
        block_ms = max(1, int(min(_BLOCK_S, deadline - now) * 1000))
        reply: Any = None
        try:
            reply = await client.xread({key: last}, block=block_ms, count=1000)
        except (redis.RedisError, OSError):  # Redis away: SQL tells the end, as for a lost event
            await anyio.sleep(min(_BLOCK_S, max(0.0, deadline - time.monotonic())))
        got = False
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last, got = entry_id, True
                if fields.get("t") == "end":
                    yield Ended(str(fields.get("s") or ""))
                    return
                if fields.get("t") == "d":
                    yield _text_delta(fields)
        if got:
            continue
        if time.monotonic() >= next_check:
            job = await run_in_threadpool(read_job, ctx, job_id)
            if job is None or job.status in TERMINAL:
                yield Ended(job.status if job is not None else "failed")
                return
            check_every = min(_MAX_CHECK_S, check_every * 2)
            next_check = time.monotonic() + check_every


def _text_delta(fields: dict[str, Any]) -> TextDelta:
    """A ``"d"`` entry (:class:`worker.queue.job_events.Delta`) read back."""
    scores = fields.get("l")
    return TextDelta(int(fields["i"]), int(fields["p"]), str(fields.get("x", "")),
                     lp_pos=int(fields.get("q") or 0),
                     logprobs=None if scores is None else json.loads(scores))
