"""Files that can be deleted and expire (issue 29 part 5), through the API against the real
PostgreSQL and Redis: DELETE /v1/files/{id} frees the bytes and the stored-bytes quota and
is refused while an open batch reads the file; ``expires_after`` on upload and a batch's
``output_expires_after`` set ``expires_at``; the retention task deletes expired files,
keeping one an open batch reads until the batch ends."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services


def _upload(env: ApiEnv, h: dict[str, str], data: bytes, **form: str):
    return env.client.post(
        "/v1/files",
        data={"purpose": "batch", **form},
        files={"file": ("in.jsonl", data, "application/jsonl")},
        headers=h,
    )


def _path(env: ApiEnv, file_id: str) -> str:
    from worker.store.crud.files import get_file

    with env.ctx.session_factory() as s:
        row = get_file(session=s, file_id=file_id)
        assert row is not None
        return row.path


def _batch(env: ApiEnv, h: dict[str, str], file_id: str, **kw) -> dict:
    r = env.client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/completions", **kw},
        headers=h,
    )
    assert r.status_code == 200, r.text
    return wait_expanded(env, h, r.json()["id"])


def _cancel(env: ApiEnv, h: dict[str, str], batch_id: str) -> None:
    r = env.client.post(f"/v1/batches/{batch_id}/cancel", headers=h)
    assert r.status_code == 200, r.text
    done = env.client.get(f"/v1/batches/{batch_id}", headers=h).json()
    assert done["status"] == "cancelled", done


def _expire_now(env: ApiEnv, *file_ids: str) -> None:
    from worker.store.base import utcnow
    from worker.store.crud.files import get_file

    with env.ctx.session_factory.begin() as s:
        for file_id in file_ids:
            row = get_file(session=s, file_id=file_id)
            assert row is not None
            row.expires_at = utcnow() - timedelta(seconds=1)


def test_delete_frees_the_bytes_and_the_quota(make_env) -> None:
    data = jsonl(batch_lines(3))
    env = make_env(quota_stored_bytes=len(data) + 10)  # room for one file
    h, other = env.auth("t-del"), env.auth("t-del-other")
    first = _upload(env, h, data).json()
    path = _path(env, first["id"])
    assert os.path.exists(path)
    full = _upload(env, h, data)
    assert full.status_code == 429 and full.json()["error"]["code"] == "quota_exceeded"
    # another tenant's file is absent to this one, and stays
    assert env.client.delete(f"/v1/files/{first['id']}", headers=other).status_code == 404
    assert os.path.exists(path)
    r = env.client.delete(f"/v1/files/{first['id']}", headers=h)
    assert r.status_code == 200 and r.json() == {"id": first["id"], "object": "file", "deleted": True}
    assert not os.path.exists(path)
    assert env.client.get(f"/v1/files/{first['id']}", headers=h).status_code == 404
    assert env.client.get(f"/v1/files/{first['id']}/content", headers=h).status_code == 404
    assert env.client.delete(f"/v1/files/{first['id']}", headers=h).status_code == 404
    assert first["id"] not in [f["id"] for f in env.client.get("/v1/files", headers=h).json()["data"]]
    assert _upload(env, h, data).status_code == 200  # the quota is free again


def test_delete_of_a_file_an_open_batch_reads_is_409(env: ApiEnv) -> None:
    h = env.auth("t-del-busy")
    f = _upload(env, h, jsonl(batch_lines(4))).json()
    batch = _batch(env, h, f["id"])
    assert batch["status"] == "in_progress"  # no worker: its jobs wait
    r = env.client.delete(f"/v1/files/{f['id']}", headers=h)
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "file_in_use" and batch["id"] in err["message"]
    assert os.path.exists(_path(env, f["id"]))
    _cancel(env, h, batch["id"])
    assert env.client.delete(f"/v1/files/{f['id']}", headers=h).status_code == 200


def test_expires_after_on_upload(env: ApiEnv) -> None:
    h = env.auth("t-exp-upload")
    data = jsonl(batch_lines(1))
    plain = _upload(env, h, data).json()
    assert plain["expires_at"] is None
    r = _upload(env, h, data, **{"expires_after[anchor]": "created_at",
                                 "expires_after[seconds]": "3600"})
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["expires_at"] == f["created_at"] + 3600
    assert env.client.get(f"/v1/files/{f['id']}", headers=h).json()["expires_at"] == f["expires_at"]
    bad = [
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"}, "seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"}, "seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1h"}, "seconds"),
        ({"expires_after[anchor]": "created_at"}, "seconds"),
        ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}, "anchor"),
        ({"expires_after[seconds]": "3600"}, "anchor"),
    ]
    for form, field in bad:
        r = _upload(env, h, data, **form)
        assert r.status_code == 400, (form, r.text)
        assert r.json()["error"]["param"] == f"expires_after[{field}]", r.text
    # a field the upload does not honour is refused, not dropped
    for name in ("expires_after", "expires_after[unit]", "ttl"):
        r = _upload(env, h, data, **{name: "3600"})
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"] | {"message": ""} == {
            "message": "", "type": "invalid_request_error", "param": name,
            "code": "unsupported_field"}, r.text


def test_output_expires_after_on_batches(env: ApiEnv) -> None:
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    h = env.auth("t-exp-out")
    f = _upload(env, h, jsonl([*batch_lines(2), "{not json"])).json()
    for bad in ({"anchor": "created_at", "seconds": 60},
                {"anchor": "created_at", "seconds": 2592001},
                {"anchor": "expires_at", "seconds": 3600},
                {"anchor": "created_at", "seconds": "3600"},
                {"anchor": "created_at", "seconds": 3600, "extra": 1},
                {"seconds": 3600}):
        r = env.client.post("/v1/batches", headers=h, json={
            "input_file_id": f["id"], "endpoint": "/v1/completions", "output_expires_after": bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"].startswith("output_expires_after"), r.text
    policy = {"anchor": "created_at", "seconds": 7200}
    batch = _batch(env, h, f["id"], output_expires_after=policy)
    assert batch["output_expires_after"] == policy
    with env.ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch["id"], limit=100)
        finish_jobs(session=s, worker_id="fake", results=[
            JobResult(job_id=j.id, status="succeeded", text="x", finish_reason="length",
                      prompt_tokens=1, completion_tokens=1) for j in jobs])
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "completed", done
    for key in ("output_file_id", "error_file_id"):
        out = env.client.get(f"/v1/files/{done[key]}", headers=h).json()
        assert out["expires_at"] == out["created_at"] + 7200, out
    assert env.client.get(f"/v1/files/{f['id']}", headers=h).json()["expires_at"] is None


def test_retention_deletes_expired_files_but_keeps_those_in_use(make_env) -> None:
    from api.control.celery_app import BEAT_SCHEDULE
    from api.control.maintenance import delete_expired_files

    assert "inflight.delete_expired_files" in BEAT_SCHEDULE
    data = jsonl(batch_lines(2))
    env = make_env(quota_stored_bytes=2 * len(data) + 10)  # room for two files
    h = env.auth("t-retention")
    ttl = {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    free = _upload(env, h, data, **ttl).json()
    busy = _upload(env, h, data, **ttl).json()
    keep = env.client.get(f"/v1/files/{free['id']}", headers=h).json()
    batch = _batch(env, h, busy["id"])
    assert delete_expired_files(env.ctx) == []  # nothing expired yet
    _expire_now(env, free["id"], busy["id"])
    free_path, busy_path = _path(env, free["id"]), _path(env, busy["id"])
    assert _upload(env, h, data).status_code == 429  # the quota is full
    assert env.app.state.celery.tasks["inflight.delete_expired_files"].apply().get() == [free["id"]]
    assert not os.path.exists(free_path) and os.path.exists(busy_path)
    assert env.client.get(f"/v1/files/{free['id']}", headers=h).status_code == 404
    assert env.client.get(f"/v1/files/{busy['id']}", headers=h).status_code == 200
    third = _upload(env, h, data)  # the expired file's bytes are free
    assert third.status_code == 200, third.text
    assert keep["expires_at"]
    assert delete_expired_files(env.ctx) == []  # the batch still reads it
    _cancel(env, h, batch["id"])
    assert delete_expired_files(env.ctx) == [busy["id"]]
    assert not os.path.exists(busy_path)
    assert env.client.get(f"/v1/files/{busy['id']}", headers=h).status_code == 404
    assert env.client.get(f"/v1/files/{third.json()['id']}", headers=h).status_code == 200


def test_the_openai_sdk_sends_what_the_api_honours(env: ApiEnv) -> None:
    """The official SDK's ``expires_after``, ``output_expires_after`` and ``files.delete``
    reach the API in the shapes it reads."""
    openai = pytest.importorskip("openai")
    from api.serve_thread import ThreadedServer

    key = env.key("t-exp-sdk")
    with ThreadedServer(env.app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
        f = client.files.create(file=("in.jsonl", jsonl(batch_lines(2))), purpose="batch",
                                expires_after={"anchor": "created_at", "seconds": 7200})
        assert f.expires_at == f.created_at + 7200
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/completions",
                                  completion_window="24h",
                                  output_expires_after={"anchor": "created_at", "seconds": 3600})
        assert env.app.state.dispatcher.wait_idle(30)
        with pytest.raises(openai.ConflictError):
            client.files.delete(f.id)
        client.batches.cancel(b.id)
        assert client.batches.retrieve(b.id).status == "cancelled"
        gone = client.files.delete(f.id)
        assert gone.deleted and gone.id == f.id
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(f.id)
    with env.ctx.session_factory() as s:
        from worker.store.crud.batches import get_batch

        assert get_batch(session=s, batch_id=b.id).output_expires_after == 3600
