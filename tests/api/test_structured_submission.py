"""A constraint the grammar library cannot compile is a 400 at submission, with the
library's reason and the field named; one it compiles is accepted; one that does not
compile within the bound is a 400 ``grammar_too_complex``, never let in; slow compiles
never stall unrelated routes. Helper processes answer (the import contracts keep the
library out of the API process); tests inject a slow helper through the service's
``command``."""

from __future__ import annotations

import threading
import time

import pytest

from api.grammar_check import GrammarChecker
from tests.api.conftest import ApiEnv
from tests.engine.test_grammar_service import slow_helper, slow_schema
from worker.engine.grammar_service import GrammarService

pytestmark = pytest.mark.services

MESSAGES = [{"role": "user", "content": "hi"}]
BROKEN_REF = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
GOOD = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}


def test_uncompilable_constraints_are_400_at_submission(env: ApiEnv) -> None:
    c, h = env.client, env.auth("t-grammar")
    for body, param, reason in (
        ({"messages": MESSAGES, "guided_regex": "(open"}, "guided_regex", "parenthesis"),
        ({"messages": MESSAGES, "response_format": BROKEN_REF}, "response_format", "$defs"),
        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "nonsense"}}}}, "response_format", "nonsense"),
    ):
        r = c.post("/v1/jobs", json=body, headers=h)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "cannot compile" in err["message"]
        assert reason in err["message"] and ".cc:" not in err["message"]  # no library paths
    for body in ({"messages": MESSAGES, "response_format": GOOD},
                 {"messages": MESSAGES, "guided_choice": ["yes", "no"]},
                 {"messages": MESSAGES, "response_format": {"type": "json_object"}}):
        assert c.post("/v1/jobs", json=body, headers=h).status_code == 201
    assert env.ctx.grammar.service.compiles == 6  # each constraint compiled once


def test_a_grammar_past_the_bound_is_refused_at_submission(make_env) -> None:
    env: ApiEnv = make_env(grammar_timeout=0.05)
    c, h = env.client, env.auth("t-grammar-slow")
    assert c.post("/v1/jobs", json={"messages": MESSAGES, "guided_regex": "a+"},
                  headers=h).status_code == 201  # the helper started: the bound is the compile's
    slow = {"type": "json_schema", "json_schema": {"name": "x", "schema": slow_schema()}}
    for _ in range(2):  # the second from the cache: refused again
        r = c.post("/v1/jobs", json={"messages": MESSAGES, "response_format": slow}, headers=h)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("grammar_too_complex", "response_format")
        assert "within 0.05s" in err["message"]


def test_slow_probes_do_not_block_an_unrelated_route(make_env) -> None:
    env: ApiEnv = make_env()
    env.ctx.grammar = GrammarChecker(GrammarService(
        timeout_s=2.0, max_concurrent=2, wait_s=0.2, command=slow_helper(30)))
    c, h = env.client, env.auth("t-grammar-many")
    answers: list[tuple[int, str | None, str | None]] = []

    def submit(i: int) -> None:
        r = c.post("/v1/jobs", json={"messages": MESSAGES, "guided_regex": f"x{i}"}, headers=h)
        answers.append((r.status_code, r.json()["error"]["code"], r.headers.get("retry-after")))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(48)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)  # the probes are in flight
        t0 = time.monotonic()
        r = c.get("/v1/models", headers=h)
        took = time.monotonic() - t0
        assert r.status_code == 200 and took < 1.0, took
    finally:
        for t in threads:
            t.join(60)
    assert len(answers) == 48
    too_slow = [a for a in answers if a[0] == 400]
    busy = [a for a in answers if a[0] == 503]
    assert len(too_slow) + len(busy) == 48, answers  # none let in
    assert all(code == "grammar_too_complex" for _, code, _ in too_slow)
    assert all(code == "grammar_check_busy" and retry == "1" for _, code, retry in busy)
    env.ctx.grammar.close()


def test_without_its_helper_the_check_steps_aside() -> None:
    import sys

    checker = GrammarChecker(GrammarService(
        command=[sys.executable, "-c", "import sys; sys.exit(3)"]))
    checker.check({"type": "regex", "pattern": "(open"})  # no helper: accepted, logged
    checker.close()
