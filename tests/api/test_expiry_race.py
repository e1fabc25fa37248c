"""A batch's expiry (or cancel) racing its expansion, driven step by step: whatever chunk
the expansion commits around the expiry, no job of the expired batch is left to run, and
every request line of the input ends exactly once, in the output or the error file (the
lines the expansion never read as ``batch_expired`` / ``batch_cancelled`` errors, as the
OpenAI Batch API writes unfinished requests)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl
from tests.jsonl import read_jsonl

pytestmark = pytest.mark.services

TENANT = "t-expiry-race"


def _input(n: int) -> list[Any]:
    """``n`` good lines with a blank line and three invalid ones among them (line 2 bad
    JSON, line 4 blank, line 5 not an object, the last line an unknown field)."""
    lines: list[Any] = batch_lines(n, tag="x")
    lines.insert(1, "{not json")
    lines.insert(3, "")
    lines.insert(4, "[1]")
    lines.append({"custom_id": "bad-field", "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": "p", "bogus": 1}})
    return lines


def _batch(env: ApiEnv, lines: list[Any]) -> str:
    """A batch of ``lines`` created in SQL (no expansion dispatched: the test drives it)."""
    from worker.store.crud.batches import create_batch

    h = env.auth(TENANT)
    r = env.client.post("/v1/files", data={"purpose": "batch"},
                        files={"file": ("in.jsonl", jsonl(lines), "application/jsonl")},
                        headers=h)
    assert r.status_code == 200, r.text
    with env.ctx.session_factory.begin() as s:
        return create_batch(session=s, tenant=TENANT, endpoint="/v1/completions",
                            input_file_id=r.json()["id"]).id


def _past_window(env: ApiEnv, batch_id: str) -> None:
    from worker.store.base import utcnow
    from worker.store.crud.batches import get_batch

    with env.ctx.session_factory.begin() as s:
        get_batch(session=s, batch_id=batch_id).expires_at = utcnow() - timedelta(seconds=1)


def _expand_one_chunk(env: ApiEnv, batch_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run an expansion that commits its first chunk and then stops (as if its process
    died right after), leaving the rest of the file unread and the lease free."""
    from api.control import expand

    real = expand._commit_chunk
    calls: list[int] = []

    def first_only(*a: Any, **kw: Any) -> bool:
        calls.append(1)
        return real(*a, **kw) and len(calls) < 1

    monkeypatch.setattr(expand, "_commit_chunk", first_only)
    expand.expand_batch(env.ctx, batch_id=batch_id)
    monkeypatch.setattr(expand, "_commit_chunk", real)


def _file_lines(env: ApiEnv, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    r = env.client.get(f"/v1/files/{file_id}/content", headers=env.auth(TENANT))
    assert r.status_code == 200, r.text
    return read_jsonl(r.text)


def _assert_each_line_once(env: ApiEnv, batch_id: str, lines: list[Any], code: str) -> None:
    """Every non-blank input line is in exactly one of the two files, once (by the
    request id, which names the line), good lines never lost; the counts add up; no job
    of the batch is left queued or running without its cancel recorded."""
    from api.control.batch_ids import line_of_job
    from worker.store.crud.batches import get_batch
    from worker.store.models import Job

    with env.ctx.session_factory() as s:
        batch = get_batch(session=s, batch_id=batch_id)
        jobs = s.query(Job).filter(Job.batch_id == batch_id).all()
    out = _file_lines(env, batch.output_file_id)
    err = _file_lines(env, batch.error_file_id)
    seen = [line_of_job(x["response"]["request_id"]) for x in out + err]
    expected = [i for i, x in enumerate(lines, start=1) if x != ""]
    assert sorted(seen) == expected, (seen, expected)
    custom_ids = [x["custom_id"] for x in out + err if x["custom_id"] is not None]
    assert len(custom_ids) == len(set(custom_ids)), custom_ids
    assert batch.request_total == len(expected)
    assert batch.request_completed + batch.request_failed == len(expected)
    codes = {line_of_job(x["response"]["request_id"]): x["error"]["code"] for x in err}
    assert codes[2] == "invalid_json"
    unfinished = [x["custom_id"] for x in err if x["error"]["code"] == code]
    assert unfinished, err
    stray = [j.id for j in jobs
             if j.status in ("queued", "running") and j.cancel_requested_at is None]
    assert stray == [], f"jobs of the {batch.status} batch left to run: {stray}"
    from api.control.staging import staging_path

    assert not staging_path(env.ctx, batch_id).exists()  # no orphan staging file


def test_expiry_in_the_middle_of_an_expansion(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The beat expires the batch while its expansion is between two chunks; the
    expansion then goes on: the lines it had not read yet are expired errors."""
    from api.control import expand
    from api.control.maintenance import expire_batches

    env = make_env(expand_chunk=2)
    lines = _input(7)
    bid = _batch(env, lines)
    _past_window(env, bid)
    real = expand._commit_chunk
    expired: list[list[str]] = []

    def expire_after_first(*a: Any, **kw: Any) -> bool:
        go_on = real(*a, **kw)
        if not expired:
            expired.append(expire_batches(env.ctx))
        return go_on

    monkeypatch.setattr(expand, "_commit_chunk", expire_after_first)
    expand.expand_batch(env.ctx, batch_id=bid)
    assert expired == [[bid]]
    with env.ctx.session_factory() as s:
        from worker.store.crud.batches import get_batch

        assert get_batch(session=s, batch_id=bid).status == "expired"
    _assert_each_line_once(env, bid, lines, "batch_expired")


def test_chunk_committed_while_the_expiry_runs_never_runs(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An expansion resumes after the expiry cancelled the batch's jobs and before the
    expiry's finalize: whatever it commits then must not be left queued (on the old code
    it was: orphans a worker would run, of a batch already expired)."""
    from api.control import expand, maintenance
    from worker.store.crud.batches import get_batch

    env = make_env(expand_chunk=2)
    lines = _input(7)
    bid = _batch(env, lines)
    _expand_one_chunk(env, bid, monkeypatch)
    _past_window(env, bid)
    real_finalize = maintenance.finalize_batch

    def expansion_then_finalize(ctx: Any, **kw: Any) -> str:
        expand.expand_batch(ctx, batch_id=kw["batch_id"])
        return real_finalize(ctx, **kw)

    monkeypatch.setattr(maintenance, "finalize_batch", expansion_then_finalize)
    assert maintenance.expire_batches(env.ctx) == [bid]
    with env.ctx.session_factory() as s:
        assert get_batch(session=s, batch_id=bid).status == "expired"
    _assert_each_line_once(env, bid, lines, "batch_expired")


def test_expiry_of_a_batch_still_validating(make_env: Any) -> None:
    """No line read yet: every line is an expired error (none lost)."""
    from api.control.maintenance import expire_batches

    env = make_env(expand_chunk=2)
    lines = _input(3)
    bid = _batch(env, lines)
    _past_window(env, bid)
    assert expire_batches(env.ctx) == [bid]
    from worker.store.crud.batches import get_batch

    with env.ctx.session_factory() as s:
        batch = get_batch(session=s, batch_id=bid)
    err = _file_lines(env, batch.error_file_id)
    assert batch.status == "expired" and len(err) == 6
    assert {x["error"]["code"] for x in err} == {"batch_expired"}
    by_line = {x["response"]["request_id"]: x["custom_id"] for x in err}
    from api.control.batch_ids import line_job_id

    assert by_line[line_job_id(bid, 1)] == "x-0"
    assert by_line[line_job_id(bid, 2)] is None  # bad JSON: no custom_id to name


def test_cancel_in_the_middle_of_an_expansion(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a cancel: the unread lines are cancelled errors."""
    from api.control import expand

    env = make_env(expand_chunk=2)
    lines = _input(7)
    bid = _batch(env, lines)
    _expand_one_chunk(env, bid, monkeypatch)
    h = env.auth(TENANT)
    r = env.client.post(f"/v1/batches/{bid}/cancel", headers=h)
    assert r.status_code == 200, r.text
    assert env.app.state.dispatcher.wait_idle(30)
    assert expand.expand_batch(env.ctx, batch_id=bid) == "cancelled"
    assert env.client.get(f"/v1/batches/{bid}", headers=h).json()["status"] == "cancelled"
    _assert_each_line_once(env, bid, lines, "batch_cancelled")


def test_retry_of_an_expired_batch_takes_its_unread_lines(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry takes exactly the lines of the error file, the unread ones included."""
    from api.control.maintenance import expire_batches

    env = make_env(expand_chunk=2)
    lines = _input(5)
    bid = _batch(env, lines)
    _expand_one_chunk(env, bid, monkeypatch)
    _past_window(env, bid)
    assert expire_batches(env.ctx) == [bid]
    h = env.auth(TENANT)
    r = env.client.post(f"/v1/batches/{bid}/retry", headers=h)
    assert r.status_code == 200, r.text
    content = env.client.get(f"/v1/files/{r.json()['input_file_id']}/content", headers=h).text
    retried = [x for x in content.splitlines() if x.strip()]
    assert len(retried) == 8  # 5 good, the 3 invalid ones, no blank
    assert retried[1] == "{not json" and retried[3] == "[1]"
    ids = [json.loads(x)["custom_id"] for x in retried if x not in ("{not json", "[1]")]
    assert ids == ["x-0", "x-1", "x-2", "x-3", "x-4", "bad-field"]
