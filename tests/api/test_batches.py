"""Files and batches without a worker (job results written through the store): expansion
with invalid lines, request counts, finalization in input order, cancel, expiry, resume."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded
from tests.jsonl import read_jsonl
from tests.service.helpers import batch_length
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services


def _upload(env: ApiEnv, h: dict[str, str], data: bytes) -> dict:
    r = env.client.post(
        "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", data, "application/jsonl")},
        headers=h,
    )
    assert r.status_code == 200, r.text
    return r.json()


def _create(env: ApiEnv, h: dict[str, str], file_id: str, **kw) -> dict:
    r = env.client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/completions", **kw},
        headers=h,
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "validating", r.text  # answers at once, expands in background
    return wait_expanded(env, h, r.json()["id"])


def _finish(env: ApiEnv, batch_id: str, *, fail: set[str] = frozenset(),
            choices: dict[str, list[dict]] | None = None) -> None:
    """Write every job's result as a worker would: failed for ``fail``, else succeeded, with
    the stored samples of ``choices`` (by custom_id) or, like rows from before, none."""
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    choices = choices or {}

    with env.ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch_id, limit=10_000)
        results = [
            JobResult(job_id=j.id, status="failed", error="engine exploded")
            if j.custom_id in fail
            else JobResult(
                job_id=j.id,
                status="succeeded",
                text=f"out:{j.custom_id}",
                finish_reason="length",
                prompt_tokens=5,
                completion_tokens=4,
                choices=choices.get(j.custom_id or ""),
            )
            for j in jobs
        ]
        finish_jobs(session=s, results=results, worker_id="fake")


def _lines(env: ApiEnv, h: dict[str, str], file_id: str | None) -> list[dict]:
    assert file_id
    r = env.client.get(f"/v1/files/{file_id}/content", headers=h)
    assert r.status_code == 200
    return read_jsonl(r.text)


def test_file_upload_and_content(env: ApiEnv) -> None:
    h = env.auth("t-files")
    data = jsonl(batch_lines(3))
    f = _upload(env, h, data)
    assert f["object"] == "file" and f["bytes"] == len(data) and f["purpose"] == "batch"
    assert env.client.get(f"/v1/files/{f['id']}/content", headers=h).content == data
    bad = env.client.post(
        "/v1/files", data={"purpose": "fine-tune"}, files={"file": ("x.jsonl", data)}, headers=h
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "purpose"
    empty = env.client.post(
        "/v1/files", data={"purpose": "batch"}, files={"file": ("x.jsonl", b"")}, headers=h
    )
    assert empty.status_code == 400


def test_upload_size_limit(make_env) -> None:
    env = make_env(max_file_bytes=2000)
    r = env.client.post(
        "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("big.jsonl", b"x" * 5000)},
        headers=env.auth("t-big"),
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_batch_lifecycle_with_invalid_lines(make_env) -> None:
    env = make_env(expand_chunk=4)  # several chunks
    h = env.auth("t-batch")
    good = batch_lines(10)
    lines: list = [
        *good[:3],
        "{not json",
        good[3],
        {**good[4], "custom_id": "r-0"},  # dup id
        *good[5:7],
        {
            "custom_id": "x",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "p", "bogus": 1},
        },
        "",
        *good[7:],
        {
            "custom_id": "chat",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}]},
        },
    ]
    f = _upload(env, h, jsonl(lines))
    batch = _create(env, h, f["id"], metadata={"k": "v"})
    assert batch["status"] == "in_progress" and batch["metadata"] == {"k": "v"}
    assert batch["request_counts"] == {"total": 13, "completed": 0, "failed": 4}
    ids = [f"r-{i}" for i in range(10) if i != 4]  # r-4's line carries a duplicate id
    assert 0 <= batch["expires_at"] - batch["created_at"] - 24 * 3600 <= 1
    jobs = env.client.get(
        "/v1/jobs", params={"batch_id": batch["id"], "limit": 100}, headers=h
    ).json()["data"]
    assert [j["custom_id"] for j in jobs] == ids
    assert batch_length(env.ctx.redis, env.ctx.keys) == 9
    _finish(env, batch["id"], fail={"r-5"})
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 13, "completed": 8, "failed": 5}
    assert done["completed_at"] and done["finalizing_at"]
    out = _lines(env, h, done["output_file_id"])
    assert [x["custom_id"] for x in out] == [i for i in ids if i != "r-5"]
    first = out[0]
    assert first["error"] is None and first["response"]["status_code"] == 200
    body = first["response"]["body"]
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "out:r-0"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    errs = _lines(env, h, done["error_file_id"])
    # input order: line 4 (bad JSON), line 6 (dup), r-5 (line 7), line 9 (bogus), chat (last)
    assert [e["custom_id"] for e in errs] == [None, "r-0", "r-5", "x", "chat"]
    assert "malformed JSON" in errs[0]["error"]["message"]
    assert errs[1]["error"]["code"] == "duplicate_custom_id"
    assert errs[2]["error"]["message"] == "engine exploded"
    assert "bogus" in errs[3]["error"]["message"]
    assert "differs from the batch's endpoint" in errs[4]["error"]["message"]
    listed = env.client.get("/v1/batches", headers=h).json()
    assert listed["data"][0]["id"] == batch["id"] and not listed["has_more"]
    # cancelling a finished batch is refused
    assert env.client.post(f"/v1/batches/{batch['id']}/cancel", headers=h).status_code == 400


def test_batch_output_carries_every_stored_sample_and_logprobs(env: ApiEnv) -> None:
    """A line with n=2 and logprobs is queued like any other; its output line carries both
    samples as the worker stored them (token ids, stop reason, logprobs in the completions
    shape); lines stored without samples (rows from before) still read from their text."""
    from worker.protocol.openai_batch import LogprobInfo, Sample, stored_choice

    h = env.auth("t-batch-n")
    good = batch_lines(2)
    many = {**good[1], "custom_id": "many", "body": {**good[1]["body"], "n": 2, "logprobs": 1}}
    f = _upload(env, h, jsonl([good[0], many, good[1]]))
    batch = _create(env, h, f["id"])
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    samples = [
        Sample("a b", "length", [LogprobInfo("a", -0.5, [("a", -0.5)]),
                                      LogprobInfo(" b", -1.25, [(" b", -1.25)])], [7, 8]),
        Sample("c", "stop", [LogprobInfo("c", -0.1, [("c", -0.1)])], [9], stop_reason=2),
    ]
    _finish(env, batch["id"], choices={"many": [stored_choice(c) for c in samples]})
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "completed", done
    out = {x["custom_id"]: x["response"]["body"] for x in _lines(env, h, done["output_file_id"])}
    assert set(out) == {"r-0", "r-1", "many"}
    choices = out["many"]["choices"]
    assert [c["text"] for c in choices] == ["a b", "c"]
    assert [c["token_ids"] for c in choices] == [[7, 8], [9]] and choices[1]["stop_reason"] == 2
    assert choices[0]["logprobs"] == {"tokens": ["a", " b"], "token_logprobs": [-0.5, -1.25],
                                      "top_logprobs": [{"a": -0.5}, {" b": -1.25}], "text_offset": [0, 1]}
    assert [c["text"] for c in out["r-0"]["choices"]] == ["out:r-0"]  # a row without samples


def test_batch_validation(env: ApiEnv) -> None:
    h = env.auth("t-bval")
    f = _upload(env, h, jsonl(batch_lines(1)))
    for bad in (
        {"input_file_id": f["id"], "endpoint": "/v1/embeddings"},
        {"input_file_id": f["id"], "endpoint": "/v1/completions", "completion_window": "forever"},
        {"endpoint": "/v1/completions"},
    ):
        r = env.client.post("/v1/batches", json=bad, headers=h)
        assert r.status_code == 400 and r.json()["error"]["message"], r.text
    r = env.client.post(
        "/v1/batches", json={"input_file_id": "file-nope", "endpoint": "/v1/completions"}, headers=h
    )
    assert r.status_code == 404
    only_bad = _upload(env, h, b"{oops\n")
    failed = _create(env, h, only_bad["id"])
    failed = env.client.get(f"/v1/batches/{failed['id']}", headers=h).json()
    assert failed["status"] == "completed" and failed["request_counts"]["failed"] == 1
    assert failed["output_file_id"] is None and failed["error_file_id"]


def test_cancel_batch(env: ApiEnv) -> None:
    from worker.store.crud.job_status import start_jobs
    from worker.store.crud.jobs import list_jobs

    h = env.auth("t-cancel")
    batch = _create(env, h, _upload(env, h, jsonl(batch_lines(5)))["id"])
    with env.ctx.session_factory.begin() as s:
        first = list_jobs(session=s, batch_id=batch["id"], limit=1)[0].id
        start_jobs(session=s, job_ids=[first], worker_id="w")
    r = env.client.post(f"/v1/batches/{batch['id']}/cancel", headers=h).json()
    assert r["status"] == "cancelling" and r["cancelling_at"]
    assert env.ctx.redis.sismember(env.ctx.keys.cancels, first)
    # the worker aborts the running one
    from worker.store.crud.job_status import finish_jobs

    with env.ctx.session_factory.begin() as s:
        finish_jobs(
            session=s, results=[JobResult(job_id=first, status="cancelled", finish_reason="abort")]
        )
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "cancelled" and done["cancelled_at"]
    assert done["request_counts"] == {"total": 5, "completed": 0, "failed": 5}
    errs = _lines(env, h, done["error_file_id"])
    assert [e["error"]["code"] for e in errs] == ["batch_cancelled"] * 5


def test_expire_batch(env: ApiEnv) -> None:
    from api.control.maintenance import expire_batches
    from worker.store.base import utcnow
    from worker.store.crud.batches import get_batch

    h = env.auth("t-exp")
    batch = _create(env, h, _upload(env, h, jsonl(batch_lines(3)))["id"], completion_window="1h")
    with env.ctx.session_factory.begin() as s:
        get_batch(session=s, batch_id=batch["id"]).expires_at = utcnow() - timedelta(seconds=1)
    assert batch["id"] in expire_batches(env.ctx)
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "expired" and done["expired_at"]
    errs = _lines(env, h, done["error_file_id"])
    assert [e["error"]["code"] for e in errs] == ["batch_expired"] * 3


def test_expansion_resumes_without_duplicates(make_env) -> None:
    from api.control.expand import expand_batch
    from worker.store.crud.batch_admin import get_progress
    from worker.store.crud.batches import create_batch
    from worker.store.crud.jobs import count_by_status

    env = make_env(expand_chunk=3)
    h = env.auth("t-resume")
    f = _upload(env, h, jsonl(batch_lines(7)))
    with env.ctx.session_factory.begin() as s:
        b = create_batch(
            session=s, tenant="t-resume", endpoint="/v1/completions", input_file_id=f["id"]
        )
        bid = b.id
    # pretend a previous run committed the first chunk and then died
    with env.ctx.session_factory.begin() as s:
        get_progress(session=s, batch_id=bid)
    expand_batch(env.ctx, batch_id=bid)
    with env.ctx.session_factory.begin() as s:
        p = get_progress(session=s, batch_id=bid)
        p.expanded = 0
        p.lines_read = 3
    assert expand_batch(env.ctx, batch_id=bid) == "in_progress"
    with env.ctx.session_factory() as s:
        assert count_by_status(session=s, batch_id=bid) == {"queued": 7}


def test_expansion_lease_tells_live_from_dead(env: ApiEnv) -> None:
    from api.control.expand import expand_batch
    from api.control.maintenance import stalled_expansion_ids
    from worker.store.base import utcnow
    from worker.store.crud.batch_admin import get_progress
    from worker.store.crud.batches import create_batch
    from worker.store.crud.expansion import claim_expansion

    h = env.auth("t-lease")
    f = _upload(env, h, jsonl(batch_lines(3)))
    with env.ctx.session_factory.begin() as s:
        bid = create_batch(
            session=s, tenant="t-lease", endpoint="/v1/completions", input_file_id=f["id"]
        ).id
    assert bid in stalled_expansion_ids(env.ctx)  # never started
    ttl = timedelta(seconds=60)
    with env.ctx.session_factory.begin() as s:
        assert claim_expansion(session=s, batch_id=bid, owner="a", ttl=ttl) == "claimed"
    assert bid not in stalled_expansion_ids(env.ctx)  # live: nobody resumes it
    assert expand_batch(env.ctx, batch_id=bid) == "busy"
    with env.ctx.session_factory.begin() as s:
        get_progress(session=s, batch_id=bid).lease_until = utcnow() - timedelta(seconds=1)
    assert bid in stalled_expansion_ids(env.ctx)  # "a" died: its lease expired
    assert expand_batch(env.ctx, batch_id=bid) == "in_progress"
    with env.ctx.session_factory() as s:
        p = get_progress(session=s, batch_id=bid)
        assert p.expanded == 1 and p.lease_owner is None and p.lines_read == 3
    assert bid not in stalled_expansion_ids(env.ctx)
