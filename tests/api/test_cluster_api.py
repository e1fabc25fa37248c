"""The API and a worker on a real three-node Redis Cluster (made by the test session):
OpenAI routes (the waiting route's asyncio cluster client, streamed deltas), a batch from
upload to output file, the model list and the queue metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.api.conftest import (
    OPERATOR_KEY,
    ApiEnv,
    batch_lines,
    jsonl,
    tiny_worker,
    wait_expanded,
)
from tests.jsonl import read_jsonl

pytestmark = pytest.mark.services

MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.fixture
def cluster_env(make_env, redis_cluster) -> Iterator[ApiEnv]:
    """An API on the cluster and an in-process worker on the tiny model serving it."""
    env: ApiEnv = make_env(redis_url=redis_cluster.url)
    with tiny_worker(env, "cluster-api", redis_url=redis_cluster.url, max_num_seqs=8,
                     num_kv_blocks=128):
        yield env


def test_openai_routes_and_a_batch_through_a_cluster(cluster_env: ApiEnv) -> None:
    env = cluster_env
    h = env.auth("t-cluster")
    body = {"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    plain = env.client.post("/v1/chat/completions", json=body, headers=h)
    assert plain.status_code == 200, plain.text
    answer = plain.json()
    assert answer["model"] == "tiny-llama" and answer["usage"]["completion_tokens"] == 6

    text = ""
    with env.client.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                           headers=h) as streamed:
        assert streamed.status_code == 200
        for line in streamed.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    assert text == answer["choices"][0]["message"]["content"]  # greedy: the same text

    up = env.client.post("/v1/files", data={"purpose": "batch"},
                         files={"file": ("in.jsonl", jsonl(batch_lines(4)))}, headers=h)
    batch = env.client.post("/v1/batches", headers=h, json={
        "input_file_id": up.json()["id"], "endpoint": "/v1/completions"}).json()
    assert batch["model"] == "tiny-llama"
    wait_expanded(env, h, batch["id"])
    deadline = time.monotonic() + 120
    while (done := env.client.get(f"/v1/batches/{batch['id']}", headers=h).json())[
            "status"] != "completed":
        assert time.monotonic() < deadline, done
        time.sleep(0.3)
    out = env.client.get(f"/v1/files/{done['output_file_id']}/content", headers=h).text
    assert sorted(row["custom_id"] for row in read_jsonl(out)) == [
        f"r-{i}" for i in range(4)]

    models = env.client.get("/v1/models", headers=h).json()["data"]
    assert "tiny-llama" in {m["id"] for m in models}
    metrics = env.client.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR_KEY}"})
    assert 'inflight_stream_length{model="tiny-llama",stream="batch"}' in metrics.text
    assert "inflight_redis_up" not in metrics.text
