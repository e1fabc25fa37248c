"""``inflight enqueue`` against the real Redis and a SQLite store."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from tests.service.conftest import REDIS_URL
from tests.service.helpers import batch_length

pytestmark = pytest.mark.services


def test_enqueue_takes_n_above_one_and_refuses_bad_lines_alone(tmp_path, redis_client, keys, capsys) -> None:
    from migrations.run import upgrade

    db = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url=db)
    lines = [
        {"prompt": "a", "max_tokens": 3},
        {"prompt": "b", "max_tokens": 3, "n": 2},
        {"prompt": "c", "bogus": 1},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    status = main(["enqueue", str(path), "--database-url", db, "--redis-url", REDIS_URL,
                   "--prefix", keys.prefix, "--model", keys.model])
    out, err = capsys.readouterr()
    assert status == 1
    assert len(out.split()) == 3  # three job ids: n=2 is queued like any other line
    assert "line 3:" in err and "bogus" in err
    assert "enqueued 3 jobs, 1 invalid line skipped" in err
    assert batch_length(redis_client, keys) == 3


def test_enqueue_refuses_what_the_api_refuses(tmp_path, redis_client, keys, capsys,
                                              monkeypatch) -> None:
    """The same submission path as the API: its request limits (here INFLIGHT_MAX_TOKENS_LIMIT
    and INFLIGHT_MAX_PROMPT_TOKENS) refuse a line as the API refuses the body, and a batch's
    custom_ids are the API's (``line-<n>`` when absent, unique)."""
    from migrations.run import upgrade
    from worker.store.db import make_engine, make_session_factory
    from worker.store.models import Job

    monkeypatch.setenv("INFLIGHT_MAX_TOKENS_LIMIT", "100")
    monkeypatch.setenv("INFLIGHT_MAX_PROMPT_TOKENS", "50")
    db = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url=db)
    lines = [
        {"prompt": "a", "max_tokens": 3},
        {"prompt": "b", "max_tokens": 101},
        {"prompt": "c" * 200, "max_tokens": 3},
        {"custom_id": "x", "prompt": "d", "max_tokens": 3},
        {"custom_id": "x", "prompt": "e", "max_tokens": 3},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    status = main(["enqueue", str(path), "--batch-id", "b-1", "--database-url", db,
                   "--redis-url", REDIS_URL, "--prefix", keys.prefix, "--model", keys.model])
    _, err = capsys.readouterr()
    assert status == 1
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [
        "error: line 2: max_tokens=101 is above the limit of 100",
        "error: line 3: prompt is too long: up to 201 tokens (one per UTF-8 byte at most), "
        "the limit is 50",
        "error: line 5 (custom_id 'x'): duplicate custom_id 'x'; custom_id must be unique "
        "within a batch",
    ]
    assert "enqueued 2 jobs, 3 invalid lines skipped" in err
    engine = make_engine(url=db)
    with make_session_factory(engine=engine)() as session:
        stored = {j.custom_id for j in session.query(Job).all()}
    engine.dispose()
    assert stored == {"line-1", "x"}
    assert batch_length(redis_client, keys) == 2
