"""Job retention (issue 29 part 5, issue 26 "nothing grows forever") against the real
PostgreSQL and Redis: a finished job's request body and result are cleared after
``job_result_retention_days`` (its accounting stays, ``GET /v1/jobs/{id}`` says it expired),
its row is deleted after ``job_retention_days``; open jobs, jobs of a batch still open (its
files not written yet) and jobs with a webhook pending are kept; a backlog goes in chunks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from api.settings import Settings
from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}


def _days_ago(days: float):
    from worker.store.base import utcnow

    return utcnow() - timedelta(days=days)


def _finish(env: ApiEnv, job_ids: list[str], *, days_ago: float, status: str = "succeeded") -> None:
    """End the jobs as a worker would, ``days_ago`` days ago."""
    from worker.store.crud.job_status import finish_jobs

    when = _days_ago(days_ago)
    results = [
        JobResult(job_id=j, status=status, text="hi!" if status == "succeeded" else None,
                  finish_reason="stop", prompt_tokens=3, completion_tokens=2,
                  error="boom" if status == "failed" else None, finished_at=when,
                  choices=[{"text": "hi!", "finish_reason": "stop"}] if status == "succeeded" else None)
        for j in job_ids
    ]
    with env.ctx.session_factory.begin() as s:
        finish_jobs(session=s, worker_id="fake", results=results)


def _submit(env: ApiEnv, h: dict[str, str], n: int = 1) -> list[str]:
    ids = []
    for i in range(n):
        r = env.client.post("/v1/jobs", json={**CHAT, "metadata": {"n": str(i)}}, headers=h)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


def _row(env: ApiEnv, job_id: str) -> Any:
    from worker.store.models import Job

    with env.ctx.session_factory() as s:
        return s.get(Job, job_id)


def _retention(env: ApiEnv) -> dict[str, int]:
    """The hourly beat task, as Celery runs it."""
    return env.app.state.celery.tasks["inflight.prune_iterations"].apply().get()


def _batch_jobs(env: ApiEnv, batch_id: str) -> list[str]:
    from worker.store.crud.jobs import list_jobs

    with env.ctx.session_factory() as s:
        return [j.id for j in list_jobs(session=s, batch_id=batch_id, limit=100)]


def _open_batch(env: ApiEnv, h: dict[str, str], n: int) -> str:
    f = env.client.post("/v1/files", data={"purpose": "batch"}, headers=h,
                        files={"file": ("in.jsonl", jsonl(batch_lines(n)), "application/jsonl")})
    assert f.status_code == 200, f.text
    r = env.client.post("/v1/batches", headers=h, json={
        "input_file_id": f.json()["id"], "endpoint": "/v1/completions"})
    assert r.status_code == 200, r.text
    batch = wait_expanded(env, h, r.json()["id"])
    assert batch["status"] == "in_progress"  # no worker: its jobs wait
    return batch["id"]


def test_settings_refuse_rows_kept_shorter_than_results(monkeypatch) -> None:
    assert Settings().job_result_retention_days == 30 and Settings().job_retention_days == 90
    with pytest.raises(ValueError, match="INFLIGHT_JOB_RETENTION_DAYS"):
        Settings(job_result_retention_days=30, job_retention_days=10)
    with pytest.raises(ValueError, match="INFLIGHT_JOB_RESULT_RETENTION_DAYS"):
        Settings(job_result_retention_days=None, job_retention_days=90)
    Settings(job_result_retention_days=None, job_retention_days=None)  # both forever
    Settings(job_result_retention_days=7, job_retention_days=None)
    monkeypatch.setenv("INFLIGHT_JOB_RESULT_RETENTION_DAYS", "2")
    monkeypatch.setenv("INFLIGHT_JOB_RETENTION_DAYS", "never")
    s = Settings.from_env()
    assert (s.job_result_retention_days, s.job_retention_days) == (2.0, None)
    monkeypatch.setenv("INFLIGHT_JOB_RESULT_RETENTION_DAYS", "-1")
    assert Settings.from_env().job_result_retention_days is None
    monkeypatch.setenv("INFLIGHT_JOB_RETENTION_DAYS", "1")
    monkeypatch.setenv("INFLIGHT_JOB_RESULT_RETENTION_DAYS", "5")
    with pytest.raises(ValueError, match="must be at least"):
        Settings.from_env()


def test_settings_refuse_batches_kept_shorter_than_jobs(monkeypatch) -> None:
    assert Settings().batch_retention_days == 365 and Settings().retention_interval == 3600
    with pytest.raises(ValueError, match="INFLIGHT_BATCH_RETENTION_DAYS"):
        Settings(job_retention_days=90, batch_retention_days=30)
    Settings(job_retention_days=None, batch_retention_days=30)  # jobs kept: moot
    monkeypatch.setenv("INFLIGHT_BATCH_RETENTION_DAYS", "never")
    monkeypatch.setenv("INFLIGHT_RETENTION_INTERVAL", "60")
    s = Settings.from_env()
    assert (s.batch_retention_days, s.retention_interval) == (None, 60.0)
    from api.control.celery_app import beat_schedule

    assert beat_schedule(s)["inflight.prune_iterations"] == 60.0


def test_old_batches_go_once_their_jobs_are_gone(env: ApiEnv) -> None:
    """A batch ended more than ``batch_retention_days`` ago goes (row and progress) once
    job retention deleted its jobs; a recent one, an open one and one with jobs stay."""
    from worker.store.crud.batch_admin import get_progress
    from worker.store.crud.batches import get_batch
    from worker.store.models import BatchProgress

    h = env.auth("t-bret")
    old, recent, still_open = (_open_batch(env, h, 2) for _ in range(3))
    for batch_id in (old, recent):
        _finish(env, _batch_jobs(env, batch_id), days_ago=100)
        assert env.client.get(f"/v1/batches/{batch_id}", headers=h).json()["status"] == "completed"
    with env.ctx.session_factory.begin() as s:
        get_batch(session=s, batch_id=old).completed_at = _days_ago(400)
    done = _retention(env)  # its jobs go first, then the batch, in the same run
    assert done["jobs_deleted"] >= 4 and done["batches_deleted"] == 1, done
    assert env.client.get(f"/v1/batches/{old}", headers=h).status_code == 404
    with env.ctx.session_factory() as s:
        assert s.get(BatchProgress, old) is None
        assert get_progress(session=s, batch_id=recent).expanded == 1
    assert env.client.get(f"/v1/batches/{recent}", headers=h).json()["status"] == "completed"
    assert env.client.get(f"/v1/batches/{still_open}", headers=h).json()["status"] == "in_progress"


def test_results_expire_and_get_says_so(env: ApiEnv) -> None:
    h = env.auth("t-jret-results")
    old, failed, recent, open_job = _submit(env, h, 4)
    _finish(env, [old], days_ago=40)
    _finish(env, [failed], days_ago=40, status="failed")
    _finish(env, [recent], days_ago=1)
    before = env.client.get(f"/v1/jobs/{old}", headers=h).json()
    assert before["result"] is not None and before["result_expired_at"] is None

    got = _retention(env)
    assert got["results_expired"] >= 2 and "iterations" in got and "jobs_deleted" in got

    after = env.client.get(f"/v1/jobs/{old}", headers=h)
    assert after.status_code == 200, after.text
    view = after.json()
    assert view["result"] is None and view["result_expired_at"] is not None
    # the accounting stays
    for key in ("status", "usage", "timeline", "endpoint", "custom_id", "batch_id", "attempts"):
        assert view[key] == before[key], key
    assert view["status"] == "succeeded" and view["usage"]["total_tokens"] == 5
    row = _row(env, old)
    assert row.request == {"url": "/v1/chat/completions", "body": {}}
    assert row.text is None and row.choices is None and row.finish_reason == "stop"
    assert row.tenant == "t-jret-results"
    gone = env.client.get(f"/v1/jobs/{failed}", headers=h).json()
    assert gone["status"] == "failed" and gone["error"] is None and gone["result_expired_at"]
    assert _row(env, failed).error is None
    # ended recently, or not ended: untouched
    fresh = env.client.get(f"/v1/jobs/{recent}", headers=h).json()
    assert fresh["result"] is not None and fresh["result_expired_at"] is None
    still = env.client.get(f"/v1/jobs/{open_job}", headers=h).json()
    assert still["status"] == "queued" and still["result_expired_at"] is None
    assert _row(env, open_job).request["body"]["messages"]
    # a second run finds nothing new of ours and keeps the first mark
    mark = view["result_expired_at"]
    _retention(env)
    assert env.client.get(f"/v1/jobs/{old}", headers=h).json()["result_expired_at"] == mark


def test_old_rows_are_deleted_but_open_ones_kept(env: ApiEnv) -> None:
    from worker.store.crud.api_jobs import get_api_job

    h = env.auth("t-jret-rows")
    ancient, open_job, hooked = _submit(env, h, 3)
    _finish(env, [ancient, hooked], days_ago=100)
    with env.ctx.session_factory.begin() as s:
        meta = get_api_job(session=s, job_id=hooked)
        assert meta is not None
        meta.webhook_state = "pending"  # not delivered yet: its row stays
    assert _retention(env)["jobs_deleted"] >= 1
    assert env.client.get(f"/v1/jobs/{ancient}", headers=h).status_code == 404
    assert _row(env, ancient) is None
    with env.ctx.session_factory() as s:
        assert get_api_job(session=s, job_id=ancient) is None
    assert env.client.get(f"/v1/jobs/{open_job}", headers=h).json()["status"] == "queued"
    kept = env.client.get(f"/v1/jobs/{hooked}", headers=h).json()
    assert kept["result"] is not None and kept["result_expired_at"] is None


def test_jobs_of_an_open_batch_are_kept(env: ApiEnv) -> None:
    from api.control.finalize import finalize_batch
    from worker.store.crud.batch_admin import set_batch_status

    h = env.auth("t-jret-batch")
    batch_id = _open_batch(env, h, 3)
    jobs = _batch_jobs(env, batch_id)
    _finish(env, jobs[:2], days_ago=100)  # one still queued: the batch stays in_progress
    _retention(env)
    for j in jobs[:2]:
        view = env.client.get(f"/v1/jobs/{j}", headers=h).json()
        assert view["result"] is not None and view["result_expired_at"] is None, view
    # all ended but its files not written yet (finalizing): still kept
    _finish(env, jobs[2:], days_ago=100)
    with env.ctx.session_factory.begin() as s:
        assert set_batch_status(session=s, batch_id=batch_id, status="finalizing")
    _retention(env)
    assert all(_row(env, j).result_expired_at is None for j in jobs)
    assert finalize_batch(env.ctx, batch_id=batch_id) == "completed"
    batch = env.client.get(f"/v1/batches/{batch_id}", headers=h).json()
    out = env.client.get(f"/v1/files/{batch['output_file_id']}/content", headers=h)
    assert out.text.count("\n") == 3
    # ended: its jobs go, the batch and its output file stay
    _retention(env)
    assert all(_row(env, j) is None for j in jobs)
    again = env.client.get(f"/v1/batches/{batch_id}", headers=h).json()
    assert again["status"] == "completed" and again["request_counts"]["completed"] == 3
    assert env.client.get(f"/v1/files/{batch['output_file_id']}/content", headers=h).text == out.text


def test_retry_of_a_batch_whose_requests_expired_is_409(env: ApiEnv) -> None:
    h = env.auth("t-jret-retry")
    batch_id = _open_batch(env, h, 2)
    _finish(env, _batch_jobs(env, batch_id), days_ago=40, status="failed")
    assert env.client.get(f"/v1/batches/{batch_id}", headers=h).json()["status"] == "completed"
    _retention(env)
    r = env.client.post(f"/v1/batches/{batch_id}/retry", headers=h)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "request_expired"


def test_retry_of_a_batch_whose_jobs_were_deleted_is_409(env: ApiEnv) -> None:
    h = env.auth("t-jret-retry-gone")
    batch_id = _open_batch(env, h, 2)
    _finish(env, _batch_jobs(env, batch_id), days_ago=100, status="failed")
    assert env.client.get(f"/v1/batches/{batch_id}", headers=h).json()["status"] == "completed"
    assert _retention(env)["jobs_deleted"] >= 2
    r = env.client.post(f"/v1/batches/{batch_id}/retry", headers=h)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "jobs_expired"


def test_a_backlog_goes_in_chunks(make_env, monkeypatch) -> None:
    from api.control import maintenance

    env = make_env(retention_chunk=2)
    h = env.auth("t-jret-chunks")
    ids = _submit(env, h, 5)
    _finish(env, ids, days_ago=40)
    calls: dict[str, int] = {"results": 0, "rows": 0}

    def counted(name: str, step: Any) -> Any:
        def run(**kw: Any) -> int:
            calls[name] += 1
            done = step(**kw)
            assert done <= kw["limit"] == 2
            return done

        return run

    monkeypatch.setattr(maintenance, "expire_job_results",
                        counted("results", maintenance.expire_job_results))
    monkeypatch.setattr(maintenance, "delete_old_jobs",
                        counted("rows", maintenance.delete_old_jobs))
    got = maintenance.expire_old_jobs(env.ctx)
    assert got["results_expired"] >= 5 and calls["results"] >= 3
    assert all(_row(env, j).result_expired_at is not None for j in ids)
    env.ctx.settings.job_retention_days = 30  # now past the row cutoff too
    got = maintenance.expire_old_jobs(env.ctx)
    assert got["jobs_deleted"] >= 5 and calls["rows"] >= 3
    assert all(_row(env, j) is None for j in ids)
