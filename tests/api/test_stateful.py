"""Stateful, property-based: Hypothesis drives sequences of calls that follow the links of
the OpenAPI document (create a job, file or batch, then read it, list it, cancel it, and
probe it as another tenant), with generated sampling fields (in and out of range) on
every create. No call may answer a 5xx, and what a create answered must be what the
reads then find: the object, to its owner only."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from tests.api.conftest import ApiEnv, batch_lines, jsonl

pytestmark = pytest.mark.services

NUMBERS = st.one_of(st.integers(-3, 300), st.floats(-5, 5, allow_nan=False), st.none())
FIELDS = st.dictionaries(
    st.sampled_from(["temperature", "top_p", "top_k", "max_tokens", "n", "seed", "logprobs",
                     "prompt_logprobs", "presence_penalty", "min_tokens"]),
    NUMBERS, max_size=3)


def _machine(env: ApiEnv) -> type[RuleBasedStateMachine]:
    owner, other = env.auth("t-state"), env.auth("t-state-other")
    c = env.client

    class Sequences(RuleBasedStateMachine):
        jobs = Bundle("jobs")
        files = Bundle("files")
        batches = Bundle("batches")

        def __init__(self) -> None:
            super().__init__()
            self.statuses: list[int] = []

        def _call(self, method: str, url: str, headers: dict[str, str], **kw: object):
            response = c.request(method, url, headers=headers, **kw)
            self.statuses.append(response.status_code)
            assert response.status_code < 500, (method, url, response.text)
            return response

        @rule(target=jobs, chat=st.booleans(), fields=FIELDS)
        def create_job(self, chat: bool, fields: dict[str, object]):
            body = ({"messages": [{"role": "user", "content": "hi"}]} if chat
                    else {"prompt": "hi"}) | {"max_tokens": 2} | fields
            r = self._call("POST", "/v1/jobs", owner, json=body)
            assert r.status_code in (201, 400, 429), r.text
            return r.json()["id"] if r.status_code == 201 else "job_missing"

        @rule(job_id=jobs)
        def read_job(self, job_id: str):
            r = self._call("GET", f"/v1/jobs/{job_id}", owner)
            assert r.status_code == (404 if job_id == "job_missing" else 200), r.text
            if r.status_code == 200:
                assert r.json()["id"] == job_id
            assert self._call("GET", f"/v1/jobs/{job_id}", other).status_code == 404

        @rule(job_id=jobs)
        def cancel_job(self, job_id: str):
            r = self._call("DELETE", f"/v1/jobs/{job_id}", owner)
            if job_id != "job_missing":
                assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
            assert self._call("DELETE", f"/v1/jobs/{job_id}", other).status_code == 404

        @rule(target=files, lines=st.integers(1, 4), broken=st.booleans())
        def upload_file(self, lines: int, broken: bool):
            content = jsonl(batch_lines(lines)) + (b"{not json\n" if broken else b"")
            r = self._call("POST", "/v1/files", owner, data={"purpose": "batch"},
                           files={"file": ("in.jsonl", content, "application/jsonl")})
            assert r.status_code == 200, r.text
            return r.json()["id"]

        @rule(file_id=files)
        def read_file(self, file_id: str):
            assert self._call("GET", f"/v1/files/{file_id}", owner).status_code == 200
            body = self._call("GET", f"/v1/files/{file_id}/content", owner)
            assert body.status_code == 200 and body.content.count(b"\n") >= 1
            assert self._call("GET", f"/v1/files/{file_id}", other).status_code == 404

        @rule(target=batches, file_id=files,
              endpoint=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
        def create_batch(self, file_id: str, endpoint: str):
            body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
            r = self._call("POST", "/v1/batches", owner, json=body)
            assert r.status_code == 200, r.text
            assert self._call("POST", "/v1/batches", other, json=body).status_code == 404
            return r.json()["id"]

        @rule(batch_id=batches)
        def read_batch(self, batch_id: str):
            r = self._call("GET", f"/v1/batches/{batch_id}", owner)
            assert r.status_code == 200 and r.json()["id"] == batch_id, r.text
            assert self._call("GET", f"/v1/batches/{batch_id}", other).status_code == 404

        @rule(batch_id=batches)
        def cancel_batch(self, batch_id: str):
            r = self._call("POST", f"/v1/batches/{batch_id}/cancel", owner)
            if r.status_code == 400:  # it ended first: the answer names its real status
                status = r.json()["error"]["message"].split(" is ")[1].split(";")[0]
                assert status in ("completed", "failed", "expired", "finalizing"), r.text
            else:  # the finalizer (the embedded beat) may already be writing its files
                assert r.status_code == 200 and r.json()["status"] in (
                    "cancelling", "finalizing", "cancelled"), r.text
            r = self._call("POST", f"/v1/batches/{batch_id}/cancel", other)
            assert r.status_code == 404

        @rule()
        def list_everything(self):
            for path in ("/v1/jobs?limit=5", "/v1/files", "/v1/batches?limit=5"):
                r = self._call("GET", path, owner)
                assert r.status_code == 200 and isinstance(r.json()["data"], list)

        @invariant()
        def no_server_error(self):
            assert all(s < 500 for s in self.statuses)

    return Sequences


def test_stateful_sequences_follow_the_links_without_server_errors(env: ApiEnv) -> None:
    machine = _machine(env)
    machine.TestCase.settings = settings(max_examples=15, stateful_step_count=12,
                                         deadline=None, database=None, derandomize=True,
                                         suppress_health_check=list(HealthCheck))
    machine.TestCase().runTest()
    listed = env.client.get("/v1/jobs?limit=1000", headers=env.auth("t-state")).json()["data"]
    assert listed, "the sequences created no job"
