"""A real Redis restart without persistence mid-run: ``SHUTDOWN NOSAVE`` on a Redis this
test starts on its own port, then a new, empty server on the same port, while a worker
runs. While Redis is down a running job is cancelled (recorded in SQL; the signal cannot
be sent) and a producer enqueues (committed; the publish fails). Nothing is lost or run
twice: the reconciler re-publishes the open jobs from SQL, the cancel still ends its job
``cancelled``, and the jobs committed while Redis was down run."""

from __future__ import annotations

import socket
import subprocess

import psycopg
import pytest
import redis

import tests.service.test_worker_failures as wf
from tests.service.helpers import prompt_jobs, start_worker, wait_for
from worker.jobs.cancel import request_cancel
from worker.jobs.enqueue import NotPublished, enqueue
from worker.queue.keys import QueueKeys
from worker.store.crud.jobs import get_job
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services

N_FIRST, N_DURING = 80, 40
LONG = 600  # tokens: 12 s at the paced 20 ms per step, cancelled long before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_server(port: int, tmp_path) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    wait_for(lambda: _pings(client), timeout=20, what=f"redis on port {port}")
    client.close()
    return proc


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_redis_restarted_without_its_data_mid_run(migrated_pg, session_factory, tmp_path) -> None:
    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    port = _free_port()
    server = _redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = QueueKeys(prefix="restart")
    long_job = NewJob(request={"url": "/v1/completions", "body": {
        "prompt": "a long one", "max_tokens": LONG, "ignore_eos": True, "temperature": 0}})
    (long_id,) = enqueue(session_factory=session_factory, redis_client=client, keys=keys,
                         jobs=[long_job])  # first in line: it runs from the start
    first = enqueue(session_factory=session_factory, redis_client=client, keys=keys,
                    jobs=prompt_jobs(N_FIRST, max_tokens=8))
    worker = start_worker(db_url=migrated_pg, redis_url=url, prefix=keys.prefix, name="r",
                          log_path=tmp_path / "w.log", **wf.PACED)
    try:
        wait_for(lambda: _status(session_factory, long_id) == "running"
                 and wf._counts(session_factory).get("succeeded", 0) >= 10, timeout=300,
                 what="the long job to run beside the first results")
        client.shutdown(nosave=True)  # redis-py swallows the dropped connection
        server.wait(20)
        assert wf._counts(session_factory).get("succeeded", 0) < N_FIRST, "all done before"
        assert request_cancel(session_factory=session_factory, redis_client=client, keys=keys,
                              job_id=long_id) == "running"  # recorded; no signal possible
        try:  # a producer while Redis is down: committed, not published
            during = enqueue(session_factory=session_factory, redis_client=client, keys=keys,
                             jobs=prompt_jobs(N_DURING, max_tokens=8, tag="during"))
            raise AssertionError(f"published to a stopped Redis: {during}")
        except NotPublished as exc:
            during = exc.job_ids
        assert len(during) == N_DURING
        server = _redis_server(port, tmp_path)  # the same address, no data at all
        total = N_FIRST + 1 + N_DURING
        wait_for(lambda: wf._done(session_factory, total), timeout=300,
                 what="every job to end after the restart")
        assert wf._counts(session_factory) == {"succeeded": total - 1, "cancelled": 1}
        with session_factory() as s:
            assert (get_job(session=s, job_id=long_id).completion_tokens or 0) < LONG
        assert worker.poll() is None, "the worker died with Redis"
    finally:
        assert wf._stop(worker) == 0
        server.terminate()
        server.wait(20)
    log = (tmp_path / "w.log").read_text()
    assert "reconciler re-published" in log
    wf._assert_each_result_written_once(migrated_pg, total)
    assert set(first) | set(during) | {long_id} == _all_ids(migrated_pg)


def _status(session_factory, job_id: str) -> str | None:
    with session_factory() as s:
        job = get_job(session=s, job_id=job_id)
        return job.status if job else None


def _all_ids(pg_url: str) -> set[str]:
    with psycopg.connect(pg_url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM jobs").fetchall()}
