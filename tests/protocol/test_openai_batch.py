"""Request line parsing and OpenAI Batch output formatting (torch-free, fast)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.protocol.openai_batch import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    GenerationRequest,
    LogprobInfo,
    RequestParseError,
    Sample,
    build_response_body,
    format_batch_output_line,
    format_error_line,
    parse_request_body,
    parse_request_line,
)
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams


def line(obj: object) -> str:
    return json.dumps(obj)


def batch_line(body: dict, *, url: str = CHAT_ENDPOINT, custom_id: str = "req-1") -> str:
    return line({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def refuse(text: str | bytes, *, line_number: int = 7) -> RequestParseError:
    with pytest.raises(RequestParseError) as info:
        parse_request_line(text, line_number=line_number)
    return info.value


USER = [{"role": "user", "content": "Hi"}]


# -- accepted shapes ---------------------------------------------------------------------


def test_plain_completion_line_uses_openai_defaults():
    req = parse_request_line(line({"prompt": "Once upon"}), line_number=1)
    assert req.endpoint == COMPLETIONS_ENDPOINT and not req.is_chat
    assert req.prompt == "Once upon" and req.messages is None and req.custom_id is None
    assert req.params.max_tokens == 16 and req.params.temperature == 1.0
    assert req.body == {"prompt": "Once upon"}


def test_plain_chat_line_with_custom_id():
    req = parse_request_line(line({"custom_id": "a", "messages": USER, "temperature": 0}),
                             line_number=1)
    assert req.endpoint == CHAT_ENDPOINT and req.is_chat
    assert req.custom_id == "a" and req.messages == USER and req.prompt is None
    assert req.params.max_tokens is None  # chat: up to the context, as OpenAI
    assert req.params.greedy
    assert "custom_id" not in req.body


def test_batch_line_maps_every_sampling_field():
    body = {
        "model": "smollm2", "messages": USER, "max_completion_tokens": 9, "temperature": 0.5,
        "top_p": 0.9, "n": 1, "stop": "END", "seed": 42, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "logprobs": True, "top_logprobs": 3, "top_k": 40,
        "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 2, "ignore_eos": True,
        "stop_token_ids": [5, 6], "skip_special_tokens": False, "user": "u1",
        "metadata": {"k": "v"}, "stream": False,
    }
    req = parse_request_line(batch_line(body), line_number=3)
    assert req.custom_id == "req-1" and req.model == "smollm2" and req.body == body
    assert req.params == SamplingParams(
        max_tokens=9, temperature=0.5, top_p=0.9, n=1, stop=["END"], seed=42,
        presence_penalty=0.5, frequency_penalty=-0.5, logprobs=3, top_k=40, min_p=0.05,
        repetition_penalty=1.1, min_tokens=2, ignore_eos=True, stop_token_ids=[5, 6],
        skip_special_tokens=False)


def test_batch_completion_line_with_token_ids_and_int_logprobs():
    req = parse_request_line(batch_line({"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 2,
                                         "stop": ["a", "b"]}, url=COMPLETIONS_ENDPOINT),
                             line_number=1)
    assert req.prompt == [1, 2, 3] and req.params.logprobs == 2
    assert req.params.max_tokens == 4 and req.params.stop == ["a", "b"]


def test_bytes_line_and_nulls_mean_defaults():
    req = parse_request_line(line({"prompt": "x", "temperature": None, "max_tokens": None,
                                   "stop": None, "model": None}).encode(), line_number=1)
    assert req.params.temperature == 1.0 and req.params.max_tokens == 16
    assert req.params.stop == []


@pytest.mark.parametrize(("body", "expected"), [
    ({"logprobs": True}, 0),
    ({"logprobs": True, "top_logprobs": 5}, 5),
    ({"logprobs": False}, None),
    ({}, None),
])
def test_chat_logprobs(body, expected):
    req = parse_request_body({"messages": USER, **body}, endpoint=CHAT_ENDPOINT)
    assert req.params.logprobs == expected


def test_max_tokens_and_max_completion_tokens_may_agree():
    req = parse_request_body({"messages": USER, "max_tokens": 5, "max_completion_tokens": 5},
                             endpoint=CHAT_ENDPOINT)
    assert req.params.max_tokens == 5


def test_messages_are_normalized():
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"},
                                                     {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok"},
    ]
    req = parse_request_body({"messages": messages}, endpoint=CHAT_ENDPOINT)
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb", "name": "ann"},
        {"role": "assistant", "content": "ok"},
    ]
    assert req.body["messages"] is messages  # the original body is kept as given


def test_parse_request_body_has_no_custom_id():
    req = parse_request_body({"prompt": "x"}, endpoint=COMPLETIONS_ENDPOINT)
    assert req.custom_id is None and isinstance(req, GenerationRequest)


@pytest.mark.parametrize("text", [
    line({"custom_id": "c", "prompt": "hi", "max_tokens": 3, "stop": "x"}),
    line({"messages": USER, "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    batch_line({"messages": USER, "seed": 3}),
    batch_line({"prompt": [4, 5], "logprobs": 1}, url=COMPLETIONS_ENDPOINT),
])
def test_round_trip_through_batch_input(text):
    req = parse_request_line(text, line_number=1)
    req.custom_id = req.custom_id or "line-1"
    again = parse_request_line(json.dumps(req.to_batch_input()), line_number=1)
    assert again == req


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "words"), [
    ("{bad json", ["line 7", "malformed JSON", "column 2"]),
    ('{"prompt": "x"', ["line 7", "malformed JSON"]),
    ('{"prompt": "x", "temperature": NaN}', ["NaN is not valid JSON"]),
    ("[1, 2]", ["expected a JSON object, got an array"]),
    ('"text"', ["expected a JSON object, got a string"]),
    ("   ", ["empty line"]),
])
def test_malformed_lines(text, words):
    err = refuse(text)
    assert err.code == "invalid_json" and err.line_number == 7 and err.custom_id is None
    for word in words:
        assert word in str(err)


def test_invalid_utf8():
    assert "not valid UTF-8" in str(refuse(b'{"prompt": "\xff"}'))


def test_unknown_field_is_named_with_line_and_custom_id():
    err = refuse(line({"custom_id": "abc", "prompt": "x", "temprature": 0.5}))
    assert str(err) == "line 7 (custom_id 'abc'): unknown field 'temprature' for /v1/completions"
    assert err.param == "temprature" and err.code == "unknown_field"
    assert err.custom_id == "abc" and err.reason.startswith("unknown field")
    assert isinstance(err, InvalidRequestError)


def test_tool_calling_is_refused_with_what_to_send_instead():
    for name in ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"):
        err = refuse(batch_line({"messages": USER, name: []}))
        assert err.param == name and err.code == "unsupported_field"
        assert "tool calling" in str(err) and "json_schema" in str(err)


def test_unknown_field_in_batch_body_and_line():
    assert "unknown field 'frobnicate'" in str(
        refuse(batch_line({"messages": USER, "frobnicate": []})))
    err = refuse(line({"custom_id": "c", "method": "POST", "url": CHAT_ENDPOINT,
                       "body": {"messages": USER}, "temperature": 0}))
    assert "unknown field 'temperature' in a batch line" in str(err)
    assert "go inside body" in str(err)


@pytest.mark.parametrize(("obj", "param", "words"), [
    ({"messages": USER, "stream": True}, "stream", "stream=true is not supported"),
    ({"messages": USER, "prompt": "x"}, "messages", "not both"),
    ({"temperature": 0}, None, 'needs "prompt" (completion) or "messages" (chat)'),
    ({"prompt": "x", "max_completion_tokens": 3}, "max_completion_tokens", "use max_tokens"),
    ({"prompt": "x", "top_logprobs": 3}, "top_logprobs", "is a /v1/chat/completions field"),
    ({"prompt": "x", "temperature": -1}, "temperature", "temperature=-1: must be a number in [0, 100]"),
    ({"prompt": "x", "top_p": 0}, "top_p", "top_p=0: must be in (0, 1]"),
    ({"prompt": "x", "n": 17}, "n", "must be an integer in [1, 16]"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "max_tokens=0: must be an integer in [1, 1048576]"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens", "max_tokens must be an integer"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens", "max_tokens must be an integer"),
    ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos", "must be true or false"),
    ({"prompt": "x", "stop": [1]}, "stop", "stop must be a string or a list of strings"),
    ({"prompt": "x", "stop": [""]}, "stop", "must be non-empty strings"),
    ({"prompt": "x", "stop_token_ids": "1"}, "stop_token_ids", "list of integers"),
    ({"prompt": "x", "logprobs": True}, "logprobs", "logprobs must be an integer"),
    ({"prompt": "x", "logprobs": 21}, "logprobs", "in [0, 20]"),
    ({"prompt": "x", "model": 3}, "model", "model must be a string"),
    ({"prompt": "x", "min_tokens": 9, "max_tokens": 3}, "min_tokens", "must not exceed"),
    ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens",
     "max_completion_tokens=0"),
    ({"messages": USER, "max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens",
     "differ"),
    ({"messages": USER, "logprobs": 2}, "logprobs", "must be true or false"),
    ({"messages": USER, "top_logprobs": 2}, "top_logprobs", "requires logprobs=true"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 30}, "top_logprobs",
     "top_logprobs=30"),
    ({"prompt": ""}, "prompt", "must not be empty"),
    ({"prompt": []}, "prompt", "non-empty string or a non-empty list of token ids"),
    ({"prompt": ["a", "b"]}, "prompt", "one request per prompt"),
    ({"prompt": [[1], [2]]}, "prompt", "one request per prompt"),
    ({"prompt": [1, -2]}, "prompt", "in [0, 2**31)"),
    ({"prompt": {"a": 1}}, "prompt", "got an object"),
    ({"prompt": None}, "prompt", "prompt is required"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": "hi"}, "messages", "non-empty list"),
    ({"messages": ["hi"]}, "messages", "messages[0] must be an object"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages", "messages[0].content must be a string"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages",
     "unsupported field 'tool_calls'"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages", "messages[0].content[0] is of type 'image_url'; only text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages",
     "messages[0].content[0] must be"),
    ({"messages": USER, "custom_id": 5}, "custom_id", "custom_id must be a non-empty string"),
])
def test_refusals_name_the_field(obj, param, words):
    err = refuse(line(obj))
    assert err.param == param
    assert words in str(err), str(err)
    assert str(err).startswith("line 7")


@pytest.mark.parametrize(("obj", "param", "words"), [
    ({"custom_id": "c", "url": CHAT_ENDPOINT, "body": {"messages": USER}}, "method",
     'method must be "POST"'),
    ({"custom_id": "c", "method": "GET", "url": CHAT_ENDPOINT, "body": {}}, "method", "GET"),
    ({"method": "POST", "url": CHAT_ENDPOINT, "body": {"messages": USER}}, "custom_id",
     "custom_id is required"),
    ({"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}}, "url",
     "'/v1/embeddings' is not supported; expected one of /v1/chat/completions"),
    ({"custom_id": "c", "method": "POST", "body": {}}, "url", "url is required"),
    ({"custom_id": "c", "method": "POST", "url": CHAT_ENDPOINT}, "body", "body is required"),
    ({"custom_id": "c", "method": "POST", "url": CHAT_ENDPOINT, "body": []}, "body",
     "body must be a JSON object, got an empty array"),
])
def test_batch_line_refusals(obj, param, words):
    err = refuse(line(obj))
    assert err.param == param and words in str(err), str(err)


def test_error_carries_custom_id_of_batch_line():
    err = refuse(batch_line({"messages": USER, "temperature": 9.0, "top_p": 0}, custom_id="z"))
    assert err.custom_id == "z" and str(err).startswith("line 7 (custom_id 'z'): top_p=0")


def test_parse_request_body_errors_have_no_prefix():
    with pytest.raises(RequestParseError) as info:
        parse_request_body({"prompt": "x", "bogus": 1}, endpoint=COMPLETIONS_ENDPOINT)
    assert str(info.value) == "unknown field 'bogus' for /v1/completions"
    with pytest.raises(RequestParseError, match="not supported"):
        parse_request_body({"prompt": "x"}, endpoint="/v1/responses")
    with pytest.raises(RequestParseError, match="finite"):
        parse_request_body({"prompt": "x", "top_p": float("nan")}, endpoint=COMPLETIONS_ENDPOINT)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 40) | st.floats(-3, 3) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8,
)
FIELDS = st.sampled_from(["prompt", "messages", "custom_id", "max_tokens", "temperature",
                          "top_p", "stop", "logprobs", "top_logprobs", "seed", "body", "url",
                          "method", "stream", "n", "min_tokens", "max_completion_tokens"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(FIELDS, JSON, max_size=5))
def test_any_object_parses_or_raises_request_parse_error(obj):
    try:
        req = parse_request_line(json.dumps(obj), line_number=1)
    except RequestParseError as err:
        assert str(err).startswith("line 1")
        return
    assert req.endpoint in (CHAT_ENDPOINT, COMPLETIONS_ENDPOINT)
    assert (req.prompt is None) != (req.messages is None)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30))
def test_any_text_parses_or_raises_request_parse_error(text):
    try:
        req = parse_request_line(text, line_number=2)
    except RequestParseError as err:
        assert str(err).startswith("line 2")
        return
    assert req.endpoint in (CHAT_ENDPOINT, COMPLETIONS_ENDPOINT)  # only a valid object parses
    assert (req.prompt is None) != (req.messages is None)


# -- output ---------------------------------------------------------------------------------


def test_format_batch_output_line_shape():
    text = format_batch_output_line(custom_id="c", request_id="req_1",
                                    response_body={"x": 1}, status_code=200, error=None)
    assert "\n" not in text
    out = json.loads(text)
    assert out["id"].startswith("batch_req_") and out["custom_id"] == "c"
    assert out["response"] == {"status_code": 200, "request_id": "req_1", "body": {"x": 1}}
    assert out["error"] is None


def test_format_error_line():
    out = json.loads(format_error_line(custom_id="line-3", request_id="req_2",
                                       message="line 3: bad", code="invalid_json"))
    assert out["response"]["status_code"] == 400
    assert out["response"]["body"] == {"error": {"message": "line 3: bad", "type":
                                                 "invalid_request_error", "param": None,
                                                 "code": "invalid_json"}}
    assert out["error"] == {"code": "invalid_json", "message": "line 3: bad"}
    server = json.loads(format_error_line(custom_id="c", request_id="r", message="m",
                                          code="engine_error", status_code=500))
    assert server["response"]["body"]["error"]["type"] == "server_error"


def body_for(req: GenerationRequest, logprobs=None) -> dict:
    return build_response_body(is_chat=req.is_chat, request_id="req_9", model="m",
                               choices=[Sample("Hello", "stop", logprobs)],
                               prompt_tokens=4, completion_tokens=2, created=1700000000,
                               with_logprobs=req.params.logprobs is not None)


LOGPROBS = [LogprobInfo("Hel", -0.5, [("Hel", -0.5), ("He", -1.5)]),
            LogprobInfo("lo", -0.25, [("lo", -0.25), ("p", -2.0)])]


def test_chat_completion_body():
    req = parse_request_body({"messages": USER}, endpoint=CHAT_ENDPOINT)
    body = body_for(req, LOGPROBS)  # not asked for: left out
    assert body == {
        "id": "chatcmpl-req_9", "object": "chat.completion", "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }


def test_chat_completion_logprobs():
    req = parse_request_body({"messages": USER, "logprobs": True, "top_logprobs": 2},
                             endpoint=CHAT_ENDPOINT)
    logprobs = body_for(req, LOGPROBS)["choices"][0]["logprobs"]
    assert logprobs["refusal"] is None
    first = logprobs["content"][0]
    assert first == {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108],
                     "top_logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
                                      {"token": "He", "logprob": -1.5, "bytes": [72, 101]}]}


def test_text_completion_body_and_logprobs():
    req = parse_request_body({"prompt": "x", "logprobs": 2}, endpoint=COMPLETIONS_ENDPOINT)
    body = body_for(req, LOGPROBS)
    assert body["id"] == "cmpl-req_9" and body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] == "Hello" and choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {
        "tokens": ["Hel", "lo"], "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"Hel": -0.5, "He": -1.5}, {"lo": -0.25, "p": -2.0}],
        "text_offset": [0, 3],
    }
    assert body["usage"]["total_tokens"] == 6


def test_output_line_round_trips_as_json():
    req = parse_request_line(line({"custom_id": "é", "prompt": "x"}), line_number=1)
    text = format_batch_output_line(custom_id=req.custom_id, request_id="r",
                                    response_body=body_for(req), status_code=200, error=None)
    assert json.loads(text)["custom_id"] == "é"


def test_protocol_never_imports_torch():
    code = ("import sys, worker.protocol.openai_batch; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'numpy') or m.startswith('worker.engine')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("text", "param"), [
    ('{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": '
     '{"name": "r", "description": 1e400, "schema": {"type": "object"}}}}', "response_format"),
    ('{"prompt": "x", "guided_choice": ["a", -1e999]}', "guided_choice"),
    ('{"prompt": "x", "metadata": {"k": "\\ud800"}}', "metadata"),
])  # fmt: skip
def test_every_stored_value_is_finite_and_encodable(text: str, param: str) -> None:
    """The one check every body passes: a number that overflows to infinity or a lone
    surrogate, wherever it sits, is that line's error naming the top-level field."""
    err = refuse(text)
    assert err.param == param and err.code in ("invalid_value", "invalid_encoding"), err


def test_an_integer_too_long_to_convert_is_that_lines_error() -> None:
    """Python refuses to convert integers of more than 4300 digits (a ValueError, not a
    JSONDecodeError): the line is refused as malformed, never raised out of the parser
    (a batch expansion would fail on it again and again)."""
    err = refuse('{"prompt": "x", "seed": ' + "9" * 5000 + "}")
    assert err.code == "invalid_json" and "digits" in str(err), err
