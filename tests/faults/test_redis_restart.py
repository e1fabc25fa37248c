"""A real Redis restart without persistence mid-run: ``SHUTDOWN NOSAVE`` on a Redis this
test starts on its own port, then a new, empty server on the same port, while a worker
runs. While Redis is down a running job is cancelled (recorded in SQL; the signal cannot
be sent) and a producer enqueues (committed; the publish fails). Nothing is lost or run
twice: the reconciler re-publishes the open jobs from SQL, the cancel still ends its job
``cancelled``, and the jobs committed while Redis was down run."""

from __future__ import annotations

import socket
import subprocess
import time

import psycopg
import pytest
import redis

import tests.service.test_worker_failures as wf
from tests.jsonl import read_jsonl
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
    keys = QueueKeys(prefix="restart", model="tiny-llama")
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
        code = wf._stop(worker)
        server.terminate()  # before any assertion: a failed run leaves no server behind
        server.wait(20)
    assert code == 0
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


N_LINES = 1500


def test_redis_restarted_while_a_batch_expands(migrated_pg, tmp_path) -> None:
    """The API (control plane in-process) expands a 1,500-line batch in chunks of 25 while
    Redis is shut down without saving and started empty again; a worker runs what comes.
    Chunks committed while Redis is down are published by the reconciler; the batch
    completes with every line exactly once in its output file."""

    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.context import make_context
    from api.settings import Settings
    from tests.api.conftest import batch_lines, jsonl
    from worker.store.crud.api_keys import create_api_key

    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    port = _free_port()
    server = _redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    settings = Settings(database_url=migrated_pg, redis_url=url, prefix="restart-batch",
                        storage_dir=str(tmp_path / "files"), beat_interval=0, expand_chunk=25,
                        default_model="tiny-llama")
    ctx = make_context(settings)
    with ctx.session_factory.begin() as s:
        _, key = create_api_key(session=s, tenant="t-restart")
    h = {"Authorization": f"Bearer {key}"}
    worker = start_worker(db_url=migrated_pg, redis_url=url, prefix=settings.prefix,
                          name="rb", log_path=tmp_path / "w.log")
    try:
        with TestClient(create_app(settings, ctx=ctx)) as client:
            up = client.post("/v1/files", headers=h, data={"purpose": "batch"},
                             files={"file": ("in.jsonl", jsonl(batch_lines(N_LINES, max_tokens=2)),
                                             "application/jsonl")})
            assert up.status_code == 200, up.text
            batch = client.post("/v1/batches", headers=h, json={
                "input_file_id": up.json()["id"], "endpoint": "/v1/completions"}).json()
            redis.Redis(port=port).shutdown(nosave=True)  # while it expands
            server.wait(20)
            server = _redis_server(port, tmp_path)
            deadline = time.monotonic() + 240
            while True:
                view = client.get(f"/v1/batches/{batch['id']}", headers=h).json()
                if view["status"] in ("completed", "failed", "expired", "cancelled"):
                    break
                assert time.monotonic() < deadline, (
                    f"batch stuck: {view}; jobs {wf._counts(ctx.session_factory)}; worker log: "
                    f"{_log_tail(tmp_path / 'w.log')}")
                time.sleep(0.5)
            assert view["status"] == "completed", view
            assert view["request_counts"] == {"total": N_LINES, "completed": N_LINES,
                                              "failed": 0}, view
            out = client.get(f"/v1/files/{view['output_file_id']}/content", headers=h)
            ids = [row["custom_id"] for row in read_jsonl(out.text)]
        assert sorted(ids) == sorted(f"r-{i}" for i in range(N_LINES))  # each line once
    finally:
        code = wf._stop(worker)
        ctx.close()
        server.terminate()
        server.wait(20)
    assert code == 0
    wf._assert_each_result_written_once(migrated_pg, N_LINES)


def _log_tail(path) -> str:
    """The worker log's lines that are not traceback frames (its story, not its stacks)."""
    lines = [x for x in path.read_text().splitlines() if not x.startswith((" ", "Traceback"))]
    (path.parent / "worker-story.log").write_text("\n".join(lines))
    return "\n".join(lines[-40:])


def test_a_worker_started_while_redis_is_down_waits_for_it(
    migrated_pg, session_factory, tmp_path
) -> None:
    """Redis not answering when a worker starts (a restart, a deploy in the wrong order)
    is waited out: the worker takes its name and its groups once Redis is back."""
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    keys = QueueKeys(prefix="late-redis", model="tiny-llama")
    log = tmp_path / "w.log"
    worker = start_worker(db_url=migrated_pg, redis_url=url, prefix=keys.prefix, name="late",
                          log_path=log)
    server = None
    try:
        wait_for(lambda: "take a consumer name failed" in log.read_text(), timeout=120,
                 what="the worker to find Redis away")
        assert worker.poll() is None, "the worker exited instead of waiting for Redis"
        server = _redis_server(port, tmp_path)
        client = redis.Redis.from_url(url, decode_responses=True)
        ids = enqueue(session_factory=session_factory, redis_client=client, keys=keys,
                      jobs=prompt_jobs(5, max_tokens=4))
        wait_for(lambda: wf._done(session_factory, len(ids)), timeout=120,
                 what="the jobs to run once Redis is up")
        assert wf._counts(session_factory) == {"succeeded": 5}
    finally:
        code = wf._stop(worker)
        if server is not None:
            server.terminate()
            server.wait(20)
    assert code == 0
