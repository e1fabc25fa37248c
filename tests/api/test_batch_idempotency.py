"""Idempotency-Key on POST /v1/batches (issue 29, item 7): a repeat answers the batch the
first request created and creates nothing; the same key with another request is a 409;
keys are per tenant; concurrent first requests create one batch."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import func, select

from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded

pytestmark = pytest.mark.services


def _upload(env: ApiEnv, h: dict[str, str], n: int = 2) -> str:
    r = env.client.post(
        "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", jsonl(batch_lines(n)), "application/jsonl")},
        headers=h,
    )
    assert r.status_code == 200, r.text
    return r.json()["id"]


def _post(env: ApiEnv, h: dict[str, str], key: str | None, **body: Any) -> Any:
    headers = {**h, "Idempotency-Key": key} if key is not None else h
    return env.client.post(
        "/v1/batches", json={"endpoint": "/v1/completions", **body}, headers=headers
    )


def _batches(env: ApiEnv, tenant: str) -> int:
    from worker.store.models import Batch

    with env.ctx.session_factory() as s:
        return s.scalar(select(func.count()).select_from(Batch).where(Batch.tenant == tenant))


def _count_expansions(env: ApiEnv, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The batch ids expansion tasks are sent for, from now on."""
    dispatcher = env.app.state.dispatcher
    sent: list[str] = []
    real = dispatcher.submit

    def submit(name: str, *args: Any, **kw: Any) -> Any:
        if name == "inflight.expand_batch":
            sent.append(args[0])
        return real(name, *args, **kw)

    monkeypatch.setattr(dispatcher, "submit", submit)
    return sent


def _error(resp: Any, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == code, err
    return err


def test_replay_answers_the_first_batch_and_creates_nothing(
    env: ApiEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = env.auth("t-bidem")
    fid = _upload(env, h)
    sent = _count_expansions(env, monkeypatch)
    body = {"input_file_id": fid, "metadata": {"a": "1"},
            "output_expires_after": {"anchor": "created_at", "seconds": 7200}}
    first = _post(env, h, "bk-1", **body)
    assert first.status_code == 200, first.text
    assert "Idempotent-Replayed" not in first.headers
    wait_expanded(env, h, first.json()["id"])
    # the same request (the default completion_window spelled out is the same request)
    again = _post(env, h, "bk-1", completion_window="24h", **body)
    assert again.status_code == 200, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["request_counts"]["total"] == 2  # the batch as it is now
    assert _batches(env, "t-bidem") == 1
    assert sent == [first.json()["id"]]  # one expansion task
    # without a key every POST is a new batch
    plain = _post(env, h, None, **body)
    assert plain.status_code == 200 and plain.json()["id"] != first.json()["id"]
    assert "Idempotent-Replayed" not in plain.headers
    assert _batches(env, "t-bidem") == 2


def test_same_key_different_request_is_refused(env: ApiEnv) -> None:
    h = env.auth("t-bidem-diff")
    fid, other_fid = _upload(env, h), _upload(env, h)
    first = _post(env, h, "bk-2", input_file_id=fid, metadata={"a": "1"})
    assert first.status_code == 200, first.text
    for changed in (
        {"input_file_id": other_fid, "metadata": {"a": "1"}},
        {"input_file_id": fid, "metadata": {"a": "2"}},
        {"input_file_id": fid, "metadata": {"a": "1"}, "completion_window": "48h"},
        {"input_file_id": fid, "metadata": {"a": "1"},
         "output_expires_after": {"anchor": "created_at", "seconds": 3600}},
    ):
        err = _error(_post(env, h, "bk-2", **changed), 409, "idempotency_key_reused")
        assert err["param"] == "Idempotency-Key"
        assert "already used with a different request" in err["message"]
    chat = env.client.post(
        "/v1/batches",
        json={"input_file_id": fid, "endpoint": "/v1/chat/completions", "metadata": {"a": "1"}},
        headers={**h, "Idempotency-Key": "bk-2"},
    )
    _error(chat, 409, "idempotency_key_reused")
    assert _batches(env, "t-bidem-diff") == 1


def test_keys_are_per_tenant(env: ApiEnv) -> None:
    ha, hb = env.auth("t-bidem-a"), env.auth("t-bidem-b")
    fa, fb = _upload(env, ha), _upload(env, hb)
    a = _post(env, ha, "shared", input_file_id=fa)
    b = _post(env, hb, "shared", input_file_id=fb)
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    assert a.json()["id"] != b.json()["id"]
    assert "Idempotent-Replayed" not in b.headers
    assert _batches(env, "t-bidem-a") == 1 and _batches(env, "t-bidem-b") == 1
    # b's key does not answer a's batch even with a's body: a's file is not b's (404)
    _error(_post(env, hb, "other", input_file_id=fa), 404, "not_found")


def test_key_length_is_limited(env: ApiEnv) -> None:
    h = env.auth("t-bidem-len")
    fid = _upload(env, h)
    assert _post(env, h, "k" * 255, input_file_id=fid).status_code == 200
    too_long = _post(env, h, "k" * 256, input_file_id=fid)
    assert 400 <= too_long.status_code < 500, too_long.text
    assert _batches(env, "t-bidem-len") == 1


def test_concurrent_first_requests_create_one_batch(
    env: ApiEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = env.auth("t-bidem-race")
    fid = _upload(env, h)
    sent = _count_expansions(env, monkeypatch)
    n = 6
    barrier = threading.Barrier(n)
    answers: list[Any] = [None] * n

    def go(i: int) -> None:
        barrier.wait()
        answers[i] = _post(env, h, "race", input_file_id=fid)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(a is not None and a.status_code == 200 for a in answers), [
        a.text if a is not None else None for a in answers
    ]
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == n - 1
    assert _batches(env, "t-bidem-race") == 1
    assert len(sent) == 1


def test_a_winner_committed_after_the_checks_is_answered(
    env: ApiEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unique constraint is the last word: a concurrent request's batch committed after
    both checks makes the insert fail, and the loser answers the winner's batch."""
    import api.routers.batches as batches_route
    from api.schemas import BatchCreate
    from worker.store.crud.batches import create_batch

    h = env.auth("t-bidem-late")
    fid = _upload(env, h)
    sent = _count_expansions(env, monkeypatch)
    body = {"input_file_id": fid, "endpoint": "/v1/completions"}
    digest = batches_route._digest(BatchCreate.model_validate(body))
    winner: list[str] = []
    real_quota = batches_route.check_batch_quota

    def quota_then_winner(*args: Any, **kw: Any) -> Any:
        if not winner:  # another request commits its batch with the key just now
            with env.ctx.session_factory.begin() as s:
                b = create_batch(session=s, tenant="t-bidem-late", endpoint="/v1/completions",
                                 input_file_id=fid, idempotency_key="late",
                                 request_digest=digest)
                winner.append(b.id)
        return real_quota(*args, **kw)

    monkeypatch.setattr(batches_route, "check_batch_quota", quota_then_winner)
    r = env.client.post("/v1/batches", json=body, headers={**h, "Idempotency-Key": "late"})
    assert r.status_code == 200, r.text
    assert r.headers["Idempotent-Replayed"] == "true"
    assert r.json()["id"] == winner[0]
    assert _batches(env, "t-bidem-late") == 1
    assert sent == []  # the loser sends no expansion
