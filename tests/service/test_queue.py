"""Queue behaviour against the real Redis (and PostgreSQL for the SQL side), each test run
twice: on one Redis server, and on a three-node Redis Cluster made by the test session
(every script, transaction and multi-key command must keep to one hash slot there)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tests.service.conftest import delete_prefix
from tests.service.helpers import batch_pending, only_lane
from worker.jobs.dead_letter import dead_letter
from worker.jobs.enqueue import enqueue
from worker.jobs.republish import reconcile
from worker.queue.claim import take_over_stale
from worker.queue.consumer import ack, own_pending, read_new, redeliver, touch
from worker.queue.dead_letter import over_limit
from worker.queue.group import ensure_groups
from worker.queue.message import JobMessage, MessageError
from worker.queue.trim import trim_streams
from worker.store.crud.job_status import create_jobs, finish_jobs, start_jobs
from worker.store.crud.jobs import get_job
from worker.store.schemas import JobResult, NewJob

pytestmark = pytest.mark.services


@pytest.fixture
def redis_client(any_redis_client):
    """A client on one server, then on the cluster (this module's tests run on both)."""
    return any_redis_client


def _new(n: int, cls: str = "batch") -> list[NewJob]:
    return [NewJob(request={"url": "/v1/completions", "body": {"prompt": f"p{i}"}}, queue_class=cls) for i in range(n)]


def test_message_roundtrip_and_version() -> None:
    msg = JobMessage(job_id="j", body={"a": [1]}, tenant="t", priority=3, attempt=2, traceparent="00-ab-cd-01")
    assert JobMessage.decode(msg.encode()) == msg
    with pytest.raises(MessageError, match="version"):
        JobMessage.decode({**msg.encode(), "v": "99"})
    with pytest.raises(MessageError):
        JobMessage.decode({"v": "1", "job_id": "x"})


@pytest.mark.parametrize(
    ("body", "kind"), [('"text"', "string"), ("null", "null"), ("[1, 2]", "array"), ("3", "number")]
)
def test_message_body_must_be_a_json_object(body: str, kind: str) -> None:
    fields = {**JobMessage(job_id="j", body={}).encode(), "body": body}
    with pytest.raises(MessageError, match=f"body is a JSON {kind}, not an object"):
        JobMessage.decode(fields)
    with pytest.raises(MessageError, match="bad job message"):
        JobMessage.decode({**fields, "body": "{not json"})


def test_enqueue_commits_then_reads_interactive_first_without_hoarding(session_factory, redis_client, keys) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    batch_ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(5))
    inter_ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(2, "interactive"))
    with session_factory() as s:
        assert all(get_job(session=s, job_id=j).status == "queued" for j in batch_ids + inter_ids)
    got = read_new(redis_client=redis_client, keys=keys, consumer="c1", count=3)
    assert [d.job_id for d in got] == [*inter_ids, batch_ids[0]]  # interactive first, only 3
    assert read_new(redis_client=redis_client, keys=keys, consumer="c1", count=0) == []
    rest = read_new(redis_client=redis_client, keys=keys, consumer="c1", count=100)
    assert [d.job_id for d in rest] == batch_ids[1:]
    assert ack(redis_client=redis_client, keys=keys, entries=[(d.stream, d.entry_id, d.job_id) for d in got + rest]) == 7
    t0 = time.monotonic()
    assert read_new(redis_client=redis_client, keys=keys, consumer="c1", count=5, block_ms=200) == []
    assert time.monotonic() - t0 >= 0.15


def test_own_pending_and_redeliver_count_deliveries(session_factory, redis_client, keys) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(3))
    first = read_new(redis_client=redis_client, keys=keys, consumer="w-a", count=3)
    ack(redis_client=redis_client, keys=keys, entries=[(first[0].stream, first[0].entry_id, first[0].job_id)])
    # the process dies; a new one with the same consumer name lists what was left ...
    pending = own_pending(redis_client=redis_client, keys=keys, consumer="w-a")
    assert [(e, n) for _, e, n in pending] == [(d.entry_id, 1) for d in first[1:]]
    assert own_pending(redis_client=redis_client, keys=keys, consumer="w-b") == []
    # ... and replays it: each redelivery counts
    again = redeliver(redis_client=redis_client, keys=keys, consumer="w-a", entries=[(s, e) for s, e, _ in pending])
    assert [(d.job_id, d.deliveries) for d in again] == [(ids[1], 2), (ids[2], 2)]


def test_take_over_stale_respects_touch_and_dead_letters(session_factory, redis_client, keys) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(2))
    got = read_new(redis_client=redis_client, keys=keys, consumer="dead", count=2)
    time.sleep(1.0)  # both entries idle >= 1 s; the touch below resets one of them
    touch(redis_client=redis_client, keys=keys, consumer="dead", entries=[(got[0].stream, got[0].entry_id)])
    taken = take_over_stale(redis_client=redis_client, keys=keys, consumer="alive", min_idle_ms=800, count=10)
    assert taken == [(got[1].stream, got[1].entry_id)]  # the touched one stays with its owner
    # taking over does not count as a delivery; redelivering does
    assert [n for _, _, n in own_pending(redis_client=redis_client, keys=keys, consumer="alive")] == [1]
    for expected in (2, 3, 4):
        (d,) = redeliver(redis_client=redis_client, keys=keys, consumer="alive", entries=taken)
        assert d.deliveries == expected
    assert over_limit(d, max_deliveries=3)
    failed = dead_letter(redis_client=redis_client, session_factory=session_factory, keys=keys,
                         deliveries=[d], reason="too many deliveries")
    assert failed == [ids[1]]
    with session_factory() as s:
        job = get_job(session=s, job_id=ids[1])
        assert job.status == "failed" and "dead-lettered" in job.error
    dead = redis_client.xrange(keys.dead)
    assert [f["job_id"] for _, f in dead] == [ids[1]]
    assert batch_pending(redis_client, keys) == 1


def test_take_over_stale_reaches_dead_entries_behind_live_ones(session_factory, redis_client, keys) -> None:
    # XAUTOCLAIM scans at most 10 * COUNT pending entries per call: a dead worker's entries
    # behind 30 that a live worker keeps fresh are only reached if the scan resumes.
    ensure_groups(redis_client=redis_client, keys=keys)
    enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(33))
    live = read_new(redis_client=redis_client, keys=keys, consumer="live", count=30)
    dead = read_new(redis_client=redis_client, keys=keys, consumer="dead", count=3)
    stream = only_lane(redis_client, keys)
    # the dead worker's entries have been idle for an hour; the live ones are fresh
    redis_client.xclaim(stream, keys.group, "dead", 0, [d.entry_id for d in dead], idle=3_600_000, justid=True)
    cursors: dict[str, str] = {}
    taken: list[tuple[str, str]] = []
    for _ in range(12):
        taken += take_over_stale(redis_client=redis_client, keys=keys, consumer="alive",
                                 min_idle_ms=60_000, count=1, cursors=cursors)
    assert taken == [(stream, d.entry_id) for d in dead]
    # fresh entries stay with their owner; taking over does not count as a delivery
    assert [e for _, e, _ in own_pending(redis_client=redis_client, keys=keys, consumer="live")] == [
        d.entry_id for d in live
    ]
    assert [n for _, _, n in own_pending(redis_client=redis_client, keys=keys, consumer="alive")] == [1, 1, 1]
    assert own_pending(redis_client=redis_client, keys=keys, consumer="dead") == []
    # without a cursor every call scans the same first 10 entries and finds nothing
    redis_client.xclaim(stream, keys.group, "dead", 0, [d.entry_id for d in dead], idle=3_600_000, justid=True)
    for _ in range(12):
        assert take_over_stale(redis_client=redis_client, keys=keys, consumer="alive", min_idle_ms=60_000, count=1) == []


def test_trim_never_deletes_pending_or_unread(session_factory, redis_client, keys) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(6))
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=4)
    # ack 0, 2, 3; 1 stays pending; 4 and 5 unread
    ack(redis_client=redis_client, keys=keys, entries=[(got[i].stream, got[i].entry_id, got[i].job_id) for i in (0, 2, 3)])
    assert trim_streams(redis_client=redis_client, keys=keys) == 1  # only entry 0 may go
    left = [eid for eid, _ in redis_client.xrange(only_lane(redis_client, keys))]
    assert left[0] == got[1].entry_id and len(left) == 5
    ack(redis_client=redis_client, keys=keys, entries=[(got[1].stream, got[1].entry_id, got[1].job_id)])
    assert trim_streams(redis_client=redis_client, keys=keys) == 3
    assert len(read_new(redis_client=redis_client, keys=keys, consumer="c", count=10)) == 2


def test_reconciler_republishes_after_flush(session_factory, redis_client, keys) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(4))
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=1)
    with session_factory.begin() as s:  # a worker that is not alive had started one
        start_jobs(session=s, job_ids=[got[0].job_id], worker_id="gone")
    assert reconcile(session_factory=session_factory, redis_client=redis_client, keys=keys, grace=timedelta(0)) == []
    delete_prefix(redis_client, keys.prefix)  # Redis lost everything
    back = reconcile(session_factory=session_factory, redis_client=redis_client, keys=keys, grace=timedelta(0))
    assert sorted(back) == sorted(ids)
    again = read_new(redis_client=redis_client, keys=keys, consumer="c", count=10)
    assert sorted(d.job_id for d in again) == sorted(ids)
    assert {d.message.attempt for d in again if d.job_id == got[0].job_id} == {1}
    # once published they are present: a second pass does nothing
    assert reconcile(session_factory=session_factory, redis_client=redis_client, keys=keys, grace=timedelta(0)) == []


def test_the_reconciler_asks_the_carried_index_and_reads_no_stream(
    session_factory, redis_client, keys, monkeypatch
) -> None:
    """Once built, the index answers which open jobs a stream carries: acks and dead
    letters drop their job's field, hand-backs move it; the reconciler re-publishes
    exactly the jobs without one, reading no stream beyond its first entry."""
    from worker.queue.carried import carried_among, ensure_index
    from worker.queue.reissue import reissue_entries

    ensure_groups(redis_client=redis_client, keys=keys)
    assert ensure_index(redis_client=redis_client, keys=keys) == 0  # empty streams: ready
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                  jobs=_new(5))
    with session_factory.begin() as s:  # a producer that died between commit and XADD
        (lost,) = create_jobs(session=s, jobs=_new(1))
    assert carried_among(redis_client=redis_client, keys=keys, job_ids=[*ids, lost]) == set(ids)
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=5)
    by_id = {d.job_id: d for d in got}
    done, dead, moved = ids[0], ids[1], ids[2]
    with session_factory.begin() as s:
        start_jobs(session=s, job_ids=[done, moved], worker_id="gone")
        finish_jobs(session=s, results=[JobResult(job_id=done, status="succeeded")],
                    worker_id="gone")
    d = by_id[done]
    ack(redis_client=redis_client, keys=keys, entries=[(d.stream, d.entry_id, done)])
    dead_letter(redis_client=redis_client, session_factory=session_factory, keys=keys,
                deliveries=[by_id[dead]], reason="test")
    reissue_entries(redis_client=redis_client, keys=keys, deliveries=[by_id[moved]])
    assert carried_among(redis_client=redis_client, keys=keys, job_ids=ids) == set(ids) - {
        done, dead}
    # a duplicate delivery acked beside the live entry leaves the live one's field
    ack(redis_client=redis_client, keys=keys, entries=[(d.stream, "0-1", moved)])
    assert moved in carried_among(redis_client=redis_client, keys=keys, job_ids=[moved])

    xrange = type(redis_client).xrange

    def heads_only(self, name, min="-", max="+", count=None):
        assert count == 1, "the reconciler read a stream beyond its first entry"
        return xrange(self, name, min=min, max=max, count=count)

    monkeypatch.setattr(type(redis_client), "xrange", heads_only)
    back = reconcile(session_factory=session_factory, redis_client=redis_client, keys=keys,
                     grace=timedelta(0))
    assert back == [lost]  # done and dead ended; moved and the untouched two are carried
    monkeypatch.undo()
    assert lost in carried_among(redis_client=redis_client, keys=keys, job_ids=[lost])


def test_the_carried_index_is_rebuilt_from_the_streams_when_missing(
    session_factory, redis_client, keys
) -> None:
    """Built from what the streams hold when the index or its marker is gone (an upgrade,
    an eviction): unacked entries only."""
    from worker.queue.carried import carried_among, ensure_index

    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                  jobs=_new(5))
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=2)
    redis_client.xack(got[0].stream, keys.group, got[0].entry_id)  # an old worker's plain ack
    redis_client.delete(keys.carried, keys.carried_ready)
    assert ensure_index(redis_client=redis_client, keys=keys) == 4
    assert carried_among(redis_client=redis_client, keys=keys, job_ids=ids) == set(ids) - {
        got[0].job_id}
    assert ensure_index(redis_client=redis_client, keys=keys) == 0  # ready: not again


def test_consumer_name_lock_renews_only_for_its_holder(redis_client, keys) -> None:
    import threading

    from worker.service.naming import acquire_name, release_name, renew_name

    name, token = acquire_name(redis_client=redis_client, keys=keys, name="n1", ttl_s=5,
                               stop=threading.Event())
    lock = keys.consumer_lock(name)
    assert renew_name(redis_client=redis_client, keys=keys, name=name, token=token, ttl_s=30)
    assert redis_client.pttl(lock) > 20_000
    redis_client.set(lock, "someone-else")
    assert not renew_name(redis_client=redis_client, keys=keys, name=name, token=token, ttl_s=30)
    release_name(redis_client=redis_client, keys=keys, name=name, token=token)
    assert redis_client.get(lock) == "someone-else"  # not ours: left alone
    redis_client.delete(lock)
    assert renew_name(redis_client=redis_client, keys=keys, name=name, token=token, ttl_s=30)
    release_name(redis_client=redis_client, keys=keys, name=name, token=token)
    assert redis_client.get(lock) is None


def test_the_dead_stream_keeps_its_newest_entries(session_factory, redis_client, keys,
                                                  monkeypatch) -> None:
    """INFLIGHT_DEAD_MAXLEN caps the dead-letter stream at every XADD: the oldest go."""
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=_new(5))
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=5)
    monkeypatch.setenv("INFLIGHT_DEAD_MAXLEN", "3")
    for d in got:
        dead_letter(redis_client=redis_client, session_factory=session_factory, keys=keys,
                    deliveries=[d], reason="test")
    assert [f["job_id"] for _, f in redis_client.xrange(keys.dead)] == ids[2:]
    with session_factory() as s:  # the record stays in SQL
        assert all(get_job(session=s, job_id=j).status == "failed" for j in ids)


def test_cancel_markers_expire_one_by_one(redis_client, keys) -> None:
    """Each cancel marker lives CANCEL_TTL_S: a new flag removes the old ones, even while
    flags keep coming (the set's own TTL never ran out then); clearing removes both."""
    from worker.queue.cancel import (
        CANCEL_TTL_S,
        cancelled_among,
        clear_cancels,
        flag_cancel,
        flagged_at_key,
    )

    now = time.time()
    flag_cancel(redis_client=redis_client, keys=keys, job_id="old", now=now - CANCEL_TTL_S - 10)
    flag_cancel(redis_client=redis_client, keys=keys, job_id="recent", now=now - 60)
    ids = ["old", "recent", "new"]
    assert cancelled_among(redis_client=redis_client, keys=keys, job_ids=ids) == {"old", "recent"}
    assert flag_cancel(redis_client=redis_client, keys=keys, job_id="new", now=now) == 1
    assert cancelled_among(redis_client=redis_client, keys=keys, job_ids=ids) == {"recent", "new"}
    assert redis_client.zcard(flagged_at_key(keys)) == 2
    assert 0 < redis_client.ttl(keys.cancels) <= CANCEL_TTL_S
    clear_cancels(redis_client=redis_client, keys=keys, job_ids=["recent", "new"])
    assert redis_client.scard(keys.cancels) == 0 and redis_client.zcard(flagged_at_key(keys)) == 0
