"""The Redis half of moving an older deployment's keys to the current ones:
:mod:`worker.jobs.legacy_keys` decides where each job goes. Two kinds of old streams:

- the untagged keys of deployments from before the hash tags (``<prefix>:jobs:<class>``,
  ``<prefix>:carried``, ...: :class:`worker.queue.keys.LegacyKeys`), on a single server;
- a model's one batch stream from before the deadline lanes (``keys.unlaned_batch``,
  ``{<prefix>:<model>}:jobs:batch``), anywhere: it shares the model's tag, so its moves run
  on a cluster too.

A batch entry goes to the lane of its job's deadline (``worker.queue.slack``), registered
in the lane set with its work, as a publish does.

The mover is a consumer of the old streams' group like any worker (consumer name
``legacy-mover:<its consumer>``), so the usual guarantee holds: an entry is moved only once
it is the mover's, i.e. never delivered before, or pending under a consumer that left it
idle for the claim time (its worker is gone); an entry a live old worker holds stays
with it until that worker acks it. Each move is one script: ack the old entry and, only
if it was still pending, add its copy to the new stream, name the copy as its job's
carrier and delete the old entry; a retry after a lost reply neither copies it twice nor
loses it. The copy is a fresh entry (no delivery counted; the old suspect record is
dropped, as a hand-back does). A job the model's index names on another entry already (a
reconciler that ran before the move published it again) is not copied a second time.

The untagged keys name no hash tag and a script here touches old and new keys together:
they are moved on a single Redis server only, where an older deployment could run; on a
cluster only the model's unlaned batch stream is."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from worker.protocol.work_estimate import work_estimate
from worker.queue.claim import START, autoclaim_ids
from worker.queue.consumer import to_delivery
from worker.queue.dead_letter import dead_maxlen
from worker.queue.delivery import Delivery
from worker.queue.entry_ids import id_key
from worker.queue.group import is_nogroup
from worker.queue.keys import QueueKeys
from worker.queue.scripts import queue_script
from worker.queue.slack import DEFAULT_WINDOW_S, lane_end

PAGE = 500

# KEYS: old stream, new stream (the old one: only delete), new carried index, the new
# model's lane set and lane work hash; ARGV: group, old entry id, job id, the lane's score
# ('' when the new stream is not a lane), the entry's estimated work, its field values.
# Acts only while the entry is pending (see the module text); a job the new index names on
# another entry (a reconciler published it meanwhile) is not copied again. Returns 0 (not
# pending), 1 (copied) or 2 (deleted only).
_MOVE = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('XDEL', KEYS[1], ARGV[2])
local old = KEYS[1] .. '|' .. ARGV[2]
local named = ARGV[3] ~= '' and redis.call('HGET', KEYS[3], ARGV[3])
if KEYS[2] == KEYS[1] then
  if named == old then
    redis.call('HDEL', KEYS[3], ARGV[3])
  end
  return 2
end
if named and named ~= old then
  return 2
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 6))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[3], KEYS[2] .. '|' .. id)
end
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[4], 'LT', ARGV[4], KEYS[2])
  redis.call('HINCRBY', KEYS[5], KEYS[2] .. '|n', 1)
  redis.call('HINCRBYFLOAT', KEYS[5], KEYS[2] .. '|w', ARGV[5])
end
return 1
"""

# KEYS: old dead stream, new dead stream; ARGV: entries per call. Moves the oldest entries.
_MOVE_DEAD = """
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[1])
for _, e in ipairs(entries) do
  redis.call('XADD', KEYS[2], '*', unpack(e[2]))
  redis.call('XDEL', KEYS[1], e[1])
end
return #entries
"""


def mover_name(consumer: str) -> str:
    """The consumer name under which a worker moves old entries."""
    return f"legacy-mover:{consumer}"


def old_streams(keys: QueueKeys, *, cluster: bool) -> list[str]:
    """The streams whose entries move: the untagged ones (on a single server only), then
    ``keys.model``'s unlaned batch stream."""
    return [*([] if cluster else keys.legacy.streams), keys.unlaned_batch]


def old_class(keys: QueueKeys, stream: str) -> str:
    """The queue class of the entries of one old stream."""
    return "batch" if stream == keys.unlaned_batch else keys.legacy.class_of(stream)


def legacy_present(*, redis_client: redis.Redis, keys: QueueKeys, cluster: bool = False) -> bool:
    """Whether any old stream (or the old dead-letter stream) still exists."""
    dead = [] if cluster else [keys.legacy.dead]
    return bool(cast(Any, redis_client).exists(*old_streams(keys, cluster=cluster), *dead))


def take_legacy_entries(
    *, redis_client: redis.Redis, keys: QueueKeys, mover: str, min_idle_ms: int, count: int = PAGE,
    cluster: bool = False,
) -> list[Delivery]:
    """Make up to ``count`` old entries the mover's (never delivered, or idle for
    ``min_idle_ms`` under their consumer) and return every old entry the mover owns, with
    its fields (an entry deleted meanwhile has none)."""
    client = cast(Any, redis_client)
    out: list[Delivery] = []
    for stream in old_streams(keys, cluster=cluster):
        if not client.exists(stream):
            continue
        _ensure_old_group(client, stream, keys.group)
        client.xreadgroup(keys.group, mover, {stream: ">"}, count=count)
        cursor = START
        while True:  # each call scans at most 10 x count pending entries
            cursor, ids = autoclaim_ids(client, stream, keys.group, mover,
                                        min_idle_ms=min_idle_ms, cursor=cursor, count=count)
            if cursor == START or ids:
                break
        owned = client.xpending_range(
            stream, keys.group, min="-", max="+", count=count, consumername=mover
        )
        for row in owned:
            entry_id = str(row["message_id"])
            found = client.xrange(stream, min=entry_id, max=entry_id, count=1)
            out.append(to_delivery(stream, entry_id, found[0][1] if found else None))
    return out


def _ensure_old_group(client: Any, stream: str, group: str) -> None:
    """The consumer group on an old stream an old producer created without one."""
    try:
        client.xgroup_create(stream, group, id="0")
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc) and not is_nogroup(exc):
            raise


@dataclass(frozen=True)
class MoveTo:
    """Where one old entry goes: the streams of ``model`` (None: nowhere, it is only acked
    and deleted), a batch entry to the lane of ``deadline`` (epoch seconds)."""

    model: str | None
    deadline: float | None = None


def move_legacy_entries(
    *, redis_client: redis.Redis, keys: QueueKeys, moves: Sequence[tuple[Delivery, MoveTo]],
    now: float | None = None,
) -> tuple[int, int]:
    """Move each old entry the mover owns to where it is paired with (a batch entry to the
    lane of its deadline, given in the copy's fields), or only ack and delete it where the
    model is None (its job ended or is gone) or the model's index names its job on another
    entry already. Returns how many were copied and how many only deleted."""
    if not moves:
        return 0, 0
    now = time.time() if now is None else now
    script = cast(Any, redis_client).register_script(_MOVE)
    pipe = redis_client.pipeline(transaction=False)
    for d, to in moves:
        fields = dict(d.fields or {})
        mkeys = keys  # only delete: the old index's field naming this entry goes too
        target, work = d.stream, 0
        score: float | str = ""
        carried = keys.carried if d.stream == keys.unlaned_batch else keys.legacy.carried
        if to.model is not None and fields:  # no fields: deleted meanwhile, nothing to copy
            mkeys = keys.for_model(to.model)
            carried = mkeys.carried
            if old_class(keys, d.stream) == "batch":
                deadline = to.deadline if to.deadline is not None else now + DEFAULT_WINDOW_S
                fields["deadline"] = repr(float(deadline))
                target = mkeys.lane(lane_end(deadline, now))
                score, work = deadline, work_estimate(d.message.body if d.message else {})
            else:
                target = mkeys.interactive
        flat = [x for kv in fields.items() for x in kv]
        queue_script(pipe, script, keys=[d.stream, target, carried, mkeys.lanes, mkeys.lane_work],
                     args=[keys.group, d.entry_id, d.job_id or "", score, work, *flat])
    replies = [int(n) for n in pipe.execute()]
    return replies.count(1), replies.count(2)


def legacy_drained(*, redis_client: redis.Redis, keys: QueueKeys, cluster: bool = False) -> bool:
    """True when no old stream holds an entry that is pending or not yet delivered."""
    client = cast(Any, redis_client)
    for stream in old_streams(keys, cluster=cluster):
        if not client.exists(stream):
            continue
        try:
            groups: list[dict[str, Any]] = client.xinfo_groups(stream)
        except redis.ResponseError:
            return False
        if not groups and client.xlen(stream):
            return False  # entries no group has read
        last = client.xrevrange(stream, max="+", min="-", count=1)
        for g in groups:
            if int(g["pending"]):
                return False
            if last and id_key(last[0][0]) > id_key(str(g["last-delivered-id"])):
                return False
    return True


def move_legacy_dead(*, redis_client: redis.Redis, keys: QueueKeys) -> int:
    """Move the old dead-letter stream's entries to ``keys.model``'s (capped as usual);
    returns how many moved. Each page moves in one script: none is copied twice."""
    client = cast(Any, redis_client)
    old = keys.legacy.dead
    script = client.register_script(_MOVE_DEAD)
    moved = 0
    while True:
        n = int(script(keys=[old, keys.dead], args=[PAGE]))
        moved += n
        if n < PAGE:
            break
    cap = dead_maxlen()
    if moved and cap:
        client.xtrim(keys.dead, maxlen=cap, approximate=False)
    return moved


def drop_legacy(*, redis_client: redis.Redis, keys: QueueKeys, cluster: bool = False) -> int:
    """Delete the old streams and (on a single server) the old index, suspects and cancel
    flags (once drained: the cancels are recorded in SQL, which the workers read too);
    returns how many keys went."""
    client = cast(Any, redis_client)
    n = int(client.delete(keys.unlaned_batch))
    if not cluster:
        old = keys.legacy
        n += int(client.delete(*old.streams, old.dead, *old.others, old.cancels, old.cancels_at))
    return n
