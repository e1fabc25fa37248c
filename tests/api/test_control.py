"""Control-plane tasks: webhook delivery with retries and backoff, reconciliation of lost
jobs, pruning of iteration rows, the Celery app (eager) and the embedded beat."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from tests.api.conftest import ApiEnv
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}


class _Hook(BaseHTTPRequestHandler):
    fail_first: ClassVar[int] = 2
    received: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append(
            {"body": body, "attempt": self.headers.get("X-Inflight-Delivery-Attempt")}
        )
        status = 500 if len(type(self).received) <= type(self).fail_first else 204
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hook_server():
    _Hook.received = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


def _finish(env: ApiEnv, job_id: str) -> None:
    from worker.store.crud.job_status import finish_jobs

    with env.ctx.session_factory.begin() as s:
        finish_jobs(
            session=s,
            results=[
                JobResult(
                    job_id=job_id,
                    status="succeeded",
                    text="hi!",
                    finish_reason="stop",
                    prompt_tokens=3,
                    completion_tokens=2,
                )
            ],
        )


def _next_try(env: ApiEnv, job_id: str):
    from worker.store.models import ApiJob

    with env.ctx.session_factory() as s:
        return s.get(ApiJob, job_id).webhook_next_at


def _make_due(env: ApiEnv, job_id: str) -> None:
    """Move the job's next try into the past: the test skips the wait, not the rule."""
    from sqlalchemy import update

    from worker.store.base import utcnow
    from worker.store.models import ApiJob

    with env.ctx.session_factory.begin() as s:
        s.execute(
            update(ApiJob)
            .where(ApiJob.job_id == job_id)
            .values(webhook_next_at=utcnow() - timedelta(seconds=1))
        )


def _attempt(env: ApiEnv, job_id: str) -> tuple[dict[str, int], timedelta, timedelta]:
    """One delivery round; returns its counts and the bounds on the delay it scheduled."""
    from api.control.webhooks import deliver_due_webhooks
    from worker.store.base import utcnow

    before = utcnow()
    stats = deliver_due_webhooks(env.ctx)
    after = utcnow()
    next_at = _next_try(env, job_id)
    if next_at is None:
        return stats, timedelta(0), timedelta(0)
    next_at = next_at.replace(tzinfo=before.tzinfo)
    return stats, next_at - after, next_at - before


def test_webhook_retries_with_backoff(make_env, hook_server) -> None:
    """Each failed try schedules the next at backoff * 2**attempts, nothing is sent
    before that time, and the third try (receiver healthy again) is delivered. The
    delays are read from the stored schedule, not from sleeps, so a slow machine cannot
    fail it."""
    backoff = 30.0
    env = make_env(
        webhook_backoff=backoff, webhook_max_attempts=5, webhook_allow_hosts=("127.0.0.1",)
    )
    h = env.auth("t-hook")
    job = env.client.post("/v1/jobs", json={**CHAT, "callback_url": hook_server}, headers=h).json()
    assert job["webhook"]["state"] == "pending"
    stats, _, _ = _attempt(env, job["id"])
    assert stats["retrying"] == 0  # not ended yet: nothing due
    _finish(env, job["id"])
    for attempt in range(2):  # the receiver answers 500 twice
        stats, low, high = _attempt(env, job["id"])
        assert stats == {"delivered": 0, "retrying": 1, "failed": 0, "lost": 0}
        delay = timedelta(seconds=backoff * 2**attempt)
        assert low <= delay <= high + timedelta(seconds=0.01)
        assert _attempt(env, job["id"])[0] == {"delivered": 0, "retrying": 0, "failed": 0, "lost": 0}
        _make_due(env, job["id"])
    assert _attempt(env, job["id"])[0]["delivered"] == 1
    assert [r["attempt"] for r in _Hook.received] == ["1", "2", "3"]
    payload = _Hook.received[-1]["body"]
    assert payload["type"] == "job.succeeded" and payload["data"]["id"] == job["id"]
    assert payload["data"]["result"]["choices"][0]["message"]["content"] == "hi!"
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=h).json()
    assert got["webhook"] == {"state": "delivered", "attempts": 3, "last_error": None}


def test_webhook_gives_up(make_env) -> None:
    from api.control.webhooks import deliver_due_webhooks

    env = make_env(
        webhook_backoff=0.0,
        webhook_max_attempts=2,
        webhook_timeout=0.5,
        webhook_allow_hosts=("127.0.0.1",),
    )
    h = env.auth("t-hook2")
    job = env.client.post(
        "/v1/jobs", json={**CHAT, "callback_url": "http://127.0.0.1:1/x"}, headers=h
    ).json()
    _finish(env, job["id"])
    assert deliver_due_webhooks(env.ctx)["retrying"] == 1
    assert deliver_due_webhooks(env.ctx)["failed"] == 1
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=h).json()["webhook"]
    assert got["state"] == "failed" and got["attempts"] == 2 and got["last_error"] == "connection failed"


def test_reconcile_and_prune(make_env) -> None:
    from api.control.maintenance import prune_old_iterations, reconcile_jobs
    from worker.store.base import utcnow
    from worker.store.crud.iterations import insert_iterations

    env = make_env(reconcile_grace=0.0)
    h = env.auth("t-rec")
    job = env.client.post("/v1/jobs", json=CHAT, headers=h).json()
    env.ctx.redis.delete(env.ctx.keys.stream("interactive"))  # Redis lost it
    assert reconcile_jobs(env.ctx) >= 1
    ids = [e[1]["job_id"] for e in env.ctx.redis.xrange(env.ctx.keys.stream("interactive"))]
    assert job["id"] in ids
    row = dict(
        worker_id=f"w-{env.ctx.keys.prefix}",
        num_running=1,
        num_waiting=0,
        num_prefill_tokens=1,
        num_decode_tokens=0,
        kv_blocks_used=1,
        kv_blocks_total=2,
        num_preemptions=0,
        num_admitted=1,
        num_finished=0,
        schedule_ms=0.1,
        forward_ms=0.1,
        sample_ms=0.1,
    )
    with env.ctx.session_factory.begin() as s:
        insert_iterations(
            session=s,
            rows=[
                {**row, "step": 1, "time": utcnow() - timedelta(days=30)},
                {**row, "step": 2, "time": utcnow()},
            ],
        )
    assert prune_old_iterations(env.ctx) >= 1


def test_embedded_beat_finalizes_batches(make_env) -> None:
    from tests.api.conftest import batch_lines, jsonl, wait_expanded
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    env = make_env(beat_interval=0.2)
    h = env.auth("t-beat")
    f = env.client.post(
        "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", jsonl(batch_lines(2)))},
        headers=h,
    ).json()
    batch = env.client.post(
        "/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/completions"}, headers=h
    ).json()
    wait_expanded(env, h, batch["id"])
    with env.ctx.session_factory.begin() as s:
        finish_jobs(
            session=s,
            results=[
                JobResult(
                    job_id=j.id,
                    status="succeeded",
                    text="t",
                    finish_reason="stop",
                    prompt_tokens=1,
                    completion_tokens=1,
                )
                for j in list_jobs(session=s, batch_id=batch["id"])
            ],
        )
    from worker.store.crud.batches import get_batch

    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        with env.ctx.session_factory() as s:  # read the row: a GET would finalize by itself
            status = get_batch(session=s, batch_id=batch["id"]).status
        if status == "completed":
            break
        time.sleep(0.1)
    assert status == "completed"


def test_separate_celery_worker(make_env, tmp_path) -> None:
    """Non-eager: the API sends tasks through the Redis broker to a real Celery worker."""
    import os
    import subprocess
    import sys

    from tests.api.conftest import REDIS_URL, batch_lines, jsonl
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    env = make_env(celery_eager=False, broker_url=REDIS_URL)
    s = env.settings
    log = open(tmp_path / "celery.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "api.control.celery_main",
            "worker",
            "-P",
            "solo",
            "-Q",
            f"{s.prefix}:control",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
            "-l",
            "warning",
        ],
        env={
            **os.environ,
            "DATABASE_URL": s.database_url,
            "REDIS_URL": REDIS_URL,
            "CELERY_BROKER_URL": REDIS_URL,
            "INFLIGHT_PREFIX": s.prefix,
            "INFLIGHT_STORAGE_DIR": s.storage_dir,
            "INFLIGHT_CELERY_EAGER": "0",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        h = env.auth("t-celery")
        f = env.client.post(
            "/v1/files",
            data={"purpose": "batch"},
            files={"file": ("in.jsonl", jsonl(batch_lines(3)))},
            headers=h,
        ).json()
        batch = env.client.post(
            "/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/completions"}, headers=h
        ).json()
        assert batch["status"] == "validating"  # expansion happens in the Celery worker

        def status() -> dict:
            return env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()

        deadline = time.monotonic() + 60
        while status()["request_counts"]["total"] < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status()["status"] == "in_progress"
        with env.ctx.session_factory.begin() as sess:
            finish_jobs(
                session=sess,
                results=[
                    JobResult(
                        job_id=j.id,
                        status="succeeded",
                        text="t",
                        finish_reason="stop",
                        prompt_tokens=1,
                        completion_tokens=1,
                    )
                    for j in list_jobs(session=sess, batch_id=batch["id"])
                ],
            )
        while status()["status"] != "completed" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status()["status"] == "completed", (tmp_path / "celery.log").read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        for key in env.ctx.redis.scan_iter(match=f"*{s.prefix}*", count=1000):
            env.ctx.redis.delete(key)
