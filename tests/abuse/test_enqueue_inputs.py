"""``inflight enqueue`` on a file holding every bad body of the table, undecodable lines
and good lines: each bad line is reported on stderr with the parser's exact message, the
good ones are enqueued, and nothing crashes."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from tests.abuse.cases import CASES
from tests.service.conftest import REDIS_URL
from tests.service.helpers import batch_length
from worker.protocol.openai_batch import RequestParseError, parse_request_line

pytestmark = pytest.mark.services

RAW = [
    b'{"prompt": "\xff\xfe"}',
    b"[" * 50_000 + b"]" * 50_000,
    b'{"prompt": "x", "top_p": -Infinity}',
    b'{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "r", '
    b'"description": 1e400, "schema": {"type": "object"}}}}',
    b'{"custom_id": "a\\u0000b", "prompt": "x"}',
    b"not json at all",
]


def test_enqueue_reports_each_bad_line_and_keeps_the_good(tmp_path, redis_client, keys,
                                                           capsys) -> None:
    from migrations.run import upgrade

    db = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url=db)
    cases = [case for case in CASES if not case.api_only]
    good = [{"prompt": f"good {i}", "max_tokens": 3} for i in range(3)]
    lines = [json.dumps(g).encode() for g in good]
    lines += [json.dumps({"custom_id": c.name, **c.body()}).encode() for c in cases]
    lines += RAW
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    status = main(["enqueue", str(path), "--database-url", db, "--redis-url", REDIS_URL,
                   "--prefix", keys.prefix, "--model", keys.model])
    out, err = capsys.readouterr()
    assert status == 1
    assert len(out.split()) == len(good)
    reported = [line for line in err.splitlines() if line.startswith("error: ")]
    expected = []
    for number, line in enumerate(lines, start=1):
        if number <= len(good):
            continue
        with pytest.raises(RequestParseError) as info:
            parse_request_line(line, line_number=number)
        expected.append(f"error: {info.value}")
    assert reported == expected
    assert f"enqueued {len(good)} jobs, {len(cases) + len(RAW)} invalid lines skipped" in err
    assert batch_length(redis_client, keys) == len(good)


def test_enqueue_refuses_a_bad_tenant(tmp_path, capsys) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "x"}\n')
    assert main(["enqueue", str(path), "--tenant", "", "--database-url",
                 f"sqlite:///{tmp_path / 'q.db'}"]) == 2
    assert "is not a valid tenant name" in capsys.readouterr().err
