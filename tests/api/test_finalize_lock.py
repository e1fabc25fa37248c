"""The finalize lock is a lease: renewed with every page written, and a finalizer that
lost it (stalled past its lease while another took the batch) records nothing. A
finalized batch leaves no staging file behind."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services


def _finished_batch(env: ApiEnv, tenant: str, n: int) -> str:
    """A batch of ``n`` good lines and one invalid one, every job succeeded."""
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    h = env.auth(tenant)
    f = env.client.post("/v1/files", data={"purpose": "batch"},
                        files={"file": ("in.jsonl", jsonl([*batch_lines(n), "not json"]), "application/jsonl")},
                        headers=h).json()
    r = env.client.post("/v1/batches", json={"input_file_id": f["id"],
                                             "endpoint": "/v1/completions"}, headers=h)
    batch_id = str(wait_expanded(env, h, r.json()["id"])["id"])
    with env.ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch_id, limit=1000)
        finish_jobs(session=s, results=[JobResult(job_id=j.id, status="succeeded", text="x",
                                                  finish_reason="stop") for j in jobs],
                    worker_id="fake")
    return batch_id


def test_a_finalizer_that_lost_its_lock_records_nothing(make_env, monkeypatch) -> None:
    from api.control import finalize
    from api.control.staging import staging_path
    from worker.store.crud.batches import get_batch

    env = make_env()
    batch_id = _finished_batch(env, "t-fin-1", 3)
    lock_key = env.ctx.keys.finalize_lock(batch_id)
    real = finalize.batch_jobs_in_order
    renewals: list[int] = []

    def stalled(**kw: Any) -> Any:  # the lease ran out; another finalizer took the batch
        renewals.append(env.ctx.redis.ttl(lock_key))
        env.ctx.redis.set(lock_key, "someone-else", ex=60)
        return real(**kw)

    monkeypatch.setattr(finalize, "batch_jobs_in_order", stalled)
    with pytest.raises(RuntimeError, match="lost"):
        finalize.finalize_batch(env.ctx, batch_id=batch_id)
    assert renewals and 0 < renewals[0] <= finalize.LOCK_TTL_S
    with env.ctx.session_factory() as s:
        batch = get_batch(session=s, batch_id=batch_id)
        assert batch is not None and batch.output_file_id is None
        assert batch.status == "finalizing"  # the beat finishes it once the lock is free
    assert env.ctx.redis.get(lock_key) == "someone-else"  # not released: not ours
    assert not [p for p in env.ctx.storage.root.rglob("*") if p.is_file() and p.suffix == ".part"]
    monkeypatch.setattr(finalize, "batch_jobs_in_order", real)
    env.ctx.redis.delete(lock_key)
    staged = staging_path(env.ctx, batch_id)
    assert staged.exists()
    assert finalize.finalize_batch(env.ctx, batch_id=batch_id) == "completed"
    assert not staged.exists()  # its error lines went to the error file
