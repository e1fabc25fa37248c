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

# Ack the old entry and, only if it was still pending, add its copy and name the copy as
# its job's carrier: running this again after a lost reply neither adds a second copy nor
# loses the entry.
_REISSUE = """
local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if n == 1 then
  local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
  if ARGV[3] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[3], KEYS[1] .. '|' .. id)
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
        queue_script(pipe, script, keys=[d.stream, keys.carried],
                     args=[keys.group, d.entry_id, d.job_id or "", *flat])
    pipe.hdel(keys.suspects, *(field_of(d.stream, d.entry_id) for d in deliveries))
    return sum(int(n) for n in pipe.execute()[: len(deliveries)])
