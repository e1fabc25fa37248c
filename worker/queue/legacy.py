"""The Redis half of moving an older deployment's untagged keys (``<prefix>:jobs:<class>``,
``<prefix>:carried``, ...: :class:`worker.queue.keys.LegacyKeys`) to the hash-tagged
per-model keys; :mod:`worker.jobs.legacy_keys` decides where each job goes.

The mover is a consumer of the old streams' group like any worker (consumer name
``legacy-mover:<its consumer>``), so the usual guarantee holds: an entry is moved only once
it is the mover's, i.e. never delivered before, or pending under a consumer that left it
idle for the claim time (its worker is gone); an entry a live old worker holds stays
with it until that worker acks it. Each move is one script: ack the old entry and, only
if it was still pending, add its copy to the new stream, name the copy as its job's
carrier and delete the old entry; a retry after a lost reply neither copies it twice nor
loses it. The copy is a fresh entry (no delivery counted; the old suspect record is
dropped, as a hand-back does). A job the model's index names already (a reconciler that
ran before the move published it again) is not copied a second time.

Old keys name no hash tag and a script here touches old and new keys together: this runs
on a single Redis server only, where an older deployment could run; on a cluster there is
nothing to move."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from worker.queue.claim import START, autoclaim_ids
from worker.queue.consumer import to_delivery
from worker.queue.dead_letter import dead_maxlen
from worker.queue.delivery import Delivery
from worker.queue.entry_ids import id_key
from worker.queue.group import is_nogroup
from worker.queue.keys import QueueKeys
from worker.queue.scripts import queue_script

PAGE = 500

# KEYS: old stream, new stream (the old one: only delete), new carried index; ARGV: group,
# old entry id, job id, the entry's field values. Acts only while the entry is pending (see
# the module text); a job the new index names already (a reconciler published it meanwhile)
# is not copied again. Returns 0 (not pending), 1 (copied) or 2 (deleted only).
_MOVE = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('XDEL', KEYS[1], ARGV[2])
if KEYS[2] == KEYS[1] or (ARGV[3] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[3]) == 1) then
  return 2
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[3], KEYS[2] .. '|' .. id)
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


def legacy_present(*, redis_client: redis.Redis, keys: QueueKeys) -> bool:
    """Whether any old stream (or the old dead-letter stream) still exists."""
    old = keys.legacy
    return bool(cast(Any, redis_client).exists(*old.streams, old.dead))


def take_legacy_entries(
    *, redis_client: redis.Redis, keys: QueueKeys, mover: str, min_idle_ms: int, count: int = PAGE
) -> list[Delivery]:
    """Make up to ``count`` old entries the mover's (never delivered, or idle for
    ``min_idle_ms`` under their consumer) and return every old entry the mover owns, with
    its fields (an entry deleted meanwhile has none)."""
    client = cast(Any, redis_client)
    out: list[Delivery] = []
    for stream in keys.legacy.streams:
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


def move_legacy_entries(
    *, redis_client: redis.Redis, keys: QueueKeys, moves: Sequence[tuple[Delivery, str | None]]
) -> tuple[int, int]:
    """Move each old entry the mover owns to the streams of the model paired with it (of
    its class), or only ack and delete it where the model is None (its job ended or is
    gone) or the model's index names its job already. Returns how many were copied and
    how many only deleted."""
    if not moves:
        return 0, 0
    script = cast(Any, redis_client).register_script(_MOVE)
    pipe = redis_client.pipeline(transaction=False)
    for d, model in moves:
        if model is None:
            target, carried = d.stream, keys.legacy.carried
        else:
            mkeys = keys.for_model(model)
            target, carried = mkeys.stream(keys.legacy.class_of(d.stream)), mkeys.carried
        flat = [x for kv in (d.fields or {}).items() for x in kv]
        if model is not None and not flat:  # deleted meanwhile: nothing left to copy
            target = d.stream
        queue_script(pipe, script, keys=[d.stream, target, carried],
                     args=[keys.group, d.entry_id, d.job_id or "", *flat])
    replies = [int(n) for n in pipe.execute()]
    return replies.count(1), replies.count(2)


def legacy_drained(*, redis_client: redis.Redis, keys: QueueKeys) -> bool:
    """True when no old stream holds an entry that is pending or not yet delivered."""
    client = cast(Any, redis_client)
    for stream in keys.legacy.streams:
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


def drop_legacy(*, redis_client: redis.Redis, keys: QueueKeys) -> int:
    """Delete the old streams, index, suspects and cancel flags (once drained: the cancels
    are recorded in SQL, which the workers read too); returns how many keys went."""
    old = keys.legacy
    return int(cast(Any, redis_client).delete(
        *old.streams, old.dead, *old.others, old.cancels, old.cancels_at
    ))
