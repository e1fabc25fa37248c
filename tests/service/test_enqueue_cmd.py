"""``inflight enqueue`` against the real Redis and a SQLite store."""

from __future__ import annotations

import json

import pytest

from tests.service.conftest import REDIS_URL
from worker.cli.main import main

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
                   "--prefix", keys.prefix])
    out, err = capsys.readouterr()
    assert status == 1
    assert len(out.split()) == 3  # three job ids: n=2 is queued like any other line
    assert "line 3:" in err and "bogus" in err
    assert "enqueued 3 jobs, 1 invalid line skipped" in err
    assert redis_client.xlen(keys.stream("batch")) == 3
