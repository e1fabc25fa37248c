"""No background task retries a batch forever (issue 26): an expansion that keeps failing
before it commits a chunk fails the batch after ``expand_max_attempts`` runs
(``expansion_failed``), one that fails after progress starts counting again; a finalize
that keeps failing fails the batch after ``finalize_max_attempts`` runs
(``finalize_failed``); each attempt is recorded in ``batch_progress``. A line whose check
raises, or a result that cannot be rendered, fails alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services

TENANT = "t-attempts"


def _batch(env: ApiEnv, n: int) -> str:
    from worker.store.crud.batches import create_batch

    r = env.client.post("/v1/files", data={"purpose": "batch"}, headers=env.auth(TENANT),
                        files={"file": ("in.jsonl", jsonl(batch_lines(n)), "application/jsonl")})
    assert r.status_code == 200, r.text
    with env.ctx.session_factory.begin() as s:
        return create_batch(session=s, tenant=TENANT, endpoint="/v1/completions",
                            input_file_id=r.json()["id"]).id


def _resume_until_quiet(env: ApiEnv, rounds: int = 20) -> int:
    """What the beat's resume_expansions does, round after round, until no batch is
    stalled; returns how many rounds it took (``rounds`` + 1 when it never got quiet)."""
    from api.control.maintenance import stalled_expansion_ids

    for n in range(1, rounds + 1):
        ids = stalled_expansion_ids(env.ctx)
        if not ids:
            return n
        for batch_id in ids:
            env.app.state.celery.tasks["inflight.expand_batch"].apply(args=(batch_id,))
    return rounds + 1


def _state(env: ApiEnv, batch_id: str) -> tuple[Any, Any]:
    from worker.store.crud.batch_admin import get_progress
    from worker.store.crud.batches import get_batch

    with env.ctx.session_factory() as s:
        return get_batch(session=s, batch_id=batch_id), get_progress(session=s, batch_id=batch_id)


def _finish_all(env: ApiEnv, batch_id: str) -> None:
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    with env.ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch_id, limit=100)
        finish_jobs(session=s, results=[
            JobResult(job_id=j.id, status="succeeded", text="ok", finish_reason="length",
                      prompt_tokens=3, completion_tokens=2) for j in jobs])


def test_an_expansion_that_always_fails_ends_its_batch(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.control import expand

    env = make_env(expand_chunk=2, expand_max_attempts=3)
    bid = _batch(env, 5)

    def broken(*_a: Any, **_kw: Any) -> bool:
        raise RuntimeError("the chunk cannot be written")

    monkeypatch.setattr(expand, "_commit_chunk", broken)
    assert _resume_until_quiet(env) <= 10, "the expansion was resumed again and again"
    batch, progress = _state(env, bid)
    assert batch.status == "failed" and progress.expand_attempts == 3
    assert batch.errors[0]["code"] == "expansion_failed", batch.errors


def test_an_expansion_that_fails_after_each_chunk_still_finishes(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run commits a chunk before it dies: progress resets the count."""
    from api.control import expand

    env = make_env(expand_chunk=2, expand_max_attempts=2)
    bid = _batch(env, 7)
    real = expand._commit_chunk

    def one_then_die(*a: Any, **kw: Any) -> bool:
        real(*a, **kw)
        raise RuntimeError("killed after its chunk")

    monkeypatch.setattr(expand, "_commit_chunk", one_then_die)
    _resume_until_quiet(env)
    batch, progress = _state(env, bid)
    assert batch.status == "in_progress" and progress.expanded == 1
    assert batch.request_total == 7


def test_a_finalize_that_always_fails_ends_its_batch(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.control import finalize
    from api.control.expand import expand_batch
    from api.control.maintenance import finalize_ready_batches

    env = make_env(finalize_max_attempts=2)
    bid = _batch(env, 3)
    expand_batch(env.ctx, batch_id=bid)
    _finish_all(env, bid)

    def broken(*_a: Any, **_kw: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(finalize, "_write_files", broken)
    for _ in range(6):  # the 5 s beat, six times
        finalize_ready_batches(env.ctx)
    batch, progress = _state(env, bid)
    assert batch.status == "failed" and progress.finalize_attempts == 3
    assert batch.errors[0]["code"] == "finalize_failed", batch.errors


def test_a_result_that_cannot_be_rendered_fails_alone(
    env: ApiEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.control import finalize
    from api.control.expand import expand_batch

    bid = _batch(env, 3)
    expand_batch(env.ctx, batch_id=bid)
    _finish_all(env, bid)
    real = finalize.response_body

    def poisoned(job: Any, **kw: Any) -> Any:
        if job.custom_id == "r-1":
            raise ValueError("stored choices of another shape")
        return real(job, **kw)

    monkeypatch.setattr(finalize, "response_body", poisoned)
    assert finalize.finalize_batch(env.ctx, batch_id=bid) == "completed"
    batch, _ = _state(env, bid)
    assert (batch.request_completed, batch.request_failed) == (2, 1)


def test_a_line_whose_check_raises_fails_alone(
    env: ApiEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.control import expand

    bid = _batch(env, 3)
    real = expand.new_job

    def poisoned(ctx: Any, sub: Any, seen: Any = None) -> Any:
        if sub.line_no == 2:
            raise RuntimeError("a check that broke")
        return real(ctx, sub, seen)

    monkeypatch.setattr(expand, "new_job", poisoned)
    assert expand.expand_batch(env.ctx, batch_id=bid) == "in_progress"
    batch, progress = _state(env, bid)
    assert batch.request_total == 3 and progress.invalid_lines == 1
    from api.control.staging import read_errors

    error = json.loads(read_errors(env.ctx, bid)[2])
    assert error["error"]["code"] == "internal_error"
