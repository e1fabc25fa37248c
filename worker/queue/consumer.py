"""Consumer side: read new entries (interactive first, then the batch lanes in the order the
caller gives: least slack first, ``worker.service.dispatch``), replay own pending, ack,
keep alive.

A lane can be dropped by the trim between the moment a reader listed it and its read (it
held nothing then): the read of that lane answers NOGROUP and is skipped; only the
interactive stream's group is made again on NOGROUP (after Redis lost its data)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import redis

from worker.queue.carried import forget
from worker.queue.delivery import Delivery
from worker.queue.entry_ids import id_key
from worker.queue.group import ensure_groups, is_nogroup
from worker.queue.keys import QueueKeys
from worker.queue.lanes import job_streams
from worker.queue.message import JobMessage, MessageError
from worker.queue.suspects import field_of


def to_delivery(
    stream: str, entry_id: str, fields: dict[str, str] | None, deliveries: int = 1
) -> Delivery:
    """Decode one raw entry into a Delivery (undecodable entries carry ``error``)."""
    fields = fields or {}
    try:
        return Delivery(stream, entry_id, fields, JobMessage.decode(fields), deliveries)
    except MessageError as exc:
        return Delivery(stream, entry_id, fields, None, deliveries, error=str(exc))


def _xreadgroup(
    redis_client: redis.Redis,
    keys: QueueKeys,
    consumer: str,
    streams: dict[str, str],
    count: int,
    block: int | None,
) -> list[Delivery]:
    """One XREADGROUP; a NOGROUP answer makes the interactive group again (a lane's is
    made only by a publish) and reads nothing this time."""
    try:
        reply: Any = cast(Any, redis_client).xreadgroup(
            keys.group, consumer, streams, count=count, block=block
        )
    except redis.ResponseError as exc:
        if not is_nogroup(exc):
            raise
        ensure_groups(redis_client=redis_client, keys=keys)
        return []
    out: list[Delivery] = []
    for stream, entries in reply or []:
        for entry_id, fields in entries:
            out.append(to_delivery(stream, entry_id, fields))
    return out


def read_new(
    *,
    redis_client: redis.Redis,
    keys: QueueKeys,
    consumer: str,
    count: int,
    block_ms: int | None = None,
    streams: list[str] | None = None,
    block_streams: list[str] | None = None,
) -> list[Delivery]:
    """Read at most ``count`` never-delivered entries from ``streams`` in their order, going
    on to the next while there is room (default: the interactive stream, then the lanes,
    earliest deadline first).

    Without ``block_ms`` it never waits. With it, and nothing available at once, it waits up
    to ``block_ms`` for the first entry of any of ``block_streams`` (default: ``streams``;
    then it returns at most one per stream).
    """
    if count <= 0:
        return []
    if streams is None:
        streams = job_streams(redis_client=redis_client, keys=keys)
    out: list[Delivery] = []
    for stream in streams:
        want = count - len(out)
        if want <= 0:
            break
        out += _xreadgroup(redis_client, keys, consumer, {stream: ">"}, want, None)
    if out or not block_ms:
        return out
    watched = block_streams if block_streams is not None else streams
    return _xreadgroup(redis_client, keys, consumer, {s: ">" for s in watched}, 1, block_ms)


def own_pending(
    *, redis_client: redis.Redis, keys: QueueKeys, consumer: str, page: int = 1000
) -> list[tuple[str, str, int]]:
    """``(stream, entry_id, deliveries so far)`` of every entry pending for ``consumer``,
    interactive first, then each lane (earliest deadline first), oldest first. Listing
    does not count as a delivery."""
    out: list[tuple[str, str, int]] = []
    for stream in job_streams(redis_client=redis_client, keys=keys):
        start = "-"
        while True:
            try:
                rows = cast(Any, redis_client).xpending_range(
                    stream, keys.group, min=start, max="+", count=page, consumername=consumer
                )
            except redis.ResponseError as exc:
                if not is_nogroup(exc):
                    raise
                if stream == keys.interactive:
                    ensure_groups(redis_client=redis_client, keys=keys)
                break
            out += [(stream, r["message_id"], int(r["times_delivered"])) for r in rows]
            if len(rows) < page:
                break
            start = "(" + rows[-1]["message_id"]
    return out


def redeliver(
    *, redis_client: redis.Redis, keys: QueueKeys, consumer: str, entries: Sequence[tuple[str, str]]
) -> list[Delivery]:
    """Deliver again entries ``consumer`` already owns (XCLAIM counts a delivery), with
    their delivery counts. Entries deleted from the stream leave the pending list."""
    out: list[Delivery] = []
    by_stream: dict[str, list[str]] = {}
    for stream, entry_id in entries:
        by_stream.setdefault(stream, []).append(entry_id)
    for stream, ids in by_stream.items():
        for entry_id, fields in cast(Any, redis_client).xclaim(
            stream, keys.group, consumer, 0, ids
        ):
            out.append(to_delivery(stream, entry_id, fields))
    _fill_delivery_counts(redis_client, keys, consumer, [d for d in out])
    return out


def _fill_delivery_counts(
    redis_client: redis.Redis, keys: QueueKeys, consumer: str, deliveries: list[Delivery]
) -> None:
    by_stream: dict[str, list[Delivery]] = {}
    for d in deliveries:
        by_stream.setdefault(d.stream, []).append(d)
    for stream, items in by_stream.items():
        wanted = {d.entry_id: d for d in items}
        lo = min(items, key=lambda d: id_key(d.entry_id)).entry_id
        hi = max(items, key=lambda d: id_key(d.entry_id)).entry_id
        start = lo
        while True:
            rows = cast(Any, redis_client).xpending_range(
                stream, keys.group, min=start, max=hi, count=1000, consumername=consumer
            )
            for row in rows:
                found = wanted.get(row["message_id"])
                if found is not None:
                    found.deliveries = int(row["times_delivered"])
            if len(rows) < 1000:
                break
            start = "(" + rows[-1]["message_id"]


def ack(
    *, redis_client: redis.Redis, keys: QueueKeys, entries: Iterable[tuple[str, str, str | None]]
) -> int:
    """XACK ``(stream, entry_id, job_id)`` entries in one pipeline, dropping any evidence
    kept on them (their run ended) and the entry as its job's carrier (``worker.queue.
    carried``); returns how many were pending."""
    owned = list(entries)
    by_stream: dict[str, list[str]] = {}
    for stream, entry_id, _job_id in owned:
        by_stream.setdefault(stream, []).append(entry_id)
    if not by_stream:
        return 0
    pipe = redis_client.pipeline(transaction=False)
    for stream, ids in by_stream.items():
        pipe.xack(stream, keys.group, *ids)
    pipe.hdel(keys.suspects, *(field_of(s, e) for s, ids in by_stream.items() for e in ids))
    forget(redis_client, pipe, keys, owned)
    replies = pipe.execute(raise_on_error=False)[: len(by_stream)]
    return sum(int(n) for n in replies if isinstance(n, int))


def touch(
    *, redis_client: redis.Redis, keys: QueueKeys, consumer: str, entries: Sequence[tuple[str, str]]
) -> None:
    """Reset the idle time of entries this consumer is still working on (XCLAIM JUSTID does
    not count a delivery), so no other worker takes them over as stale."""
    by_stream: dict[str, list[str]] = {}
    for stream, entry_id in entries:
        by_stream.setdefault(stream, []).append(entry_id)
    if not by_stream:
        return
    pipe = redis_client.pipeline(transaction=False)
    for stream, ids in by_stream.items():
        for i in range(0, len(ids), 500):
            pipe.xclaim(stream, keys.group, consumer, 0, list[Any](ids[i : i + 500]), justid=True)
    pipe.execute(raise_on_error=False)
