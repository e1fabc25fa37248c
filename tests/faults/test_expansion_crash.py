"""Batch expansion is crash-safe and resumable: the API process (eager control plane) is
killed with -9 in the middle of expanding a 5,000-line file; a second API process resumes
the expansion once the dead one's lease expired, and every input line ends exactly once in
the output file or the error file."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from api.control.batch_ids import line_of_job
from tests.api.conftest import REDIS_URL, batch_lines
from tests.faults.processes import ApiProcess, CeleryWorker
from tests.jsonl import read_jsonl
from tests.service.helpers import batch_entries
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services

N_LINES = 5_000
BAD_EVERY = 97  # every 97th line is malformed JSON: it must land in the error file


def _input(path: Path) -> None:
    good = batch_lines(N_LINES, tag="x", max_tokens=2)
    with open(path, "w") as f:
        for i, line in enumerate(good, start=1):
            f.write(("{broken" if i % BAD_EVERY == 0 else json.dumps(line)) + "\n")


def _progress(ctx, batch_id: str) -> tuple[str, int, int]:
    from worker.store.crud.batch_admin import get_progress
    from worker.store.crud.batches import get_batch

    with ctx.session_factory() as s:
        status = get_batch(session=s, batch_id=batch_id).status
        p = get_progress(session=s, batch_id=batch_id)
        out = (status, p.lines_read, p.expanded)
        s.rollback()
    return out


def _wait(cond, *, timeout: float, what: str, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def _finish_all(ctx, batch_id: str) -> int:
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    with ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch_id, limit=N_LINES + 1)
        finish_jobs(
            session=s,
            results=[
                JobResult(job_id=j.id, status="succeeded", text="ok", finish_reason="length",
                          prompt_tokens=3, completion_tokens=2)
                for j in jobs
            ],
            worker_id="fake",
        )
    return len(jobs)


def test_api_killed_mid_expansion_resumes_every_line_once(make_env, tmp_path: Path) -> None:
    from api.control.finalize import finalize_batch

    env = make_env()  # the test's own view of the database, Redis prefix and storage
    s = env.settings
    proc_env = {
        "DATABASE_URL": s.database_url,
        "REDIS_URL": REDIS_URL,
        "INFLIGHT_PREFIX": s.prefix,
        "INFLIGHT_DEFAULT_MODEL": str(s.default_model),
        "INFLIGHT_STORAGE_DIR": s.storage_dir,
        "INFLIGHT_EXPAND_CHUNK": "50",
        "INFLIGHT_EXPAND_LEASE": "2",
        "INFLIGHT_BEAT_INTERVAL": "0",  # the first process never resumes anything
    }
    src = tmp_path / "in.jsonl"
    _input(src)
    h = env.auth("t-crash")
    first = ApiProcess(proc_env, tmp_path / "api1.log")
    try:
        with open(src, "rb") as f:
            up = httpx.post(first.url + "/v1/files", headers=h, data={"purpose": "batch"},
                            files={"file": ("in.jsonl", f)}, timeout=30)
        assert up.status_code == 200, up.text
        t0 = time.monotonic()
        r = httpx.post(first.url + "/v1/batches", headers=h, timeout=30,
                       json={"input_file_id": up.json()["id"], "endpoint": "/v1/completions"})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "validating"  # answered before the file was read
        assert time.monotonic() - t0 < 5
        batch_id = r.json()["id"]
        _wait(lambda: _progress(env.ctx, batch_id)[1] >= 500, timeout=30, what="expansion")
        first.kill9()
    finally:
        first.stop()
    status, lines_read, expanded = _progress(env.ctx, batch_id)
    assert not expanded and 500 <= lines_read < N_LINES, (status, lines_read)
    # every job of the expanded prefix ends; finalize still must not run on the partial batch
    assert _finish_all(env.ctx, batch_id) > 0
    assert finalize_batch(env.ctx, batch_id=batch_id) in ("validating", "in_progress")
    time.sleep(0.5)
    assert _progress(env.ctx, batch_id)[1] == lines_read  # nothing else is expanding it

    second = ApiProcess({**proc_env, "INFLIGHT_BEAT_INTERVAL": "0.2"}, tmp_path / "api2.log")
    try:
        _wait(lambda: _progress(env.ctx, batch_id)[2] == 1, timeout=60, what="resumed expansion",
              interval=0.1)
        assert _finish_all(env.ctx, batch_id) == N_LINES - N_LINES // BAD_EVERY  # (idempotent)

        _assert_every_line_once(
            env, batch_id, lambda path: httpx.get(second.url + path, headers=h, timeout=30)
        )
    finally:
        second.stop()


def _assert_every_line_once(env, batch_id: str, get) -> None:
    """The batch completes; each input line is in the output or the error file exactly once
    (the malformed ones in the error file); no line was published to the stream twice."""
    _wait(lambda: get(f"/v1/batches/{batch_id}").json()["status"] == "completed", timeout=60,
          what="completed batch", interval=0.2)
    done = get(f"/v1/batches/{batch_id}").json()
    bad = N_LINES // BAD_EVERY
    assert done["request_counts"] == {"total": N_LINES, "completed": N_LINES - bad, "failed": bad}

    def lines(file_id: str) -> list[dict]:
        return read_jsonl(get(f"/v1/files/{file_id}/content").text)

    out, err = lines(done["output_file_id"]), lines(done["error_file_id"])
    seen = Counter(line_of_job(x["response"]["request_id"]) for x in out + err)
    assert set(seen) == set(range(1, N_LINES + 1)) and max(seen.values()) == 1
    assert {line_of_job(x["response"]["request_id"]) for x in err} == {
        i for i in range(1, N_LINES + 1) if i % BAD_EVERY == 0
    }
    entries = batch_entries(env.ctx.redis, env.ctx.keys)
    published = Counter(fields["job_id"] for _, _, fields in entries)
    assert not published or max(published.values()) == 1  # no line published twice


def test_celery_child_killed_mid_expansion_task_is_redelivered(make_env, tmp_path: Path) -> None:
    """Celery mode: the pool child expanding the batch is killed with -9; acks_late +
    reject_on_worker_lost put the task back, it waits out the dead child's lease and
    resumes after the last committed chunk (no beat runs here)."""
    env = make_env(celery_eager=False, broker_url=REDIS_URL)
    s = env.settings
    src = tmp_path / "in.jsonl"
    _input(src)
    h = env.auth("t-celery-crash")
    worker = CeleryWorker(
        {
            "DATABASE_URL": s.database_url,
            "REDIS_URL": REDIS_URL,
            "CELERY_BROKER_URL": REDIS_URL,
            "INFLIGHT_PREFIX": s.prefix,
            "INFLIGHT_DEFAULT_MODEL": str(s.default_model),
            "INFLIGHT_STORAGE_DIR": s.storage_dir,
            "INFLIGHT_EXPAND_CHUNK": "50",
            "INFLIGHT_EXPAND_LEASE": "6",  # outlives the new child's start: exercises the retry
        },
        f"{s.prefix}:control",
        tmp_path / "celery.log",
    )
    try:
        with open(src, "rb") as f:
            up = env.client.post("/v1/files", headers=h, data={"purpose": "batch"},
                                 files={"file": ("in.jsonl", f)})
        r = env.client.post("/v1/batches", headers=h,
                            json={"input_file_id": up.json()["id"], "endpoint": "/v1/completions"})
        assert r.json()["status"] == "validating", r.text
        batch_id = r.json()["id"]
        _wait(lambda: _progress(env.ctx, batch_id)[1] >= 500, timeout=60, what="expansion")
        (child,) = worker.children()
        os.kill(child, signal.SIGKILL)
        status, lines_read, expanded = _progress(env.ctx, batch_id)
        assert not expanded and lines_read < N_LINES, (status, lines_read)
        _wait(lambda: _progress(env.ctx, batch_id)[2] == 1, timeout=60, what="redelivered task",
              interval=0.1)
        _finish_all(env.ctx, batch_id)
        _assert_every_line_once(env, batch_id, lambda path: env.client.get(path, headers=h))
    finally:
        worker.stop()
        for key in env.ctx.redis.scan_iter(match=f"*{s.prefix}*", count=1000):
            env.ctx.redis.delete(key)
