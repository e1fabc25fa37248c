"""Publishing: XADD job messages to the streams of one model (Redis only; the rows were
committed first by :mod:`worker.jobs.enqueue` or are being re-published): interactive work
to the interactive stream, batch work to the lane of its deadline (``worker.queue.slack``,
``worker.queue.lanes``). One script per stream and chunk adds the entries, names each as
its job's carrier (``worker.queue.carried``), creates the stream with its consumer group
when it is new and, for a lane, registers it in the lane set with its work: all keys in the
model's hash slot."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import redis

from worker.protocol.work_estimate import work_estimate
from worker.queue.keys import QueueKeys
from worker.queue.message import JobMessage
from worker.queue.scripts import queue_script
from worker.queue.slack import DEFAULT_WINDOW_S, lane_end

CHUNK = 200  # messages per script call (a script blocks Redis while it runs)

# KEYS: the stream, the carried index, the lane set, the lane work hash. ARGV: the number
# of field values per message, the group, the lane's deadline ('' for the interactive
# stream), the chunk's estimated work, then per message its job id and field values.
_PUBLISH = """
local width = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[2], '0', 'MKSTREAM')
end
local ids = {}
local i = 5
while i <= #ARGV do
  local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 1, i + width))
  redis.call('HSET', KEYS[2], ARGV[i], KEYS[1] .. '|' .. id)
  ids[#ids + 1] = id
  i = i + 1 + width
end
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[3], 'LT', ARGV[3], KEYS[1])
  redis.call('HINCRBY', KEYS[4], KEYS[1] .. '|n', #ids)
  redis.call('HINCRBYFLOAT', KEYS[4], KEYS[1] .. '|w', ARGV[4])
end
return ids
"""


def stream_for(keys: QueueKeys, queue_class: str, message: JobMessage, now: float) -> str:
    """The stream ``message`` goes to: the interactive stream, or the lane of its deadline
    (a batch message without one is given ``now + DEFAULT_WINDOW_S`` first)."""
    if queue_class == "interactive":
        return keys.interactive
    if queue_class != "batch":
        keys.stream(queue_class)  # raises the class error
    if message.deadline is None:
        message.deadline = now + DEFAULT_WINDOW_S
    return keys.lane(lane_end(message.deadline, now))


def publish(
    *, redis_client: redis.Redis, keys: QueueKeys, messages: Sequence[tuple[str, JobMessage]],
    now: float | None = None,
) -> list[str]:
    """XADD ``(queue_class, message)`` pairs to the streams of ``keys.model``, a script call
    per stream and chunk of messages, all in one pipeline; returns the entry ids in the
    order of ``messages``."""
    if not messages:
        return []
    now = time.time() if now is None else now
    by_stream: dict[str, list[int]] = {}
    for i, (queue_class, msg) in enumerate(messages):
        by_stream.setdefault(stream_for(keys, queue_class, msg, now), []).append(i)
    script = cast(Any, redis_client).register_script(_PUBLISH)
    pipe = redis_client.pipeline(transaction=False)
    calls: list[list[int]] = []
    for stream, positions in by_stream.items():
        lane = keys.lane_end(stream) is not None
        for lo in range(0, len(positions), CHUNK):
            part = positions[lo : lo + CHUNK]
            flat = [[x for kv in messages[i][1].encode().items() for x in kv] for i in part]
            width = len(flat[0])  # every message encodes the same fields (message.py)
            if any(len(values) != width for values in flat):
                raise ValueError("job messages of one publish must have the same fields")
            deadline = min(cast(float, messages[i][1].deadline) for i in part) if lane else ""
            work = sum(work_estimate(messages[i][1].body) for i in part) if lane else 0
            args: list[str | int | float] = [width, keys.group, deadline, work]
            for i, values in zip(part, flat, strict=True):
                args += [messages[i][1].job_id, *values]
            queue_script(pipe, script,
                         keys=[stream, keys.carried, keys.lanes, keys.lane_work], args=args)
            calls.append(part)
    ids: list[str] = [""] * len(messages)
    for part, reply in zip(calls, pipe.execute(), strict=True):
        for i, entry_id in zip(part, reply, strict=True):
            ids[i] = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return ids
