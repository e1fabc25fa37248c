"""``inflight top``: worker rows from the workers/iterations/jobs tables (SQLite built by
the migrations) and queue depths from the real Redis (own database, unique key prefix)."""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from datetime import timedelta

import pytest

from cli.main import main
from worker.store.base import utcnow
from worker.store.crud.worker_activity import worker_activity
from worker.store.db import make_engine, make_session_factory
from worker.store.models import Iteration, Job, Worker

REDIS_URL = "redis://127.0.0.1:6379/13"  # the service tests' database; keys carry a prefix


def _redis_up() -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 6379), timeout=1):
        return True
    return False


def step_row(worker: str, step: int, time, running: int, kv: int) -> Iteration:
    return Iteration(
        worker_id=worker, step=step, time=time, num_running=running, num_waiting=3,
        num_prefill_tokens=100, num_decode_tokens=running, kv_blocks_used=kv,
        kv_blocks_total=200, num_preemptions=0, num_admitted=0, num_finished=0,
        schedule_ms=0.1, forward_ms=1.0, sample_ms=0.1,
    )  # fmt: skip


@pytest.fixture
def db(tmp_path):
    """A migrated SQLite file: worker ``w-top`` stepped 4 times in the last 2 s (latest batch
    17, KV 50/200) and once long ago, finished 3 jobs recently and 1 long ago; ``w-old`` is
    stopped. Returns (url, now)."""
    from migrations.run import upgrade

    url = f"sqlite:///{tmp_path / 'top.db'}"
    upgrade(url=url)
    now = utcnow()
    ago = lambda s: now - timedelta(seconds=s)  # noqa: E731
    engine = make_engine(url=url)
    with make_session_factory(engine=engine).begin() as s:
        s.add_all([
            Worker(id="w-top", host="h1", model="tiny-llama", status="running",
                   heartbeat_at=ago(0.5), started_at=ago(100)),
            Worker(id="w-stale", host="h2", model="tiny-llama", status="running",
                   heartbeat_at=ago(90), started_at=ago(100)),
            Worker(id="w-old", host="h3", model="tiny-llama", status="stopped",
                   heartbeat_at=ago(50), started_at=ago(100)),
            step_row("w-top", 1, ago(60), 1, 10),
            step_row("w-top", 2, ago(2.0), 14, 40),
            step_row("w-top", 3, ago(1.5), 15, 44),
            step_row("w-top", 4, ago(1.0), 16, 48),
            step_row("w-top", 5, ago(0.5), 17, 50),
            *[Job(id=f"job_{i}", request={}, worker_id="w-top", status="succeeded",
                  queued_at=ago(70), finished_at=ago(t)) for i, t in enumerate((1, 2, 3, 40))],
        ])  # fmt: skip
    engine.dispose()
    return url, now


def test_worker_activity_rates(db) -> None:
    url, now = db
    engine = make_engine(url=url)
    with make_session_factory(engine=engine)() as s:
        rows = worker_activity(session=s, window_s=4.0, now=now, worker_timeout_s=30)
        everyone = worker_activity(session=s, window_s=4.0, now=now, include_stopped=True)
    engine.dispose()
    assert [w.id for w in rows] == ["w-stale", "w-top"]
    assert [w.id for w in everyone] == ["w-old", "w-stale", "w-top"]
    stale, top = rows
    assert not stale.alive and stale.step is None and stale.running is None
    assert top.alive and top.heartbeat_age_s == pytest.approx(0.5)
    assert (top.step, top.running, top.waiting, top.kv_used, top.kv_total) == (5, 17, 3, 50, 200)
    assert top.kv_use == pytest.approx(0.25)
    assert top.steps_per_s == pytest.approx(4 / 4.0)  # steps 2-5; step 1 is outside
    assert top.tokens_per_s == pytest.approx((4 * 100 + 14 + 15 + 16 + 17) / 4.0)
    assert top.decode_tokens_per_s == pytest.approx((14 + 15 + 16 + 17) / 4.0)
    assert top.jobs_per_s == pytest.approx(3 / 4.0)


@pytest.mark.skipif(not _redis_up(), reason="Redis is not answering on 127.0.0.1:6379")
def test_top_once_shows_workers_and_queue_depths(db, capsys: pytest.CaptureFixture[str]) -> None:
    from worker.queue.connection import make_redis
    from worker.queue.group import ensure_groups
    from worker.queue.keys import QueueKeys

    url, _ = db
    keys = QueueKeys(prefix=f"inflight-top-{uuid.uuid4().hex[:10]}", model="tiny-llama")
    client = make_redis(url=REDIS_URL)
    try:
        ensure_groups(redis_client=client, keys=keys)
        stream = keys.stream("interactive")
        for i in range(7):
            client.xadd(stream, {"job_id": f"job_x{i}"})
        client.xreadgroup(keys.group, "c1", {stream: ">"}, count=2)  # 2 pending, 5 undelivered
        client.xadd(keys.dead, {"job_id": "job_dead"})
        from worker.queue.message import JobMessage
        from worker.queue.producer import publish

        publish(redis_client=client, keys=keys, messages=[  # a batch lane due in two hours
            ("batch", JobMessage(job_id="job_b", body={"body": {"prompt": "p"}},
                                 deadline=time.time() + 7200))])
        assert main(["top", "--once", "--window", "60", "--database-url", url,
                     "--redis-url", REDIS_URL, "--prefix", keys.prefix]) == 0  # fmt: skip
    finally:
        from worker.queue.wipe import delete_deployment

        delete_deployment(redis_client=client, keys=keys)
        client.close()
    out = capsys.readouterr().out
    lines = out.splitlines()
    top = next(line for line in lines if line.startswith("w-top"))
    fields = top.split()
    assert fields[1] == "running" and 0.4 <= float(fields[2].rstrip("s")) < 30
    assert fields[3:7] == ["5", "17", "3", "25"]  # step, batch, waiting, KV %
    stale = next(line for line in lines if line.startswith("w-stale"))
    assert stale.split()[1] == "running?"
    assert not any(line.startswith("w-old") for line in lines)
    # the streams of the model the workers served (w-top, w-stale and w-old: tiny-llama)
    row = next(line for line in lines if line.split()[:2] == ["tiny-llama", "interactive"])
    # length, pending, undelivered, consumers; no deadline nor slack
    assert row.split()[2:] == ["7", "2", "5", "1", "-", "-"]
    lane = next(line for line in lines if line.split()[:2] == ["tiny-llama", "batch"])
    assert lane.split()[2:6] == ["1", "0", "1", "0"]
    assert lane.split()[6].startswith("+1h5") and lane.split()[7].startswith("+1h5")  # due, slack
    dead = next(line for line in lines if line.split()[:2] == ["tiny-llama", "dead"])
    assert dead.split()[2:] == ["1", "-", "-", "-", "-", "-"]
    assert "\x1b[" not in out  # --once prints plain text


def test_top_survives_an_unreachable_redis(db, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = db
    assert main(["top", "--once", "--database-url", url,
                 "--redis-url", "redis://127.0.0.1:1/0"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "redis: unreachable" in out
    assert any(line.startswith("w-top") for line in out.splitlines())


def test_top_refreshes_until_interrupted(db, monkeypatch, capsys) -> None:
    import cli.top_cmd as top_cmd

    url, _ = db
    frames = []

    def fake_sleep(seconds: float) -> None:
        frames.append(seconds)
        if len(frames) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(top_cmd.time, "sleep", fake_sleep)
    assert main(["top", "--interval", "0.25", "--database-url", url,
                 "--redis-url", "redis://127.0.0.1:1/0"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert frames == [0.25, 0.25]
    assert out.count(top_cmd.CLEAR) == 2 and out.count("w-top") == 2


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--window", "0"), ("--window", "-5"), ("--window", "nan"), ("--interval", "0"),
     ("--interval", "-1"), ("--interval", "inf"), ("--window", "soon")],
)  # fmt: skip
def test_top_refuses_non_positive_seconds(flag, value, capsys) -> None:
    """A zero window would divide by zero in the rates (and used to show up as "store:
    unreachable"): argparse refuses it before anything connects."""
    with pytest.raises(SystemExit) as exc:
        main(["top", "--once", flag, value, "--database-url", "sqlite:///:memory:",
              "--redis-url", "redis://127.0.0.1:1/0"])  # fmt: skip
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err
    assert "seconds" in err
