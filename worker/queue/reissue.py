"""Reissue held entries to the group as fresh ones (the Redis half of a hand-back,
``worker.jobs.hand_back``): a worker that cannot run what it holds
(its engine broke, or it drains) re-publishes each entry and acks the old one, so another
worker reads it at once and the attempt counts neither as a delivery toward the dead-letter
limit nor as evidence against the job (its suspect record is dropped)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from worker.queue.delivery import Delivery
from worker.queue.keys import QueueKeys
from worker.queue.scripts import queue_script
from worker.queue.suspects import field_of


def lane_score(keys: QueueKeys, d: Delivery) -> float | str:
    """The lane-set score for an entry going back to ``d.stream``: its message's deadline
    (else the lane's end); '' for a stream that is not a lane."""
    end = keys.lane_end(d.stream)
    if end is None:
        return ""
    if d.message is not None and d.message.deadline is not None:
        return d.message.deadline
    return float(end)

# Ack the old entry and, only if it was still pending, add its copy to the same stream (a
# lane keeps its work: the copy stays in its lane, which is listed again if its set member
# was lost) and name the copy as its job's carrier: running this again after a lost reply
# neither adds a second copy nor loses the entry. KEYS: the stream, the carried index, the
# lane set; ARGV: group, entry id, job id, the lane's score ('' for the interactive
# stream), the entry's field values.
_REISSUE = """
local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if n == 1 then
  local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
  if ARGV[3] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[3], KEYS[1] .. '|' .. id)
  end
  if ARGV[4] ~= '' then
    redis.call('ZADD', KEYS[3], 'LT', ARGV[4], KEYS[1])
  end
end
return n
"""


def reissue_entries(*, redis_client: redis.Redis, keys: QueueKeys, deliveries: Sequence[Delivery]) -> int:
    """Re-publish these held entries as new ones and ack the old; returns how many moved."""
    if not deliveries:
        return 0
    script = cast(Any, redis_client).register_script(_REISSUE)
    pipe = redis_client.pipeline(transaction=False)
    for d in deliveries:
        flat = [x for kv in (d.fields or {}).items() for x in kv]
        queue_script(pipe, script, keys=[d.stream, keys.carried, keys.lanes],
                     args=[keys.group, d.entry_id, d.job_id or "", lane_score(keys, d), *flat])
    pipe.hdel(keys.suspects, *(field_of(d.stream, d.entry_id) for d in deliveries))
    return sum(int(n) for n in pipe.execute()[: len(deliveries)])
