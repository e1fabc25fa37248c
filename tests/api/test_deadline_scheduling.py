"""Deadline-aware scheduling end to end (issue 29, item 1): three batches submitted in the
wrong order (the longest window first) to the API, then two real workers on the tiny model
read the batch lanes least slack first. The tightest batch finishes first, and the
long-window batch still progresses while tighter work runs (reads are work-conserving: a
lane that cannot fill a worker leaves its room to the next). Also the ``deadline`` of
``POST /v1/jobs``: stored, answered, choosing the job's lane, or refused with a reason."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.api.conftest import OPERATOR_KEY, ApiEnv, jsonl, tiny_worker
from tests.service.helpers import batch_lanes, wait_for

pytestmark = pytest.mark.services

# Each worker runs 3 jobs at once and reads no more than that (no prefetch, no interactive
# reserve), so every read takes exactly its room from the lanes in their order.
ENGINE: dict[str, Any] = {"max_num_seqs": 3, "interactive_reserve_seqs": 0}
CONFIG: dict[str, Any] = {"prefetch": 0}


def _lines(tag: str, n: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": f"{tag} {i}: the quick brown fox", "max_tokens": 24,
                      "ignore_eos": True, "temperature": 0}}
            for i in range(n)]


def _batch(env: ApiEnv, h: dict[str, str], tag: str, n: int, window: str) -> dict[str, Any]:
    up = env.client.post("/v1/files", data={"purpose": "batch"},
                         files={"file": (f"{tag}.jsonl", jsonl(_lines(tag, n)), "application/jsonl")},
                         headers=h)
    assert up.status_code == 200, up.text
    r = env.client.post("/v1/batches", headers=h, json={
        "input_file_id": up.json()["id"], "endpoint": "/v1/completions",
        "completion_window": window})
    assert r.status_code == 200, r.text
    assert env.app.state.dispatcher.wait_idle(30)  # expanded: its jobs are in their lane
    return r.json()


def _span(env: ApiEnv, batch_id: str) -> tuple[float, float, list[str], set[str | None]]:
    """(first engine start, last finish, statuses, workers) of a batch's jobs."""
    from sqlalchemy import select

    from worker.store.models import Job

    with env.ctx.session_factory() as s:
        rows = list(s.scalars(select(Job).where(Job.batch_id == batch_id)))
    starts = [r.started_at.timestamp() for r in rows if r.started_at]
    ends = [r.finished_at.timestamp() for r in rows if r.finished_at]
    return (min(starts, default=0.0), max(ends, default=0.0), [r.status for r in rows],
            {r.worker_id for r in rows})


def test_the_tightest_batch_finishes_first_and_none_starves(env: ApiEnv) -> None:
    h = env.auth("tenant-deadlines")
    long = _batch(env, h, "long", 6, "24h")  # submitted first ...
    mid = _batch(env, h, "mid", 5, "4h")
    tight = _batch(env, h, "tight", 2, "1h")  # ... and the tightest last
    assert len(batch_lanes(env.ctx.redis, env.ctx.keys)) == 3
    metrics = env.client.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}).text
    assert 'inflight_stream_length{model="tiny-llama",stream="batch"} 13' in metrics
    assert 'inflight_batch_lanes{model="tiny-llama"} 3' in metrics
    (least,) = [line for line in metrics.splitlines()
                if line.startswith("inflight_batch_least_slack_seconds{")]
    assert 3000 < float(least.split()[-1]) <= 3600  # the 1 h batch: no rate measured yet
    # lanes read least slack first, 3 entries per read: [T T M] [M M M] [M L L] [L L L] [L]
    import transformers  # the two workers load their engines at once: import it here first

    transformers.AutoModelForCausalLM  # noqa: B018 (a lazy module: the name loads it)
    with tiny_worker(env, "w-a", config=CONFIG, **ENGINE), \
            tiny_worker(env, "w-b", config=CONFIG, **ENGINE):
        def done() -> bool:
            return all(set(_span(env, b["id"])[2]) == {"succeeded"}
                       for b in (long, mid, tight))
        wait_for(done, timeout=240, what="every job of the three batches to succeed")
    (t_start, t_end, _, tw), (m_start, m_end, _, mw), (l_start, l_end, _, lw) = (
        _span(env, b["id"]) for b in (tight, mid, long))
    assert len(tw | mw | lw) == 2  # both workers ran batch work
    assert t_end < m_end < l_end  # the tightest first, although submitted last
    assert max(t_start, m_start) < l_start  # the long batch's first read came after theirs
    assert l_start < m_end  # the long batch ran beside the tighter work: it is not starved
    for b in (tight, mid, long):
        got = env.client.get(f"/v1/batches/{b['id']}", headers=h).json()
        assert got["request_counts"]["completed"] == got["request_counts"]["total"]


def test_a_jobs_deadline_is_stored_answered_and_picks_its_lane(env: ApiEnv) -> None:
    from worker.queue.slack import lane_end

    h = env.auth("tenant-deadline")
    due = datetime.now(timezone.utc) + timedelta(hours=3)
    body = {"prompt": "hi", "max_tokens": 2, "queue_class": "batch"}
    r = env.client.post("/v1/jobs", headers=h, json={**body, "deadline": due.isoformat()})
    assert r.status_code == 201, r.text
    assert r.json()["deadline"] == int(due.timestamp())
    unix = env.client.post("/v1/jobs", headers=h, json={**body, "deadline": int(due.timestamp())})
    assert unix.status_code == 201 and unix.json()["deadline"] == int(due.timestamp())
    default = env.client.post("/v1/jobs", headers=h, json=body)
    assert default.status_code == 201
    assert default.json()["deadline"] == pytest.approx(time.time() + 86400, abs=60)
    now = time.time()
    assert env.client.get(f"/v1/jobs/{r.json()['id']}", headers=h).json()["deadline"] == int(
        due.timestamp())
    assert batch_lanes(env.ctx.redis, env.ctx.keys) == [
        env.ctx.keys.lane(lane_end(due.timestamp(), now)),
        env.ctx.keys.lane(lane_end(now + 86400, now))]
    assert env.client.post("/v1/jobs", headers=h, json={"prompt": "hi"}).json()["deadline"] is None


@pytest.mark.parametrize(("deadline", "extra", "says"), [
    ("2020-01-01T00:00:00Z", {}, "not in the future"),
    ("2030-01-01T00:00:00", {}, "needs a time zone"),
    (None, {"queue_class": "interactive"}, "for batch work"),
    ("2300-01-01T00:00:00Z", {}, "9999 hours"),
    ("soon", {}, "deadline"),
])
def test_a_deadline_that_cannot_be_honoured_is_refused(env: ApiEnv, deadline: str | None,
                                                       extra: dict[str, Any], says: str) -> None:
    h = env.auth("tenant-refused")
    when = deadline or (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    body = {"prompt": "hi", "queue_class": "batch", **extra, "deadline": when}
    r = env.client.post("/v1/jobs", headers=h, json=body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"] and r.json()["error"]["param"] == "deadline"
    assert batch_lanes(env.ctx.redis, env.ctx.keys) == []  # nothing written
