"""Every bad body of the shared table, and the REST-only bad inputs (job fields, raw
bodies, sizes, headers), answered with the exact status, error.code and param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.abuse.cases import CASES, MAX_PROMPT_TOKENS, MAX_TOKENS_LIMIT, Case
from tests.api.conftest import ApiEnv

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def suite_env(api_db_url: str, tmp_path_factory: pytest.TempPathFactory):
    """One app for the whole module (each case is a single request)."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.context import make_context
    from api.settings import Settings
    from tests.api.conftest import REDIS_URL

    settings = Settings(
        database_url=api_db_url,
        redis_url=REDIS_URL,
        prefix="inflight-abuse-rest",
        storage_dir=str(tmp_path_factory.mktemp("files")),
        beat_interval=0,
        max_prompt_tokens=MAX_PROMPT_TOKENS,
        max_tokens_limit=MAX_TOKENS_LIMIT,
        max_body_bytes=1 << 20,
        default_model="tiny-llama",
    )
    ctx = make_context(settings)
    app = create_app(settings, ctx=ctx)
    with TestClient(app) as client:
        yield ApiEnv(client=client, ctx=ctx, app=app, settings=settings)
    from worker.queue.wipe import delete_deployment

    delete_deployment(redis_client=ctx.redis, keys=ctx.keys)
    ctx.close()


@pytest.fixture(scope="module")
def auth(suite_env: ApiEnv) -> dict[str, str]:
    return suite_env.auth("t-abuse")


def _refused(resp: Any, status: int, code: str, param: str | None) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert error["message"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_body_is_refused(suite_env: ApiEnv, auth: dict[str, str], case: Case) -> None:
    body = json.dumps({**case.body(), "endpoint": case.endpoint})
    resp = suite_env.client.post(
        "/v1/jobs", content=body, headers={**auth, "Content-Type": "application/json"}
    )
    _refused(resp, 400, case.code, case.param)


OK = {"prompt": "hi", "max_tokens": 2}
REST_ONLY = [
    ("priority-too-high", {**OK, "priority": 1001}, 400, "invalid_request", "priority"),
    ("custom_id-control-char", {**OK, "custom_id": "a\x07b"}, 400, "invalid_value", "custom_id"),
    ("custom_id-too-long", {**OK, "custom_id": "c" * 513}, 400, "invalid_request", "custom_id"),
    ("custom_id-surrogate", {**OK, "custom_id": "\ud800"}, 400, "invalid_encoding", "custom_id"),
    ("idempotency_key-newline", {**OK, "idempotency_key": "k\n"}, 400, "invalid_value",
     "idempotency_key"),
    ("queue_class-unknown", {**OK, "queue_class": "vip"}, 400, "invalid_request", "queue_class"),
    ("endpoint-unknown", {**OK, "endpoint": "/v1/embeddings"}, 400, "invalid_request", "endpoint"),
    ("callback-loopback", {**OK, "callback_url": "http://127.0.0.1:9/x"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-localhost", {**OK, "callback_url": "http://localhost/x"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-private-10", {**OK, "callback_url": "http://10.1.2.3/x"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-private-192", {**OK, "callback_url": "https://192.168.0.1/x"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-metadata-service", {**OK, "callback_url": "http://169.254.169.254/latest"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-ipv6-loopback", {**OK, "callback_url": "http://[::1]:8080/"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-ipv4-mapped", {**OK, "callback_url": "http://[::ffff:127.0.0.1]/"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-multicast", {**OK, "callback_url": "http://224.0.0.1/"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-zero", {**OK, "callback_url": "http://0.0.0.0/"}, 400, "invalid_callback_url",
     "callback_url"),
    ("callback-credentials", {**OK, "callback_url": "http://u:p@8.8.8.8/"}, 400,
     "invalid_callback_url", "callback_url"),
    ("callback-ftp", {**OK, "callback_url": "ftp://example.com/"}, 400, "invalid_request",
     "callback_url"),
]


@pytest.mark.parametrize(("body", "status", "code", "param"), [c[1:] for c in REST_ONLY],
                         ids=[c[0] for c in REST_ONLY])
def test_bad_job_field_is_refused(
    suite_env: ApiEnv, auth: dict[str, str], body: dict, status: int, code: str, param: str
) -> None:
    resp = suite_env.client.post(
        "/v1/jobs", content=json.dumps(body), headers={**auth, "Content-Type": "application/json"}
    )
    _refused(resp, status, code, param)


RAW = [
    ("nan-literal", b'{"prompt": "x", "temperature": NaN}', 400, "invalid_value", "temperature"),
    ("infinity-literal", b'{"prompt": "x", "top_p": Infinity}', 400, "invalid_value", "top_p"),
    ("overflowing-literal", b'{"prompt": "x", "metadata": {"k": 1e400}}', 400, "invalid_value",
     "metadata"),
    ("invalid-utf8", b'{"prompt": "\xff\xfe"}', 400, "invalid_request", None),
    ("deep-array", b'{"prompt": "x", "user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
     "invalid_request", None),
    ("not-an-object", b"[1, 2]", 400, "invalid_request", None),
    ("truncated", b'{"prompt": ', 400, "invalid_request", None),
]


@pytest.mark.parametrize(("raw", "status", "code", "param"), [c[1:] for c in RAW],
                         ids=[c[0] for c in RAW])
def test_bad_raw_body_is_refused(
    suite_env: ApiEnv, auth: dict[str, str], raw: bytes, status: int, code: str | None,
    param: str | None,
) -> None:
    resp = suite_env.client.post(
        "/v1/jobs", content=raw, headers={**auth, "Content-Type": "application/json"}
    )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    if code is not None:
        assert (error["code"], error["param"]) == (code, param), error


def test_oversized_bodies_get_413(suite_env: ApiEnv, auth: dict[str, str]) -> None:
    big = json.dumps({"prompt": "x" * (2 << 20)}).encode()
    declared = suite_env.client.post(
        "/v1/jobs", content=big, headers={**auth, "Content-Type": "application/json"}
    )
    _refused(declared, 413, "body_too_large", None)

    def chunks():
        for _ in range(40):
            yield b" " * (64 << 10)

    chunked = suite_env.client.post(
        "/v1/jobs", content=chunks(), headers={**auth, "Content-Type": "application/json"}
    )
    _refused(chunked, 413, "body_too_large", None)


def test_bad_path_ids_and_cursors(suite_env: ApiEnv, auth: dict[str, str]) -> None:
    c = suite_env.client
    for path in ("/v1/jobs/a%00b", "/v1/jobs/%E2%80%AE", "/v1/batches/" + "x" * 5000,
                 "/v1/files/%0d%0aSet-Cookie:x"):
        assert c.get(path, headers=auth).status_code == 404, path
    _refused(c.get("/v1/batches?after=nope", headers=auth), 404, "not_found", "after")
    _refused(c.get("/v1/jobs?batch_id=nope", headers=auth), 404, "not_found", "batch_id")
    _refused(c.get("/v1/jobs?limit=0", headers=auth), 400, "invalid_request", "limit")
    _refused(c.get("/v1/jobs?after=nope", headers=auth), 404, "not_found", "after")
    _refused(c.get("/v1/jobs?after=" + "x" * 65, headers=auth), 400, "invalid_request", "after")
    _refused(c.get("/v1/jobs?offset=-1", headers=auth), 400, "unsupported_field", "offset")


def test_metadata_and_user_are_kept_and_returned(suite_env: ApiEnv, auth: dict[str, str]) -> None:
    body = {**OK, "metadata": {"team": "a"}, "user": "u-1"}
    job = suite_env.client.post("/v1/jobs", json=body, headers=auth).json()
    assert (job["metadata"], job["user"]) == ({"team": "a"}, "u-1")
    again = suite_env.client.get(f"/v1/jobs/{job['id']}", headers=auth).json()
    assert (again["metadata"], again["user"]) == ({"team": "a"}, "u-1")


def test_auth_header_abuse(suite_env: ApiEnv) -> None:
    c = suite_env.client
    _refused(c.get("/v1/jobs"), 401, "invalid_api_key", None)
    _refused(c.get("/v1/jobs", headers={"Authorization": "Basic abc"}), 401, "invalid_api_key",
             None)
    _refused(c.get("/v1/jobs", headers={"Authorization": "Bearer " + "k" * 5000}), 401,
             "invalid_api_key", None)
    _refused(c.get("/v1/jobs", headers={"Authorization": "Bearer nope"}), 401,
             "invalid_api_key", None)


def test_prompt_bound_plus_max_tokens_must_fit_the_model(make_env) -> None:
    env = make_env(max_model_len=100)
    h = env.auth("t-context")
    too_long = env.client.post("/v1/jobs", json={"prompt": "x" * 50, "max_tokens": 60}, headers=h)
    _refused(too_long, 400, "prompt_too_long", "prompt")
    assert "can exceed the model's context of 100 tokens" in too_long.json()["error"]["message"]
    fits = env.client.post("/v1/jobs", json={"prompt": "x" * 50, "max_tokens": 40}, headers=h)
    assert fits.status_code == 201, fits.text
