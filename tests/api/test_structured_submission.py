"""A constraint the grammar library cannot compile is a 400 at submission, with the
library's reason and the field named; one it compiles is accepted. A helper process
answers (the import contracts keep the library out of the API process)."""

from __future__ import annotations

import sys

import pytest

from api.grammar_check import GrammarChecker
from tests.api.conftest import ApiEnv

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
    assert len(env.ctx.grammar._answers) == 6  # each constraint asked once


def test_without_its_helper_the_check_steps_aside() -> None:
    checker = GrammarChecker(command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    checker.check({"type": "regex", "pattern": "(open"})  # no answer: accepted, logged
    slow = GrammarChecker(timeout_s=0.5, command=[sys.executable, "-c", "import time; time.sleep(30)"])
    slow.check({"type": "regex", "pattern": "a"})
    slow.close()
    checker.close()
