"""Issue 25's reading test of the one submission path: follow ``payload`` from
``POST /v1/jobs`` through the code (every call handed the payload or something made from
it, ``tests/api/payload_tracer.py``) and check that it never returns to a file it left,
and that the submission's own steps (route, submit, parse, limits, enqueue, SQL insert,
XADD, the answer) stay in at most 8 files."""

from __future__ import annotations

import pytest

from api.routers.jobs import create_job
from api.schemas import JobCreate
from tests.api.conftest import ApiEnv
from tests.api.payload_tracer import Follow

pytestmark = pytest.mark.services


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    {"prompt": "Once upon a time", "max_tokens": 8, "stop": ["\n"]},
], ids=["chat", "completion"])
def test_a_rest_submission_never_returns_to_a_file_it_left(env: ApiEnv, body: dict) -> None:
    for depth, most_files in ((2, 8), (None, None)):
        payload = JobCreate.model_validate(body)
        follow = Follow(payload, max_depth=depth)
        resp = follow.run(create_job, payload=payload, idempotency_key=None, ctx=env.ctx,
                          tenant="t1")
        assert resp.status_code == 201
        _entries, files, again, text = follow.entries()
        assert again == 0, f"depth {depth}: the submission goes back to a file:\n{text}"
        files_with_route = files | {"api/routers/jobs.py"}
        if most_files is not None:
            assert len(files_with_route) <= most_files, f"depth {depth}:\n{text}"
        else:  # followed all the way down: to the SQL insert and the XADD
            assert {"worker/store/crud/job_status.py", "worker/queue/producer.py"} <= files
