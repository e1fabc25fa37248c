"""The batch lanes against the real Redis, each test on one server and on a three-node
Redis Cluster: batch work goes to the lane of its deadline, registered with its work;
readers go least slack first; claims, replays, reissues, the index, the reconciler, the
trim and the admission bound see every lane; a drained lane is dropped and comes back
with the next publish; the measured rates sum into the model's."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from tests.service.helpers import batch_lanes, batch_pending
from worker.jobs.enqueue import enqueue
from worker.jobs.republish import reconcile
from worker.queue.admission import admit
from worker.queue.carried import carried_among
from worker.queue.claim import take_over_stale
from worker.queue.consumer import ack, own_pending, read_new, redeliver
from worker.queue.lanes import (
    drop_drained_lanes,
    lane_list,
    lane_states,
    model_rate,
    queued_work_before,
    report_rate,
)
from worker.queue.reissue import reissue_entries
from worker.queue.slack import lane_end, read_order
from worker.queue.stream_stats import stream_stats
from worker.queue.trim import trim_streams
from worker.service.dispatch import Dispatch
from worker.store.base import utcnow
from worker.store.crud.job_status import create_jobs
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services


@pytest.fixture
def redis_client(any_redis_client):
    """A client on one server, then on the cluster (this module's tests run on both)."""
    return any_redis_client


def _jobs(n: int, *, due_in_h: float | None, max_tokens: int = 16, cls: str = "batch",
          tag: str = "j") -> list[NewJob]:
    deadline = None if due_in_h is None else utcnow() + timedelta(hours=due_in_h)
    return [NewJob(request={"url": "/v1/completions",
                            "body": {"prompt": f"{tag}{i} " + "w" * 36, "max_tokens": max_tokens}},
                   queue_class=cls, deadline=deadline, custom_id=f"{tag}{i}")
            for i in range(n)]


def _put(session_factory: Any, redis_client: Any, keys: Any, jobs: list[NewJob]) -> list[str]:
    return enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=jobs)


def test_batch_work_goes_to_the_lane_of_its_deadline(session_factory, redis_client, keys) -> None:
    now = time.time()
    week = _put(session_factory, redis_client, keys, _jobs(3, due_in_h=24 * 7, tag="w"))
    hour = _put(session_factory, redis_client, keys, _jobs(2, due_in_h=1, max_tokens=4, tag="h"))
    default = _put(session_factory, redis_client, keys, _jobs(1, due_in_h=None, tag="d"))
    lanes = lane_list(redis_client=redis_client, keys=keys)
    assert [lane for lane, _ in lanes] == [
        keys.lane(lane_end(now + 3600, now)), keys.lane(lane_end(now + 86400, now)),
        keys.lane(lane_end(now + 7 * 86400, now))]  # earliest first; no deadline: 24 h
    assert lanes[0][1] == pytest.approx(now + 3600, abs=5)  # the earliest deadline in it
    states = {s.stream: s for s in lane_states(redis_client=redis_client, keys=keys)}
    hour_lane = states[lanes[0][0]]
    assert (hour_lane.remaining, hour_lane.undelivered) == (2, 2)
    assert hour_lane.work_per_entry == 10 + 4  # 40 prompt characters, 4 output tokens
    assert [s.remaining for s in states.values()] == [2, 1, 3]
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=10,
                   streams=[keys.interactive, *(lane for lane, _ in lanes)])
    assert [d.job_id for d in got] == [*hour, *default, *week]
    assert all(d.message is not None and d.message.deadline for d in got)


def test_least_slack_reads_a_big_later_batch_before_a_small_sooner_one(
    session_factory, redis_client, keys
) -> None:
    small = _put(session_factory, redis_client, keys, _jobs(1, due_in_h=2, tag="s"))
    big = _put(session_factory, redis_client, keys, _jobs(20, due_in_h=3, max_tokens=2000, tag="b"))
    rt = SimpleNamespace(redis=redis_client, keys=keys, consumer="w1")
    dispatch = Dispatch(rt, lambda: (0.0, 0.0))  # type: ignore[arg-type]
    # no rate measured yet: earliest deadline first
    assert read_new(redis_client=redis_client, keys=keys, consumer="w1", count=1,
                    streams=dispatch.streams())[0].job_id == small[0]
    _put(session_factory, redis_client, keys, _jobs(1, due_in_h=2, tag="s2"))
    # 20 x 2010 tokens at 5 tokens/s: 8040 s of the big lane's 3 h; 2760 s to spare < 7200
    report_rate(redis_client=redis_client, keys=keys, consumer="w2", rate=5.0)
    dispatch.read_short()
    time.sleep(dispatch.min_refresh_s)
    order = dispatch.streams()
    assert dispatch.model_rate == 5.0
    got = read_new(redis_client=redis_client, keys=keys, consumer="w1", count=21, streams=order)
    assert [d.job_id for d in got][:20] == big  # then the small one, work-conserving
    assert len(got) == 21


def test_claims_replays_and_reissues_reach_every_lane(session_factory, redis_client, keys) -> None:
    a = _put(session_factory, redis_client, keys, _jobs(2, due_in_h=1, tag="a"))
    b = _put(session_factory, redis_client, keys, _jobs(2, due_in_h=48, tag="b"))
    got = read_new(redis_client=redis_client, keys=keys, consumer="dead", count=4)
    assert {d.job_id for d in got} == {*a, *b} and len({d.stream for d in got}) == 2
    assert len(own_pending(redis_client=redis_client, keys=keys, consumer="dead")) == 4
    for d in got:
        redis_client.xclaim(d.stream, keys.group, "dead", 0, [d.entry_id], idle=3_600_000,
                            justid=True)
    taken = take_over_stale(redis_client=redis_client, keys=keys, consumer="alive",
                            min_idle_ms=60_000, count=10)
    assert sorted(taken) == sorted((d.stream, d.entry_id) for d in got)
    again = redeliver(redis_client=redis_client, keys=keys, consumer="alive", entries=taken)
    assert all(d.deliveries == 2 for d in again)
    # the set member of one lane is lost (evicted): the reissue lists the lane again
    lost = again[0].stream
    redis_client.zrem(keys.lanes, lost)
    assert reissue_entries(redis_client=redis_client, keys=keys, deliveries=again) == 4
    assert lost in batch_lanes(redis_client, keys) and batch_pending(redis_client, keys) == 0
    fresh = read_new(redis_client=redis_client, keys=keys, consumer="other", count=10)
    assert sorted(d.job_id for d in fresh) == sorted([*a, *b])
    assert {d.stream for d in fresh} == {d.stream for d in got}  # each stayed in its lane
    # a carried job's lane missing from the set is listed again by the reconciler's check
    redis_client.zrem(keys.lanes, lost)
    assert carried_among(redis_client=redis_client, keys=keys, job_ids=[*a, *b]) == {*a, *b}
    assert lost in batch_lanes(redis_client, keys)


def test_a_drained_lane_is_dropped_and_made_again(session_factory, redis_client, keys) -> None:
    ids = _put(session_factory, redis_client, keys, _jobs(3, due_in_h=1))
    (lane,) = batch_lanes(redis_client, keys)
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=2)
    ack(redis_client=redis_client, keys=keys, entries=[(got[0].stream, got[0].entry_id, ids[0])])
    assert drop_drained_lanes(redis_client=redis_client, keys=keys) == (0, 0)  # pending, unread
    ack(redis_client=redis_client, keys=keys, entries=[(got[1].stream, got[1].entry_id, ids[1])])
    assert drop_drained_lanes(redis_client=redis_client, keys=keys) == (0, 0)  # one unread
    (last,) = read_new(redis_client=redis_client, keys=keys, consumer="c", count=5)
    ack(redis_client=redis_client, keys=keys, entries=[(last.stream, last.entry_id, ids[2])])
    stale_order = [keys.interactive, lane]
    assert trim_streams(redis_client=redis_client, keys=keys) == 3  # the lane went, with its 3
    assert redis_client.exists(lane) == 0 and batch_lanes(redis_client, keys) == []
    assert redis_client.hlen(keys.lane_work) == 0
    # a reader that listed the lane before it went skips it
    assert read_new(redis_client=redis_client, keys=keys, consumer="c", count=5,
                    streams=stale_order) == []
    assert redis_client.exists(lane) == 0  # and did not make it again
    more = _put(session_factory, redis_client, keys, _jobs(1, due_in_h=1, tag="m"))
    assert batch_lanes(redis_client, keys) == [lane]  # published again: lane and group made
    assert [d.job_id for d in read_new(redis_client=redis_client, keys=keys, consumer="c",
                                       count=5)] == more


def test_the_reconciler_publishes_to_the_lane_of_the_rows_deadline(
    session_factory, redis_client, keys
) -> None:
    due = utcnow() + timedelta(hours=2)
    job = NewJob(request={"url": "/v1/completions", "body": {"prompt": "p"}}, deadline=due)
    with session_factory.begin() as s:  # committed, its publish lost
        (job_id,) = create_jobs(session=s, jobs=[job], now=utcnow() - timedelta(minutes=5))
    assert reconcile(session_factory=session_factory, redis_client=redis_client, keys=keys,
                     grace=timedelta(seconds=0)) == [job_id]
    (lane,) = batch_lanes(redis_client, keys)
    assert keys.lane_end(lane) == lane_end(due.timestamp(), time.time())
    (d,) = read_new(redis_client=redis_client, keys=keys, consumer="c", count=5)
    assert d.job_id == job_id and d.message is not None
    assert d.message.deadline == pytest.approx(due.timestamp())


def test_admission_and_stats_count_every_lane(session_factory, redis_client, keys) -> None:
    _put(session_factory, redis_client, keys, _jobs(3, due_in_h=1, tag="a"))
    _put(session_factory, redis_client, keys, _jobs(4, due_in_h=30, tag="b"))
    got = admit(redis_client=redis_client, keys=keys, queue_class="batch", offered=5, max_depth=10)
    assert got.room == 3  # 7 of 10 taken, over both lanes
    assert admit(redis_client=redis_client, keys=keys, queue_class="interactive", offered=5,
                 max_depth=10).room == 5
    report_rate(redis_client=redis_client, keys=keys, consumer="w1", rate=2.0)
    report_rate(redis_client=redis_client, keys=keys, consumer="w2", rate=3.0)
    report_rate(redis_client=redis_client, keys=keys, consumer="gone", rate=99.0,
                now=time.time() - 7200)
    assert model_rate(redis_client=redis_client, keys=keys) == 5.0
    assert redis_client.hexists(keys.rates, "gone") == 0  # old reports are forgotten
    stats = stream_stats(redis_client=redis_client, keys=keys)
    assert [s.kind for s in stats] == ["interactive", "batch", "batch", "dead"]
    assert [s.lag for s in stats[1:3]] == [3, 4]
    lanes = lane_states(redis_client=redis_client, keys=keys)
    order = read_order(lanes, now=time.time(), rate=5.0)
    assert [s.stream for s in stats[1:3]] == [lane.stream for lane in order]
    assert stats[1].slack == pytest.approx(3600 - 3 * 26 / 5.0, abs=5)
    work = queued_work_before(redis_client=redis_client, keys=keys, deadline=time.time() + 7200)
    assert (work.due.entries, work.due.work, work.rate) == (3, 3 * 26, 5.0)
    assert work.seconds == pytest.approx(3 * 26 / 5.0)


def test_interactive_work_takes_no_deadline(session_factory, redis_client, keys) -> None:
    with pytest.raises(ValueError, match="deadline is for batch work"):
        _put(session_factory, redis_client, keys, _jobs(1, due_in_h=1, cls="interactive"))
    assert batch_lanes(redis_client, keys) == []
