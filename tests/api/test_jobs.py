"""Jobs: auth, submit / get / list / cancel, idempotency, limits and error shapes,
tenant isolation, health and metrics."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.api.conftest import OPERATOR_KEY, ApiEnv

pytestmark = pytest.mark.services

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}


def _is_openai_error(resp, status: int, *, code: str | None = None, param: str | None = None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


def test_auth(env: ApiEnv) -> None:
    c = env.client
    _is_openai_error(c.get("/v1/jobs"), 401, code="invalid_api_key")
    _is_openai_error(c.get("/v1/jobs", headers={"Authorization": "Bearer nope"}), 401)
    _is_openai_error(c.get("/v1/jobs", headers={"Authorization": "Basic abc"}), 401)
    assert c.get("/v1/jobs", headers=env.auth("t-auth")).status_code == 200


def test_submit_get_list_cancel(env: ApiEnv) -> None:
    c, h = env.client, env.auth("t-jobs")
    r = c.post("/v1/jobs", json={**CHAT, "priority": 3, "custom_id": "a"}, headers=h)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "queued" and job["endpoint"] == "/v1/chat/completions"
    assert job["priority"] == 3 and job["custom_id"] == "a" and job["result"] is None
    assert job["timeline"]["queued_at"] and job["timeline"]["started_at"] is None
    # the job went onto the interactive stream
    entries = env.ctx.redis.xrange(env.ctx.keys.stream("interactive"))
    assert [e[1]["job_id"] for e in entries] == [job["id"]]
    got = c.get(f"/v1/jobs/{job['id']}", headers=h).json()
    assert got["id"] == job["id"] and got["status"] == "queued"
    ids = [
        c.post("/v1/jobs", json={"prompt": f"p{i}", "max_tokens": 2}, headers=h).json()["id"]
        for i in range(4)
    ]
    page1 = c.get("/v1/jobs", params={"limit": 3}, headers=h).json()
    page2 = c.get("/v1/jobs", params={"limit": 3, "after": page1["last_id"]}, headers=h).json()
    assert page1["has_more"] and not page2["has_more"]
    assert [j["id"] for j in page1["data"] + page2["data"]] == [job["id"], *ids]
    assert (page1["first_id"], page1["last_id"]) == (job["id"], ids[1])
    assert (page2["first_id"], page2["last_id"]) == (ids[2], ids[3])
    cancelled = c.delete(f"/v1/jobs/{job['id']}", headers=h).json()
    assert cancelled["status"] == "cancelled"
    listed = c.get("/v1/jobs", params={"status": "cancelled"}, headers=h).json()["data"]
    assert [j["id"] for j in listed] == [job["id"]]
    assert c.get("/v1/jobs", params={"status": "bogus"}, headers=h).status_code == 400


def test_cancel_running_job_signals_worker(env: ApiEnv) -> None:
    from worker.store.crud.job_status import start_jobs

    c, h = env.client, env.auth("t-run")
    job = c.post("/v1/jobs", json=CHAT, headers=h).json()
    with env.ctx.session_factory.begin() as s:
        start_jobs(session=s, job_ids=[job["id"]], worker_id="w1")
    r = c.delete(f"/v1/jobs/{job['id']}", headers=h).json()
    assert r["status"] == "running"  # the worker aborts it between steps
    assert env.ctx.redis.sismember(env.ctx.keys.cancels, job["id"])


def test_idempotency_key(env: ApiEnv) -> None:
    c, h = env.client, env.auth("t-idem")
    first = c.post("/v1/jobs", json=CHAT, headers={**h, "Idempotency-Key": "k1"})
    again = c.post("/v1/jobs", json=CHAT, headers={**h, "Idempotency-Key": "k1"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    body_key = c.post("/v1/jobs", json={**CHAT, "idempotency_key": "k1"}, headers=h)
    assert body_key.json()["id"] == first.json()["id"]
    _is_openai_error(
        c.post("/v1/jobs", json={**CHAT, "max_tokens": 9}, headers={**h, "Idempotency-Key": "k1"}),
        409,
        code="idempotency_key_reused",
    )
    # keys are per tenant
    other = c.post("/v1/jobs", json=CHAT, headers={**env.auth("t-idem2"), "Idempotency-Key": "k1"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert len(env.ctx.redis.xrange(env.ctx.keys.stream("interactive"))) == 2


def test_validation_errors(make_env) -> None:
    env = make_env(max_body_bytes=4096, max_prompt_tokens=100, max_tokens_limit=64)
    c, h = env.client, env.auth("t-val")
    _is_openai_error(
        c.post("/v1/jobs", json={**CHAT, "bogus": 1}, headers=h),
        400,
        code="unknown_field",
        param="bogus",
    )
    _is_openai_error(
        c.post("/v1/jobs", json={**CHAT, "max_tokens": 65}, headers=h), 400, param="max_tokens"
    )
    _is_openai_error(c.post("/v1/jobs", json={**CHAT, "max_tokens": 0}, headers=h), 400)
    _is_openai_error(c.post("/v1/jobs", json={**CHAT, "temperature": -1}, headers=h), 400)
    _is_openai_error(
        c.post("/v1/jobs", json={"prompt": "x " * 300, "max_tokens": 2}, headers=h),
        400,
        code="prompt_too_long",
    )
    _is_openai_error(
        c.post("/v1/jobs", json={**CHAT, "stream": True}, headers=h), 400, param="stream"
    )
    _is_openai_error(c.post("/v1/jobs", json={"max_tokens": 3}, headers=h), 400)
    _is_openai_error(
        c.post("/v1/jobs", json={**CHAT, "priority": "high"}, headers=h), 400, param="priority"
    )
    _is_openai_error(
        c.post("/v1/jobs", content=b"{not json", headers={**h, "Content-Type": "application/json"}),
        400,
    )
    _is_openai_error(
        c.post("/v1/jobs", json={"prompt": "y" * 5000}, headers=h), 413, code="body_too_large"
    )
    _is_openai_error(
        c.post("/v1/jobs", json={**CHAT, "callback_url": "ftp://x"}, headers=h),
        400,
        param="callback_url",
    )
    _is_openai_error(c.post("/v1/jobs", json={**CHAT, "custom_id": "a\x00"}, headers=h), 400)
    _is_openai_error(c.get("/v1/jobs/job_%00", headers=h), 404)  # never reaches SQL
    assert c.get("/v1/jobs", headers=h).json()["data"] == []
    nul = c.post("/v1/jobs", json={"prompt": "a\x00b", "max_tokens": 2}, headers=h)
    _is_openai_error(nul, 400)  # PostgreSQL text cannot hold NUL: refused, not mangled


def test_n_is_accepted_up_to_its_bound(env: ApiEnv) -> None:
    """n > 1 goes through the queue (the store keeps every sample); above the bound: 400."""
    c, h = env.client, env.auth("t-n")
    for body in ({**CHAT, "n": 2}, {"prompt": "p", "max_tokens": 2, "n": 3}):
        assert c.post("/v1/jobs", json=body, headers=h).status_code == 201
    _is_openai_error(c.post("/v1/jobs", json={**CHAT, "n": 10_000}, headers=h), 400, param="n")
    assert len(c.get("/v1/jobs", headers=h).json()["data"]) == 2


def test_jobs_cli_counts_only_the_tenant(env: ApiEnv, capsys: pytest.CaptureFixture) -> None:
    """``inflight jobs --tenant T``: the status counts at the bottom cover T only."""
    import argparse
    import uuid

    from cli import jobs_cmd
    from worker.store.crud.jobs import count_by_status

    mine, other = f"t-cli-{uuid.uuid4().hex[:8]}", f"t-cli-{uuid.uuid4().hex[:8]}"
    hm, ho = env.auth(mine), env.auth(other)
    ids = [env.client.post("/v1/jobs", json=CHAT, headers=hm).json()["id"] for _ in range(2)]
    for _ in range(3):
        assert env.client.post("/v1/jobs", json=CHAT, headers=ho).status_code == 201
    assert env.client.delete(f"/v1/jobs/{ids[0]}", headers=hm).json()["status"] == "cancelled"
    with env.ctx.session_factory() as s:
        assert count_by_status(session=s, tenant=mine) == {"cancelled": 1, "queued": 1}
        assert count_by_status(session=s, tenant=other) == {"queued": 3}
        everyone = count_by_status(session=s)
        assert everyone["queued"] >= 4 and everyone["cancelled"] >= 1

    parser = argparse.ArgumentParser()
    jobs_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["jobs", "--tenant", mine, "--database-url", env.settings.database_url]
    )
    capsys.readouterr()
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split()[0] for line in lines[1:-1]) == sorted(ids)
    assert lines[-1] == "cancelled=1  queued=1"


def _seed_ties(env: ApiEnv, tenant: str, groups: int, per_group: int, **job: Any) -> list[str]:
    """``groups`` x ``per_group`` jobs of ``tenant`` straight into the store, the jobs of a
    group sharing one queued_at (their ids decide the order); the ids in queue order."""
    from worker.store.crud.job_status import create_jobs
    from worker.store.schemas import NewJob

    start = datetime(2026, 3, 1, tzinfo=timezone.utc)
    ordered: list[str] = []
    with env.ctx.session_factory.begin() as s:
        for g in range(groups):
            new = [NewJob(request={"url": "/v1/completions", "body": {"prompt": "p"}},
                          tenant=tenant, **job) for _ in range(per_group)]
            ordered += sorted(create_jobs(session=s, jobs=new, now=start + timedelta(seconds=g)))
    return ordered


def _walk_api(env: ApiEnv, headers: dict[str, str], **params: Any) -> list[str]:
    """Every id ``GET /v1/jobs`` lists, following ``last_id`` while ``has_more``; checks
    each page's ``first_id`` / ``last_id`` against its data."""
    seen: list[str] = []
    while True:
        cursor = {"after": seen[-1]} if seen else {}
        r = env.client.get("/v1/jobs", params={**params, **cursor}, headers=headers)
        assert r.status_code == 200, r.text
        page = r.json()
        ids = [j["id"] for j in page["data"]]
        assert (page["first_id"], page["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
        seen += ids
        assert len(seen) < 1000, "the walk does not end"  # the seeds are far fewer
        if not page["has_more"]:
            return seen


def test_listing_walks_ties_once_in_order_with_filters(env: ApiEnv) -> None:
    """Paging with ``after`` lists every job exactly once, in queue order, also where many
    share one queued_at; status and batch filters combine with the cursor."""
    from worker.store.crud.batches import create_batch
    from worker.store.crud.job_status import start_jobs

    mine, other = f"t-keys-{uuid.uuid4().hex[:8]}", f"t-keys-{uuid.uuid4().hex[:8]}"
    with env.ctx.session_factory.begin() as s:
        batch_id = create_batch(session=s, tenant=mine, endpoint="/v1/completions").id
    plain = _seed_ties(env, mine, groups=3, per_group=6)
    batched = _seed_ties(env, mine, groups=2, per_group=4, batch_id=batch_id)
    _seed_ties(env, other, groups=3, per_group=5)  # the same instants, another tenant
    with env.ctx.session_factory.begin() as s:
        start_jobs(session=s, job_ids=plain[::4] + batched[1:2], worker_id="w-keys")
    with env.ctx.session_factory() as s:  # the expected order, from the stored instants
        from worker.store.models import Job

        key = {j.id: (j.queued_at, j.id) for j in s.query(Job).filter(Job.tenant == mine)}
    everything = sorted(key, key=key.__getitem__)
    assert len(everything) == len(plain) + len(batched) == 26
    h = env.auth(mine)
    for limit in (1, 5, 6, 26, 1000):
        assert _walk_api(env, h, limit=limit) == everything
    assert _walk_api(env, h, limit=2, status="running") == sorted(
        plain[::4] + batched[1:2], key=key.__getitem__
    )
    assert _walk_api(env, h, limit=3, batch_id=batch_id) == batched
    assert _walk_api(env, h, limit=3, batch_id=batch_id, status="queued") == [
        i for i in batched if i != batched[1]
    ]
    last = env.client.get("/v1/jobs", params={"after": everything[-1]}, headers=h).json()
    assert (last["data"], last["first_id"], last["last_id"], last["has_more"]) == (
        [], None, None, False
    )


def test_listing_cursor_must_be_the_tenants_own_job(env: ApiEnv) -> None:
    """Another tenant's job id as ``after`` answers exactly what an unknown id does (as a
    batch cursor does), so no tenant can probe another's ids."""
    c, ha, hb = env.client, env.auth("t-cur-a"), env.auth("t-cur-b")
    theirs = c.post("/v1/jobs", json=CHAT, headers=hb).json()["id"]
    unknown = "job_" + "0" * 32

    def refusal(job_id: str) -> dict[str, Any]:
        return _is_openai_error(
            c.get("/v1/jobs", params={"after": job_id}, headers=ha), 404, code="not_found",
            param="after",
        )

    assert refusal(theirs) == {**refusal(unknown), "message": f"No job with id {theirs!r}"}
    assert refusal(unknown)["message"] == f"No job with id {unknown!r}"
    refusal("job_%00")  # never reaches SQL
    assert c.get("/v1/jobs", params={"after": theirs}, headers=hb).status_code == 200
    # the batch cursor answers the same shape for the same probe
    batch_err = _is_openai_error(
        c.get("/v1/batches", params={"after": theirs}, headers=ha), 404, param="after"
    )
    assert {k: v for k, v in batch_err.items() if k != "message"} == {
        k: v for k, v in refusal(theirs).items() if k != "message"
    }


def test_listing_refuses_offset(env: ApiEnv) -> None:
    """``offset`` is gone: a request still sending it gets a 400 naming ``after`` instead of
    page 1 again."""
    c, h = env.client, env.auth("t-offset")
    c.post("/v1/jobs", json=CHAT, headers=h)
    for value in ("0", "3", "-1", ""):
        err = _is_openai_error(
            c.get("/v1/jobs", params={"offset": value, "limit": 1}, headers=h), 400,
            code="unsupported_field", param="offset",
        )
        assert "after" in err["message"]
    assert "offset" not in {
        p["name"] for p in c.get("/openapi.json").json()["paths"]["/v1/jobs"]["get"]["parameters"]
    }


def _cli(env: ApiEnv, capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, list[str]]:
    """Run ``inflight jobs ARGV`` on the test database; its exit status and stdout lines."""
    import argparse

    from cli import jobs_cmd

    parser = argparse.ArgumentParser()
    jobs_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["jobs", *argv, "--database-url", env.settings.database_url])
    capsys.readouterr()
    rc = args.func(args)
    return rc, capsys.readouterr().out.splitlines()


def test_jobs_cli_limit_0_prints_every_row(env: ApiEnv, capsys: pytest.CaptureFixture) -> None:
    """``inflight jobs --limit 0`` streams every matching row over several 1,000-row pages,
    ties included, in order and once each; ``--after`` and a positive ``--limit`` cut it."""
    from cli import jobs_cmd

    tenant = f"t-cli-all-{uuid.uuid4().hex[:8]}"
    ids = _seed_ties(env, tenant, groups=3, per_group=900)  # 2,700 rows: 3 pages
    _seed_ties(env, f"t-cli-other-{uuid.uuid4().hex[:8]}", groups=3, per_group=50)
    assert len(ids) > 2 * jobs_cmd.PAGE
    rc, lines = _cli(env, capsys, "--tenant", tenant, "--limit", "0", "--json")
    assert rc == 0 and [json.loads(line)["id"] for line in lines] == ids
    rc, lines = _cli(env, capsys, "--tenant", tenant, "--limit", "0")
    assert rc == 0 and [line.split()[0] for line in lines[1:-1]] == ids
    assert lines[0].split()[0] == "ID" and lines[-1] == f"queued={len(ids)}"
    rc, lines = _cli(env, capsys, "--tenant", tenant, "--limit", "0", "--json",
                     "--after", ids[1000])
    assert rc == 0 and [json.loads(line)["id"] for line in lines] == ids[1001:]
    rc, lines = _cli(env, capsys, "--tenant", tenant, "--limit", "1500", "--json")
    assert rc == 0 and [json.loads(line)["id"] for line in lines] == ids[:1500]
    assert _cli(env, capsys, "--tenant", tenant, "--after", "job_missing") == (1, [])
    with pytest.raises(SystemExit):
        _cli(env, capsys, "--limit", "-1")


def test_tenant_isolation(env: ApiEnv) -> None:
    from tests.api.conftest import batch_lines, jsonl

    c, ha, hb = env.client, env.auth("t-a"), env.auth("t-b")
    job = c.post("/v1/jobs", json=CHAT, headers=ha).json()
    f = c.post(
        "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", jsonl(batch_lines(2)))},
        headers=ha,
    ).json()
    batch = c.post(
        "/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/completions"}, headers=ha
    ).json()
    for path in (
        f"/v1/jobs/{job['id']}",
        f"/v1/files/{f['id']}",
        f"/v1/files/{f['id']}/content",
        f"/v1/batches/{batch['id']}",
    ):
        assert c.get(path, headers=ha).status_code == 200, path
        _is_openai_error(c.get(path, headers=hb), 404, code="not_found")
    _is_openai_error(c.delete(f"/v1/jobs/{job['id']}", headers=hb), 404)
    _is_openai_error(c.post(f"/v1/batches/{batch['id']}/cancel", headers=hb), 404)
    _is_openai_error(
        c.post(
            "/v1/batches",
            json={"input_file_id": f["id"], "endpoint": "/v1/completions"},
            headers=hb,
        ),
        404,
    )
    assert c.get("/v1/jobs", headers=hb).json()["data"] == []
    assert c.get("/v1/batches", headers=hb).json()["data"] == []
    assert c.get("/v1/files", headers=hb).json()["data"] == []
    assert c.get(f"/v1/jobs/{job['id']}", headers=ha).json()["status"] == "queued"


def test_health_metrics_workers(env: ApiEnv) -> None:
    from worker.store.crud.workers import register_worker

    c = env.client
    assert c.get("/healthz").json() == {"status": "ok"}
    ready = c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "redis": "ok"}
    with env.ctx.session_factory.begin() as s:
        register_worker(
            session=s, worker_id=f"w-{env.ctx.keys.prefix}", host="h", model="tiny", pid=1
        )
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    workers = c.get("/v1/workers", headers=operator).json()["data"]
    mine = [w for w in workers if w["id"] == f"w-{env.ctx.keys.prefix}"]
    assert mine and mine[0]["alive"] and mine[0]["model"] == "tiny"
    c.post("/v1/jobs", json=CHAT, headers=env.auth("t-w"))
    text = c.get("/metrics", headers=operator).text
    assert 'inflight_http_requests_total{method="POST",route="/v1/jobs",status="201"} 1' in text
    assert 'inflight_stream_length{model="tiny-llama",stream="interactive"} 1' in text
    assert "inflight_jobs{" in text and "inflight_workers_live" in text


def test_readyz_reports_redis_down(make_env) -> None:
    env = make_env(redis_url="redis://127.0.0.1:1/0")
    r = env.client.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"]["redis"].startswith("error")
