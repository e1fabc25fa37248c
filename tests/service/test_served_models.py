"""What the workers serve: a real worker (tiny-llama) writes its model info into its
``workers`` row; ``served_models`` and ``inflight models`` list the live ones (real
PostgreSQL and Redis)."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest

from cli.main import main
from tests.service.conftest import REDIS_URL
from tests.service.helpers import batch_length, prompt_jobs, wait_for, worker_thread
from worker.service.config import WorkerConfig
from worker.service.model_info import describe_engine, model_id_for
from worker.service.worker import default_engine_factory
from worker.store.base import utcnow
from worker.store.crud.served_models import served_model, served_models
from worker.store.crud.workers import heartbeat, register_worker
from worker.store.models import Worker
from worker.store.schemas import ModelInfo

LIVE = timedelta(seconds=30)


def test_model_id_is_the_spec_or_a_paths_name(tmp_path) -> None:
    ckpt = tmp_path / "my-checkpoint"
    ckpt.mkdir()
    assert model_id_for("smollm2-135m") == "smollm2-135m"
    assert model_id_for("tiny-llama") == "tiny-llama"
    assert model_id_for("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert model_id_for(str(ckpt)) == "my-checkpoint"
    assert model_id_for(f"{ckpt}/") == "my-checkpoint"
    assert model_id_for(str(tmp_path / "weights.gguf")) == "weights.gguf"


def test_an_engine_without_a_runner_gives_the_id_alone() -> None:
    assert describe_engine(SimpleNamespace(tokenizer=None), "fake") == ModelInfo(model_id="fake")


@pytest.mark.services
def test_a_real_worker_publishes_its_model_info(migrated_pg, session_factory, redis_client, keys) -> None:
    config = WorkerConfig(
        database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama", prefix=keys.prefix,
        name="served", heartbeat_interval=0.3, reconcile_interval=3600,
        engine_kwargs={"max_num_seqs": 4, "num_kv_blocks": 32, "max_model_len": 256,
                       "attention_backend": "torch", "num_threads": 1},
    )  # fmt: skip

    def _row() -> Worker | None:
        with session_factory() as s:
            return s.query(Worker).filter(Worker.status == "running").one_or_none()

    with worker_thread(config, default_engine_factory):
        wait_for(lambda: _row() is not None, timeout=180, what="the worker to register and beat")
        row = _row()
        assert row is not None and row.id.startswith("served-")
        assert (row.model, row.model_id) == ("tiny-llama", "tiny-llama")
        assert (row.model_type, row.architecture) == ("llama", "LlamaForCausalLM")
        assert (row.dtype, row.max_model_len) == ("float32", 256)
        with session_factory() as s:
            models = served_models(session=s, within=LIVE)
        assert [(m.id, m.workers, m.dtype, m.max_model_len) for m in models] == [
            ("tiny-llama", [row.id], "float32", 256)
        ]
    with session_factory() as s:  # stopped: no longer served
        assert served_models(session=s, within=LIVE) == []


@pytest.mark.services
def test_a_worker_serves_the_name_it_is_given_and_only_its_models_streams(
    migrated_pg, session_factory, redis_client, keys
) -> None:
    """``--served-model-name``: the id it registers and the streams it reads; jobs of
    another model stay in that model's stream."""
    from worker.jobs.enqueue import enqueue
    from worker.store.crud.jobs import get_job

    config = WorkerConfig(
        database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama", prefix=keys.prefix,
        served_model_name="gpt-4o-mini", name="named", heartbeat_interval=0.3,
        reconcile_interval=3600,
        engine_kwargs={"max_num_seqs": 4, "num_kv_blocks": 32, "max_model_len": 256,
                       "attention_backend": "torch", "num_threads": 1},
    )  # fmt: skip
    mine = enqueue(session_factory=session_factory, redis_client=redis_client,
                   keys=keys.for_model("gpt-4o-mini"), jobs=prompt_jobs(2))
    other = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                    jobs=prompt_jobs(1, tag="other"))  # tiny-llama's: no worker serves it

    def status(job_id: str) -> str:
        with session_factory() as s:
            return get_job(session=s, job_id=job_id).status

    with worker_thread(config, default_engine_factory):
        wait_for(lambda: all(status(j) not in ("queued", "running") for j in mine),
                 timeout=180, what="the worker's own model's jobs")
        assert [status(j) for j in mine] == ["succeeded"] * 2
        with session_factory() as s:
            assert [m.id for m in served_models(session=s, within=LIVE)] == ["gpt-4o-mini"]
    assert status(other[0]) == "queued"
    assert batch_length(redis_client, keys) == 1


def _seed(session_factory) -> None:
    """Two live workers of ``tiny-llama`` (different contexts), one of a hub id, one silent
    for two minutes, one stopped."""
    rows = [
        ("w1", ModelInfo("tiny-llama", "llama", "LlamaForCausalLM", "float32", 1024)),
        ("w2", ModelInfo("tiny-llama", "llama", "LlamaForCausalLM", "float32", 256)),
        ("w3", ModelInfo("org/model", "qwen2", "Qwen2ForCausalLM", "bfloat16", 4096)),
        ("w-stale", ModelInfo("stale-model", "llama", "LlamaForCausalLM", "float32", 512)),
        ("w-stopped", ModelInfo("stopped-model")),
    ]
    with session_factory.begin() as s:
        for worker_id, info in rows:
            register_worker(session=s, worker_id=worker_id, host="h", model="spec", pid=1, info=info)
            heartbeat(session=s, worker_id=worker_id, status="running")
        heartbeat(session=s, worker_id="w-stopped", status="stopped")
        s.flush()
        s.get(Worker, "w-stale").heartbeat_at = utcnow() - timedelta(seconds=120)


@pytest.mark.services
def test_served_models_lists_live_workers_only(session_factory) -> None:
    _seed(session_factory)
    with session_factory() as s:
        models = served_models(session=s, within=LIVE)
        assert served_model(session=s, model_id="stale-model", within=LIVE) is None
        assert served_model(session=s, model_id="stale-model", within=timedelta(hours=1)) is not None
        assert served_model(session=s, model_id="nope", within=LIVE) is None
    assert [m.id for m in models] == ["org/model", "tiny-llama"]
    tiny = models[1]
    assert tiny.workers == ["w1", "w2"] and tiny.max_model_len == 256  # the smallest
    assert (tiny.model_type, tiny.architecture, tiny.dtype) == ("llama", "LlamaForCausalLM", "float32")


@pytest.mark.services
def test_models_command_table_and_json(migrated_pg, session_factory, capsys) -> None:
    _seed(session_factory)
    assert main(["models", "--database-url", migrated_pg]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["MODEL", "ARCHITECTURE", "TYPE", "DTYPE", "CONTEXT", "SEEN", "WORKERS"]
    assert len(lines) == 3
    assert lines[1].split()[:5] == ["org/model", "Qwen2ForCausalLM", "qwen2", "bfloat16", "4096"]
    assert lines[1].split()[-1] == "w3"
    assert lines[2].split()[:5] == ["tiny-llama", "LlamaForCausalLM", "llama", "float32", "256"]
    assert lines[2].split()[-1] == "w1,w2"

    assert main(["models", "--json", "--database-url", migrated_pg]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["org/model", "tiny-llama"]
    tiny = body["data"][1]
    assert {k: tiny[k] for k in ("object", "owned_by", "architecture", "dtype", "max_model_len", "workers")} == {
        "object": "model", "owned_by": "inflight", "architecture": "LlamaForCausalLM",
        "dtype": "float32", "max_model_len": 256, "workers": ["w1", "w2"],
    }  # fmt: skip
    assert isinstance(tiny["created"], int)

    # a longer timeout lets the silent worker back in
    assert main(["models", "--json", "--worker-timeout", "3600", "--database-url", migrated_pg]) == 0
    assert "stale-model" in [m["id"] for m in json.loads(capsys.readouterr().out)["data"]]


@pytest.mark.services
def test_models_command_with_no_live_worker(migrated_pg, capsys) -> None:
    assert main(["models", "--database-url", migrated_pg]) == 0
    assert "no worker seen" in capsys.readouterr().out
    assert main(["models", "--json", "--database-url", migrated_pg]) == 0
    assert json.loads(capsys.readouterr().out) == {"object": "list", "data": []}
