"""Publishing: XADD job messages to their class streams of one model (Redis only; the rows
were committed first by :mod:`worker.jobs.enqueue` or are being re-published), each entry
recorded as its job's carrier in the same script (``worker.queue.carried``: the model's
index, in the streams' hash slot)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys
from worker.queue.message import JobMessage
from worker.queue.scripts import queue_script

CHUNK = 200  # messages per script call (a script blocks Redis while it runs)

# XADD each message and name its new entry as its job's carrier, atomically. ARGV: the
# number of field values per message, then per message its job id and field values.
_PUBLISH = """
local width = tonumber(ARGV[1])
local ids = {}
local i = 2
while i <= #ARGV do
  local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 1, i + width))
  redis.call('HSET', KEYS[2], ARGV[i], KEYS[1] .. '|' .. id)
  ids[#ids + 1] = id
  i = i + 1 + width
end
return ids
"""


def publish(
    *, redis_client: redis.Redis, keys: QueueKeys, messages: Sequence[tuple[str, JobMessage]]
) -> list[str]:
    """XADD ``(queue_class, message)`` pairs to the streams of ``keys.model``, a script call
    per stream and chunk of messages, all in one pipeline; returns the entry ids in the
    order of ``messages``."""
    if not messages:
        return []
    by_stream: dict[str, list[int]] = {}
    for i, (queue_class, _msg) in enumerate(messages):
        by_stream.setdefault(keys.stream(queue_class), []).append(i)
    script = cast(Any, redis_client).register_script(_PUBLISH)
    pipe = redis_client.pipeline(transaction=False)
    calls: list[list[int]] = []
    for stream, positions in by_stream.items():
        for lo in range(0, len(positions), CHUNK):
            part = positions[lo : lo + CHUNK]
            flat = [[x for kv in messages[i][1].encode().items() for x in kv] for i in part]
            width = len(flat[0])  # every message encodes the same fields (message.py)
            if any(len(values) != width for values in flat):
                raise ValueError("job messages of one publish must have the same fields")
            args: list[str | int] = [width]
            for i, values in zip(part, flat, strict=True):
                args += [messages[i][1].job_id, *values]
            queue_script(pipe, script, keys=[stream, keys.carried], args=args)
            calls.append(part)
    ids: list[str] = [""] * len(messages)
    for part, reply in zip(calls, pipe.execute(), strict=True):
        for i, entry_id in zip(part, reply, strict=True):
            ids[i] = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return ids
