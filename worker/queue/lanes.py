"""The batch lanes of one model in Redis: one stream per deadline bucket
(``keys.lane(end)``, the bucket rule in ``worker.queue.slack``), all under the model's
hash tag, so every script and pipeline that touches a lane and the model's other keys
works on a Redis Cluster.

- ``keys.lanes``, a sorted set: every lane that may hold work, scored by the earliest
  deadline published into it. The publish script adds the lane (``ZADD LT``) and creates
  its stream with the consumer group in the same call, so a lane a reader lists always has
  its group; a reissue re-adds the lane it goes back to.
- ``keys.lane_work``, a hash: per lane the entries published into it and their estimated
  work (``worker.protocol.work_estimate``), so its mean work per entry is known; with the
  group's pending and undelivered counts that gives its remaining work without counters
  that acks would have to keep.
- ``keys.rates``, a hash: each worker's measured rate (estimated work finished per
  engine-second), summed over the live ones into the model's (:func:`model_rate`).

A lane is dropped (stream, set member and work counters, in one script) by the trim once
no entry in it is pending or undelivered (:func:`drop_drained_lanes`); a publish into it
afterwards makes it again. Readers that meet a lane dropped after they listed it skip it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from worker.queue.figures import group_figures
from worker.queue.keys import QueueKeys
from worker.queue.scripts import queue_script
from worker.queue.slack import LaneState, WorkDue, work_due_by

RATE_FRESH_S = 60.0  # a worker's rate counts while it was reported this recently
RATE_FORGET_S = 3600.0  # older reports are deleted by the next reader

# Drop one lane when nothing in it is pending or undelivered. KEYS: the lane, the lane
# set, the work hash; ARGV: the group. Returns the entries deleted with it, -1 if kept.
_DROP_DRAINED = """
local function after(a, b)
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local read = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if tonumber(f['pending']) > 0 then return -1 end
    if f['name'] == ARGV[1] then read = f['last-delivered-id'] end
  end
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #last > 0 and (read == nil or after(last[1][1], read)) then return -1 end
end
local n = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('HDEL', KEYS[3], KEYS[1] .. '|n', KEYS[1] .. '|w')
return n
"""


def work_fields(lane: str) -> tuple[str, str]:
    """The ``keys.lane_work`` fields of one lane: entries published, their estimated work."""
    return f"{lane}|n", f"{lane}|w"


def lane_list(*, redis_client: redis.Redis, keys: QueueKeys) -> list[tuple[str, float]]:
    """``(lane, earliest deadline)`` of every lane of ``keys.model``, earliest first."""
    rows = cast(Any, redis_client).zrange(keys.lanes, 0, -1, withscores=True)
    return [(str(name), float(score)) for name, score in rows]


def job_streams(*, redis_client: redis.Redis, keys: QueueKeys) -> list[str]:
    """Every job stream of ``keys.model``: the interactive one, then the lanes (earliest
    deadline first). What claims, replays, the index build and the trim go over."""
    return [keys.interactive, *(lane for lane, _ in lane_list(redis_client=redis_client, keys=keys))]


def lane_states(*, redis_client: redis.Redis, keys: QueueKeys) -> list[LaneState]:
    """Each lane with its deadline, remaining and undelivered entries and mean work per
    entry (earliest deadline first). Two round trips, whatever the number of lanes."""
    pipe = cast(Any, redis_client).pipeline(transaction=False)
    pipe.zrange(keys.lanes, 0, -1, withscores=True)
    pipe.hgetall(keys.lane_work)
    rows, work = pipe.execute()
    lanes = [(str(name), float(score)) for name, score in rows]
    figures = group_figures(redis_client, [lane for lane, _ in lanes], keys.group)
    out = []
    for (lane, deadline), fig in zip(lanes, figures, strict=True):
        n_field, w_field = work_fields(lane)
        published = float(work.get(n_field) or 0)
        per_entry = float(work.get(w_field) or 0) / published if published else 0.0
        out.append(LaneState(stream=lane, deadline=deadline, remaining=fig.unfinished,
                             undelivered=fig.lag if fig.lag is not None else fig.length,
                             work_per_entry=per_entry))
    return out


def drop_drained_lanes(
    *, redis_client: redis.Redis, keys: QueueKeys, lanes: Sequence[str] | None = None
) -> tuple[int, int]:
    """Drop every lane (of ``lanes``, else of the set) that holds nothing pending or
    undelivered: its stream (acked entries only), set member and work counters go in one
    script each. Returns how many lanes went and how many entries with them."""
    if lanes is None:
        lanes = [lane for lane, _ in lane_list(redis_client=redis_client, keys=keys)]
    if not lanes:
        return 0, 0
    script = cast(Any, redis_client).register_script(_DROP_DRAINED)
    pipe = redis_client.pipeline(transaction=False)
    for lane in lanes:
        queue_script(pipe, script, keys=[lane, keys.lanes, keys.lane_work], args=[keys.group])
    dropped = [int(n) for n in pipe.execute() if int(n) >= 0]
    return len(dropped), sum(dropped)


def report_rate(
    *, redis_client: redis.Redis, keys: QueueKeys, consumer: str, rate: float,
    now: float | None = None,
) -> None:
    """Record ``consumer``'s measured rate (estimated tokens finished per engine-second)."""
    now = time.time() if now is None else now
    redis_client.hset(keys.rates, consumer, f"{rate:.6g} {now:.3f}")


def model_rate(
    *, redis_client: redis.Redis, keys: QueueKeys, now: float | None = None
) -> float | None:
    """The model's rate: the sum of its workers' reported within ``RATE_FRESH_S`` (None
    when none was); reports older than ``RATE_FORGET_S`` are deleted."""
    now = time.time() if now is None else now
    reports: dict[str, str] = cast(Any, redis_client).hgetall(keys.rates)
    total, fresh, stale = 0.0, False, []
    for consumer, value in reports.items():
        try:
            rate_text, at_text = str(value).split()
            rate, at = float(rate_text), float(at_text)
        except ValueError:
            stale.append(consumer)
            continue
        if now - at <= RATE_FRESH_S:
            total, fresh = total + rate, True
        elif now - at > RATE_FORGET_S:
            stale.append(consumer)
    if stale:
        redis_client.hdel(keys.rates, *stale)
    return total if fresh and total > 0 else None


@dataclass(frozen=True)
class QueuedWork:
    """Batch work queued for one model that is due at or before some deadline, and the
    model's measured ``rate`` (estimated tokens per second; None before any measurement)."""

    due: WorkDue
    rate: float | None

    @property
    def seconds(self) -> float | None:
        """How long that work takes at the measured rate (None: no rate yet)."""
        return self.due.work / self.rate if self.rate else None


def queued_work_before(
    *, redis_client: redis.Redis, keys: QueueKeys, deadline: float, now: float | None = None
) -> QueuedWork:
    """How much queued batch work of ``keys.model`` is due at or before ``deadline`` (epoch
    seconds), and at what rate the model's workers get through work: for an estimate of
    when new work due then would be done (``worker.queue.slack.work_due_by``)."""
    lanes = lane_states(redis_client=redis_client, keys=keys)
    return QueuedWork(due=work_due_by(lanes, deadline),
                      rate=model_rate(redis_client=redis_client, keys=keys, now=now))
