"""Structured output: the body fields that ask for it, and the engine honouring them on the
tiny random model (whose free text is noise, so any valid output is the constraint's work),
with constrained and free rows in one batch."""

from __future__ import annotations

import json
import math
import re

import pytest

from worker.engine.llm_engine import LLMEngine
from worker.protocol.openai_batch import RequestParseError, parse_request_body
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"},
                   "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["color", "ok", "n"],
    "additionalProperties": False,
}


def _params(body: dict, endpoint: str = "/v1/completions") -> SamplingParams:
    return parse_request_body({"prompt": "x", **body}, endpoint=endpoint).params


def test_the_body_fields_normalize_to_one_constraint() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    assert _params({"response_format": fmt}).structured == {"type": "json_schema", "schema": SCHEMA}
    chat = parse_request_body({"messages": [{"role": "user", "content": "x"}],
                               "response_format": {"type": "json_object"}},
                              endpoint="/v1/chat/completions")
    assert chat.params.structured == {"type": "json_object"}
    assert _params({"response_format": {"type": "text"}}).structured is None
    assert _params({"guided_regex": "a+"}).structured == {"type": "regex", "pattern": "a+"}
    assert _params({"guided_choice": ["a", "b"]}).structured == {"type": "choice", "choices": ["a", "b"]}


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"response_format": {"type": "xml"}}, "response_format", "must be"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA, "x": 1}}},
     "response_format", "unknown field 'x'"),
    ({"response_format": {"type": "json_object", "schema": {}}}, "response_format", "unknown field"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex", "at most one"),
    ({"guided_regex": ""}, "guided_regex", "non-empty"),
    ({"guided_choice": []}, "guided_choice", "list of 1 to"),
    ({"guided_choice": ["a", 3]}, "guided_choice", "strings"),
    ({"guided_choice": ["a"], "ignore_eos": True}, "ignore_eos", "cannot be combined"),
])  # fmt: skip
def test_malformed_constraints_are_refused_with_the_field(body: dict, param: str, words: str) -> None:
    with pytest.raises(RequestParseError) as err:
        _params(body)
    assert err.value.param == param and words in str(err.value)


@pytest.mark.parametrize(("text", "accepted"), [
    ('{"a": 1}', True), ('{"a":{"b":[1, 2]}, "c": null}', True), ("{}", True),
    ("[23]", False), ('"x"', False), ("1", False), ("null", False),
])  # fmt: skip
def test_json_object_mode_takes_an_object_and_nothing_else(text: str, accepted: bool) -> None:
    """``{"type": "json_object"}`` is OpenAI's JSON mode: the output is a JSON object (it
    once compiled to the grammar of any JSON value, and the tiny model wrote ``[23]``)."""
    xgr = pytest.importorskip("xgrammar")
    from worker.engine.structured import grammar_of

    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo(["a"])).compile_grammar(
        grammar_of({"type": "json_object"}))
    matcher = xgr.GrammarMatcher(compiled)
    assert (matcher.accept_string(text) and matcher.is_completed()) is accepted


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(model="tiny-llama", num_kv_blocks=256, max_num_seqs=16, attention_backend="torch")


def _run(engine: LLMEngine, requests: dict[str, SamplingParams], prompt: str = "hello there"):
    for rid, params in requests.items():
        engine.add_request(rid, engine.tokenize(prompt=prompt), params)
    done = {}
    while engine.has_unfinished_requests():
        outputs, _ = engine.step()
        done.update({o.request_id: o for o in outputs if o.finished})
    return done


def test_constrained_and_free_rows_share_a_batch(engine: LLMEngine) -> None:
    free = SamplingParams(temperature=1.0, seed=11, max_tokens=24)
    alone = _run(engine, {"free": free})["free"]
    requests = {"free": free}
    for seed in range(4):
        requests[f"json-{seed}"] = SamplingParams(
            temperature=1.0, seed=seed, max_tokens=48, structured={"type": "json_schema", "schema": SCHEMA})
    requests["object"] = SamplingParams(temperature=1.0, seed=5, max_tokens=64,
                                        structured={"type": "json_object"})
    requests["choice"] = SamplingParams(temperature=1.0, seed=6, max_tokens=16, n=3,
                                        structured={"type": "choice", "choices": ["yes", "no", "maybe"]})
    requests["regex"] = SamplingParams(temperature=1.0, seed=7, max_tokens=16,
                                       structured={"type": "regex", "pattern": "[0-9]{3}-[a-z]{2}"})
    done = _run(engine, requests)
    assert done["free"].token_ids == alone.token_ids  # batch-mates with grammars change nothing
    for seed in range(4):
        out = done[f"json-{seed}"]
        value = json.loads(out.text)
        assert out.finish_reason == "stop" and set(value) == {"color", "ok", "n"}
        assert value["color"] in ("red", "green") and isinstance(value["ok"], bool)
        assert isinstance(value["n"], int) and 0 <= value["n"] <= 9
    if done["object"].finish_reason == "stop":  # a free-form object may run to max_tokens
        assert isinstance(json.loads(done["object"].text), dict)
    assert [s.text in ("yes", "no", "maybe") for s in done["choice"].samples] == [True] * 3
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", done["regex"].text)


def test_greedy_under_a_constraint_the_free_output_meets_is_the_free_output(engine: LLMEngine) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=4)
    prompts = ["a", "b c", "hello", "one two three", "xyz", "the end", "42", "ok then"]
    frees = {p: _run(engine, {"g": greedy}, prompt=p)["g"] for p in prompts}
    plain = [p for p, o in frees.items() if o.text.isascii() and o.text.isprintable() and o.text]
    assert plain, "the tiny model gave no printable greedy output to constrain"
    for prompt in plain:
        text = frees[prompt].text
        forced = SamplingParams(temperature=0, max_tokens=4,
                                structured={"type": "choice", "choices": [text, text + "!"]})
        assert _run(engine, {"c": forced}, prompt=prompt)["c"].text == text


def test_a_grammar_the_library_cannot_compile_is_refused_alone(engine: LLMEngine) -> None:
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("bad", [1, 2], SamplingParams(structured={"type": "regex", "pattern": "(a"}))
    assert err.value.param == "guided_regex" and "cannot compile" in str(err.value)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("structured", [
    {"type": "choice", "choices": ["yes", "no", "maybe"]},
    {"type": "regex", "pattern": "[0-9]{3}-[a-z]{2}"},
    {"type": "json_schema", "schema": SCHEMA},
], ids=["choice", "regex", "json_schema"])  # fmt: skip
def test_logprobs_under_a_grammar_are_the_models_own_finite_scores(
    engine: LLMEngine, structured: dict
) -> None:
    """Logprobs describe the model before the grammar mask, as vLLM reports them: every
    value is finite (the masked tokens are -inf only in what is drawn), and each position's
    chosen-token and top-5 scores equal the free model's at the same context, read back as
    the prompt logprobs of prompt + output."""
    prompt = engine.tokenize(prompt="hello there")
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=12, logprobs=5,
                            structured=structured)
    engine.add_request("constrained", prompt, params)
    out = _drain(engine)["constrained"]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) > 0
    engine.add_request("free", prompt + out.token_ids,
                       SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=5))
    free = _drain(engine)["free"].prompt_logprobs
    assert free is not None
    for i, lp in enumerate(out.logprobs):
        assert all(math.isfinite(v) for v in [lp.logprob, *lp.top.values()]), (i, lp)
        ref = free[len(prompt) + i]
        assert ref is not None and ref.token_id == lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(ref.logprob, abs=1e-3), i
        assert len(lp.top) == 5
        assert sorted(lp.top.values()) == pytest.approx(sorted(ref.top.values()), abs=1e-3), i


def _drain(engine: LLMEngine) -> dict:
    done = {}
    while engine.has_unfinished_requests():
        outputs, _ = engine.step()
        done.update({o.request_id: o for o in outputs if o.finished})
    return done
