"""POST /v1/batches/{id}/retry (issue 29 part 6), through the API against the real
PostgreSQL and Redis: the new batch holds exactly the failed, cancelled and invalid lines
of the finished batch, in input order, with their custom_ids (job lines rebuilt from the
job rows, invalid lines copied byte for byte from the input file), links back with
``retry_of``, and its output joins the first batch's by custom_id; one run end to end by
a worker on the tiny model."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import pytest

from tests.api.conftest import REDIS_URL, ApiEnv, batch_lines, jsonl, wait_expanded
from tests.jsonl import read_jsonl
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services


def _upload(env: ApiEnv, h: dict[str, str], data: bytes) -> str:
    r = env.client.post("/v1/files", data={"purpose": "batch"},
                        files={"file": ("in.jsonl", data)}, headers=h)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def _batch(env: ApiEnv, h: dict[str, str], file_id: str, **kw) -> dict:
    r = env.client.post("/v1/batches", headers=h, json={
        "input_file_id": file_id, "endpoint": "/v1/completions", **kw})
    assert r.status_code == 200, r.text
    return wait_expanded(env, h, r.json()["id"])


def _finish(env: ApiEnv, batch_id: str, *, fail: set[str] = frozenset(),
            only: set[str] | None = None) -> None:
    """Write job results as a worker would: failed for ``fail``, else succeeded (only the
    jobs of ``only`` when given)."""
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    with env.ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch_id, limit=10_000)
        finish_jobs(session=s, worker_id="fake", results=[
            JobResult(job_id=j.id, status="failed", error="engine exploded")
            if j.custom_id in fail
            else JobResult(job_id=j.id, status="succeeded", text=f"out:{j.custom_id}",
                           finish_reason="length", prompt_tokens=5, completion_tokens=4)
            for j in jobs if only is None or j.custom_id in only])


def _content(env: ApiEnv, h: dict[str, str], file_id: str | None) -> bytes:
    if file_id is None:
        return b""
    r = env.client.get(f"/v1/files/{file_id}/content", headers=h)
    assert r.status_code == 200, r.text
    return r.content


def _lines(env: ApiEnv, h: dict[str, str], file_id: str | None) -> list[dict]:
    return read_jsonl(_content(env, h, file_id))


def _retry(env: ApiEnv, h: dict[str, str], batch_id: str, body: dict | None = None):
    if body is None:
        return env.client.post(f"/v1/batches/{batch_id}/retry", headers=h)
    return env.client.post(f"/v1/batches/{batch_id}/retry", headers=h, json=body)


def test_retry_builds_exactly_the_failed_lines(env: ApiEnv) -> None:
    h = env.auth("t-retry")
    good = batch_lines(6)
    plain = {"prompt": "a plain line without custom_id", "max_tokens": 3}  # line-9
    bad_json, bad_field = '{"custom_id": "broken", not json', json.dumps(
        {"custom_id": "x", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "p", "bogus": 1}})
    lines: list = [good[0], good[1], bad_json, good[2], "", good[3], bad_field, good[4], plain,
                   good[5]]
    data = jsonl(lines)
    file_id = _upload(env, h, data)
    policy = {"anchor": "created_at", "seconds": 3600}
    batch = _batch(env, h, file_id, metadata={"run": "1"}, completion_window="48h",
                   output_expires_after=policy)
    r = _retry(env, h, batch["id"])
    assert r.status_code == 409 and r.json()["error"]["code"] == "batch_not_finished", r.text
    _finish(env, batch["id"], fail={"r-1", "r-4", "line-9"})
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 9, "completed": 4, "failed": 5}

    assert _retry(env, env.auth("t-retry-other"), batch["id"]).status_code == 404
    bad = _retry(env, h, batch["id"], {"endpoint": "/v1/chat/completions"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "endpoint", bad.text
    bad = _retry(env, h, batch["id"], {"completion_window": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "completion_window"
    bad = _retry(env, h, batch["id"], {"output_expires_after": {"anchor": "created_at",
                                                                "seconds": 5}})
    assert bad.status_code == 400, bad.text

    r = _retry(env, h, batch["id"], {"metadata": {"run": "2"}})
    assert r.status_code == 200, r.text
    again = r.json()
    assert again["status"] == "validating" and again["retry_of"] == batch["id"]
    assert again["metadata"] == {"run": "2"} and again["completion_window"] == "48h"
    assert again["endpoint"] == "/v1/completions" and again["output_expires_after"] == policy
    assert again["input_file_id"] not in (file_id, None)
    # the new input: exactly the lines of the error file, in input order
    errors = _lines(env, h, done["error_file_id"])
    retried = _content(env, h, again["input_file_id"]).splitlines()
    assert len(retried) == len(errors) == 5
    assert retried[1] == bad_json.encode() and retried[2] == bad_field.encode()  # byte for byte
    by_line = [json.loads(retried[i]) for i in (0, 3, 4)]
    assert [x["custom_id"] for x in by_line] == ["r-1", "r-4", "line-9"]
    assert by_line[0] == {**good[1], "body": {**good[1]["body"]}}
    assert by_line[2]["body"]["prompt"] == plain["prompt"]
    # (a line that is not JSON has no custom_id to report)
    assert [e["custom_id"] for e in errors] == ["r-1", None, "x", "r-4", "line-9"]
    f = env.client.get(f"/v1/files/{again['input_file_id']}", headers=h).json()
    assert f["purpose"] == "batch" and f["filename"] == f"{batch['id']}_retry.jsonl"

    second = wait_expanded(env, h, again["id"])
    assert second["request_counts"]["total"] == 5 and second["request_counts"]["failed"] == 2
    _finish(env, second["id"])
    second = env.client.get(f"/v1/batches/{second['id']}", headers=h).json()
    assert second["status"] == "completed", second
    first_out = {o["custom_id"] for o in _lines(env, h, done["output_file_id"])}
    second_out = {o["custom_id"] for o in _lines(env, h, second["output_file_id"])}
    assert second_out == {"r-1", "r-4", "line-9"} and not first_out & second_out
    assert first_out | second_out == {f"r-{i}" for i in range(6)} | {"line-9"}
    assert {e["custom_id"] for e in _lines(env, h, second["error_file_id"])} == {None, "x"}
    assert env.client.get(f"/v1/batches/{again['id']}", headers=h).json()["retry_of"] == batch["id"]


def test_retry_refusals_and_a_deleted_input(env: ApiEnv) -> None:
    h = env.auth("t-retry-refuse")
    clean = _batch(env, h, _upload(env, h, jsonl(batch_lines(2))))
    _finish(env, clean["id"])
    assert env.client.get(f"/v1/batches/{clean['id']}", headers=h).json()["status"] == "completed"
    r = _retry(env, h, clean["id"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "nothing_to_retry", r.text

    # without invalid lines the retry needs only the job rows: the input may be gone
    file_id = _upload(env, h, jsonl(batch_lines(3, tag="d")))
    failed = _batch(env, h, file_id)
    _finish(env, failed["id"], fail={"d-2"})
    env.client.get(f"/v1/batches/{failed['id']}", headers=h)
    assert env.client.delete(f"/v1/files/{file_id}", headers=h).status_code == 200
    r = _retry(env, h, failed["id"], {"metadata": None})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] is None
    assert [json.loads(x)["custom_id"] for x in
            _content(env, h, r.json()["input_file_id"]).splitlines()] == ["d-2"]

    # an invalid line must come from the input file: once it is deleted, a clear 400
    file_id = _upload(env, h, jsonl([*batch_lines(1, tag="e"), "{oops"]))
    invalid = _batch(env, h, file_id)
    _finish(env, invalid["id"])
    env.client.get(f"/v1/batches/{invalid['id']}", headers=h)
    assert env.client.delete(f"/v1/files/{file_id}", headers=h).status_code == 200
    r = _retry(env, h, invalid["id"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "input_file_missing", r.text


@contextlib.contextmanager
def _worker(env: ApiEnv) -> Iterator[None]:
    pytest.importorskip("torch")
    from worker.engine import EngineArgs, LLMEngine
    from worker.service.config import WorkerConfig
    from worker.service.worker import WorkerProcess

    config = WorkerConfig(
        database_url=env.settings.database_url, redis_url=REDIS_URL, model="tiny-llama",
        prefix=env.ctx.keys.prefix, name="api-retry", heartbeat_interval=0.3,
        cancel_poll_interval=0.05, reconcile_interval=3600,
    )
    w = WorkerProcess(config, install_signals=False, engine_factory=lambda _c: LLMEngine(EngineArgs(
        model="tiny-llama", max_num_seqs=16, num_kv_blocks=128, max_model_len=512)))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield
    finally:
        w.stop()
        t.join(60)


def test_retry_of_a_cancelled_batch_runs_on_a_worker(env: ApiEnv) -> None:
    """Half a batch finished, the rest cancelled, one line invalid; the retry, run by a
    worker on the tiny model, generates exactly the cancelled lines, and the two output
    files join by custom_id into every valid line."""
    h = env.auth("t-retry-e2e")
    lines: list = [*batch_lines(4, tag="c", max_tokens=3), '{"custom_id": "bad", "x": 1}']
    batch = _batch(env, h, _upload(env, h, jsonl(lines)))
    _finish(env, batch["id"], only={"c-0", "c-2"})
    r = env.client.post(f"/v1/batches/{batch['id']}/cancel", headers=h)
    assert r.status_code == 200, r.text
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "cancelled", done
    assert [(e["custom_id"], e["error"]["code"] if e["error"] else e["response"]["status_code"])
            for e in _lines(env, h, done["error_file_id"])][:2] == [
        ("c-1", "batch_cancelled"), ("c-3", "batch_cancelled")]
    r = _retry(env, h, batch["id"])
    assert r.status_code == 200, r.text
    retry_id = r.json()["id"]
    assert [json.loads(x).get("custom_id") for x in
            _content(env, h, r.json()["input_file_id"]).splitlines()] == ["c-1", "c-3", "bad"]
    with _worker(env):
        deadline = time.monotonic() + 180
        while True:
            second = env.client.get(f"/v1/batches/{retry_id}", headers=h).json()
            if second["status"] not in ("validating", "in_progress", "finalizing"):
                break
            assert time.monotonic() < deadline, second
            time.sleep(0.3)
    assert second["status"] == "completed", second
    assert second["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    out = _lines(env, h, second["output_file_id"])
    assert [o["custom_id"] for o in out] == ["c-1", "c-3"]
    assert all(o["response"]["body"]["usage"]["completion_tokens"] == 3 for o in out)
    first = {o["custom_id"] for o in _lines(env, h, done["output_file_id"])}
    assert first == {"c-0", "c-2"}
    assert first | {o["custom_id"] for o in out} == {f"c-{i}" for i in range(4)}
    assert [e["custom_id"] for e in _lines(env, h, second["error_file_id"])] == ["bad"]


def test_retry_of_an_expired_batch_takes_the_expired_lines(env: ApiEnv) -> None:
    from datetime import timedelta

    from api.control.maintenance import expire_batches
    from worker.store.base import utcnow
    from worker.store.crud.batches import get_batch

    h = env.auth("t-retry-expired")
    batch = _batch(env, h, _upload(env, h, jsonl(batch_lines(3, tag="x"))))
    _finish(env, batch["id"], only={"x-1"})
    with env.ctx.session_factory.begin() as s:
        get_batch(session=s, batch_id=batch["id"]).expires_at = utcnow() - timedelta(seconds=1)
    assert expire_batches(env.ctx) == [batch["id"]]
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "expired"
    assert [e["error"]["code"] for e in _lines(env, h, done["error_file_id"])] == [
        "batch_expired", "batch_expired"]
    from api.client import Client
    from api.serve_thread import ThreadedServer

    with ThreadedServer(env.app) as url, Client(url, api_key=env.key("t-retry-expired")) as c:
        again = c.retry_batch(batch["id"], completion_window="72h")
        assert again["completion_window"] == "72h" and again["retry_of"] == batch["id"]
        assert [json.loads(x)["custom_id"] for x in
                c.file_content(again["input_file_id"]).splitlines()] == ["x-0", "x-2"]
        assert env.app.state.dispatcher.wait_idle(30)
        c.cancel_batch(again["id"])
        assert c.wait_batch(again["id"], timeout=30, poll=0.1)["status"] == "cancelled"
        assert c.delete_file(again["input_file_id"])["deleted"] is True
