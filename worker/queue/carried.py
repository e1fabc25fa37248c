"""Which stream entry carries each job: one hash per model (``keys.carried``, in the hash
slot of the model's streams), job id -> ``"<stream>|<entry id>"``, so the reconciler finds
jobs that no stream carries by asking for their ids, without reading the streams.

The index moves with the entries, in the same Redis scripts and pipelines that move them:
publishing and handing back set the job's field to its new entry; acking and
dead-lettering an entry remove the field only when it still names that entry (a
duplicate delivery acked beside the live one leaves the live one's field alone). An entry
left in a stream after its ack (until trimmed) is not in the index, which is what
"carried" means: a job whose only entry was acked needs no worker.

The index is complete only once built from the streams (``ensure_index``), which happens
once per model and Redis data set: on the first reconcile of the model's jobs, and again
after Redis lost its data or the marker key (``carried_ready``) was evicted. A stream key lost alone (evicted under a
``maxmemory`` policy that evicts any key) leaves fields naming entries older than what the
stream holds now; those are read as not carried.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import redis

from worker.queue.entry_ids import id_key
from worker.queue.keys import QueueKeys
from worker.queue.lanes import job_streams
from worker.queue.scripts import queue_script

PAGE = 1000

# Delete each job's field only while it still names the given entry. ARGV: job id, entry
# reference, job id, entry reference, ...
FORGET = """
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
"""


def ref(stream: str, entry_id: str) -> str:
    """The index value naming one entry."""
    return f"{stream}|{entry_id}"


def forget(
    redis_client: redis.Redis, pipe: Any, keys: QueueKeys,
    entries: Iterable[tuple[str, str, str | None]],
) -> None:
    """Queue on ``pipe`` the removal of each ``(stream, entry id, job id)`` from the index,
    one script call per ``PAGE`` entries (entries without a job id are skipped)."""
    pairs = [x for stream, entry_id, job_id in entries if job_id
             for x in (job_id, ref(stream, entry_id))]
    script = cast(Any, redis_client).register_script(FORGET)
    for lo in range(0, len(pairs), 2 * PAGE):
        queue_script(pipe, script, keys=[keys.carried], args=pairs[lo : lo + 2 * PAGE])


def carried_among(*, redis_client: redis.Redis, keys: QueueKeys, job_ids: list[str]) -> set[str]:
    """Which of ``job_ids`` a stream entry carries (the index must be ready). A field whose
    entry is older than its stream's first entry names an entry that is gone with its
    stream (a stream key evicted, or deleted and created again): that job is not carried.
    A lane that carries jobs but is missing from the lane set (its member evicted) is put
    back, scored by its end, so the readers see it again."""
    client = cast(Any, redis_client)
    values: dict[str, tuple[str, str]] = {}
    for lo in range(0, len(job_ids), PAGE):
        page = job_ids[lo : lo + PAGE]
        for job_id, value in zip(page, client.hmget(keys.carried, page), strict=True):
            if value:
                stream, _, entry_id = str(value).partition("|")
                values[job_id] = (stream, entry_id)
    named = sorted({stream for stream, _ in values.values()})
    first = dict(zip(named, _first_ids(client, named), strict=True))
    present = {
        job_id for job_id, (stream, entry_id) in values.items()
        if (oldest := first.get(stream)) is not None and id_key(entry_id) >= oldest
    }
    _relist_lanes(client, keys, [s for s in named if first.get(s) is not None])
    return present


def _first_ids(client: Any, streams: list[str]) -> list[tuple[int, int] | None]:
    """The id of each stream's first entry (None: empty or missing), in one pipeline."""
    if not streams:
        return []
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xrange(stream, min="-", max="+", count=1)
    return [id_key(head[0][0]) if head else None for head in pipe.execute()]


def _relist_lanes(client: Any, keys: QueueKeys, streams: list[str]) -> None:
    """Put lanes that hold entries back in the lane set where they are missing from it."""
    ends = {s: keys.lane_end(s) for s in streams}
    lanes = [s for s, end in ends.items() if end is not None]
    if not lanes:
        return
    listed = client.zmscore(keys.lanes, lanes)
    missing = {s: float(ends[s] or 0) for s, score in zip(lanes, listed, strict=True)
               if score is None}
    if missing:
        client.zadd(keys.lanes, missing, nx=True)


def ensure_index(*, redis_client: redis.Redis, keys: QueueKeys) -> int:
    """Build the index from the streams (the interactive one and every listed lane) unless
    it is marked ready; returns how many entries the build added (0 when it was ready).
    Only entries not yet acked are indexed."""
    client = cast(Any, redis_client)
    if client.exists(keys.carried_ready):
        return 0
    added = 0
    for stream in job_streams(redis_client=redis_client, keys=keys):
        unacked = _unacked_filter(client, stream, keys.group)
        start = "-"
        while True:
            entries = client.xrange(stream, min=start, max="+", count=PAGE)
            fields = {
                f["job_id"]: ref(stream, eid)
                for eid, f in entries
                if f and f.get("job_id") and unacked(eid)
            }
            if fields:
                client.hset(keys.carried, mapping=fields)
                added += len(fields)
            if len(entries) < PAGE:
                break
            start = "(" + entries[-1][0]
    client.set(keys.carried_ready, "1")
    return added


def _unacked_filter(client: Any, stream: str, group: str) -> Any:
    """A test for one entry id: pending, or not yet delivered to the group."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no stream or no group: nothing was delivered or acked
        return lambda _eid: True
    mine = [g for g in groups if g["name"] == group]
    if not mine:
        return lambda _eid: True
    last = id_key(str(mine[0]["last-delivered-id"]))
    pending: set[str] = set()
    start = "-"
    while True:
        rows = client.xpending_range(stream, group, min=start, max="+", count=PAGE)
        pending.update(str(r["message_id"]) for r in rows)
        if len(rows) < PAGE:
            break
        start = "(" + str(rows[-1]["message_id"])
    return lambda eid: id_key(eid) > last or eid in pending
