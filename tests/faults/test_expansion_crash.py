"""Batch expansion is crash-safe and resumable: the API process (eager control plane) is
killed with -9 in the middle of expanding a 5,000-line file; a second API process resumes
the expansion once the dead one's lease expired, and every input line ends exactly once in
the output file or the error file."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from api.control.batch_ids import line_of_job
from tests.api.conftest import REDIS_URL, batch_lines
from tests.faults.processes import ApiProcess
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
    from worker.store.crud.jobs import finish_jobs, list_jobs

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

        def batch() -> dict:
            return httpx.get(f"{second.url}/v1/batches/{batch_id}", headers=h, timeout=30).json()

        _wait(lambda: batch()["status"] == "completed", timeout=60, what="final", interval=0.2)
        done = batch()
        bad = N_LINES // BAD_EVERY
        assert done["request_counts"] == {"total": N_LINES, "completed": N_LINES - bad,
                                          "failed": bad}

        def lines(file_id: str) -> list[dict]:
            c = httpx.get(f"{second.url}/v1/files/{file_id}/content", headers=h, timeout=30)
            return [json.loads(x) for x in c.text.splitlines()]

        out, err = lines(done["output_file_id"]), lines(done["error_file_id"])
    finally:
        second.stop()
    seen = Counter(line_of_job(x["response"]["request_id"]) for x in out + err)
    assert set(seen) == set(range(1, N_LINES + 1)) and max(seen.values()) == 1
    assert {line_of_job(x["response"]["request_id"]) for x in err} == {
        i for i in range(1, N_LINES + 1) if i % BAD_EVERY == 0
    }
    entries = env.ctx.redis.xrange(env.ctx.keys.stream("batch"))
    published = Counter(fields["job_id"] for _, fields in entries)
    assert not published or max(published.values()) == 1  # no line published twice
