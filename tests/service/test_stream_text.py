"""Text deltas of streamed jobs (worker/service/stream_text.py): they add up to the decoded
output, hold back a tail that could start a stop string or an incomplete character, and
publish nothing twice."""

from __future__ import annotations

from worker.engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from worker.protocol.sampling_params import SamplingParams
from worker.service.stream_text import StreamTexts

VOCAB = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\xe2", 6: "\x82\xac", 7: " E", 8: "ND"}


class Bytes:
    """Tokens are byte strings (latin-1 here); decoding shows U+FFFD for a cut character,
    as a byte-level BPE tokenizer does."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        raw = "".join(VOCAB[i] for i in ids).encode("latin-1")
        return raw.decode("utf-8", errors="replace")


def _out(ids: list[int], index: int = 0, scored: bool = False) -> RequestOutput:
    logprobs = [TokenLogprob(t, -0.5 * t, {t: -0.5 * t, 2: -2.0}) for t in ids] if scored else None
    return RequestOutput(request_id="j", prompt=None, prompt_token_ids=[9], text="",
                         token_ids=ids, finish_reason=None, metrics=RequestMetrics(0.0),
                         index=index, logprobs=logprobs)


def _run(ids: list[int], params: SamplingParams) -> list[str]:
    streams = StreamTexts(Bytes())
    streams.add("j", params)
    got, pos = [], 0
    for k in range(1, len(ids) + 1):
        d = streams.update(_out(ids[:k]))
        if d is not None:
            assert d.pos == pos and d.job_id == "j" and d.index == 0
            pos += len(d.text)
            got.append(d.text)
    return got


def test_deltas_add_up_and_wait_for_whole_characters() -> None:
    ids = [1, 2, 3, 4, 5, 6, 7]
    got = _run(ids, SamplingParams(max_tokens=10))
    assert "".join(got) == Bytes().decode(ids) == "Hello world€ E"
    assert "\ufffd" not in "".join(got) and got[0] == "Hel"


def test_a_possible_stop_string_is_held_back() -> None:
    ids = [1, 2, 3, 4, 7]
    got = _run(ids, SamplingParams(max_tokens=10, stop=[" END"]))
    assert "".join(got) == "Hello world"  # " E" could begin " END": not published yet
    got = _run([*ids, 2], SamplingParams(max_tokens=10, stop=[" END"]))
    assert "".join(got) == "Hello world Elo"  # it did not: published with what follows


def test_unfollowed_jobs_and_samples_apart() -> None:
    streams = StreamTexts(Bytes())
    assert streams.update(_out([1])) is None  # not a streamed job
    streams.add("j", SamplingParams(max_tokens=4, n=2))
    a, b = streams.update(_out([1], index=0)), streams.update(_out([3], index=1))
    assert (a.index, a.text, b.index, b.text) == (0, "Hel", 1, " wor")
    assert streams.update(_out([1], index=0)) is None  # nothing new
    streams.discard(["j"])
    assert "j" not in streams
    assert StreamTexts(None).update(_out([1])) is None


def test_scores_go_with_the_text_of_their_tokens() -> None:
    """Each delta carries the scored positions whose text it completes: a cut character's
    tokens wait for the delta that ends it, a held-back stop prefix's token for the delta
    that publishes its text; positions follow on without gaps or repeats."""
    streams = StreamTexts(Bytes())
    streams.add("j", SamplingParams(max_tokens=10, stop=[" END"], logprobs=1))
    ids = [1, 2, 5, 6, 7, 3]
    got = [streams.update(_out(ids[:k], scored=True)) for k in range(1, len(ids) + 1)]
    published = [(d.text, d.lp_pos, [lp["token"] for lp in d.logprobs or []])
                 for d in got if d is not None]
    assert published == [
        ("Hel", 0, ["Hel"]),
        ("lo", 1, ["lo"]),
        ("\u20ac", 2, ["\ufffd", "\ufffd\ufffd"]),  # the euro sign settles with its 2nd token
        (" E wor", 4, [" E", " wor"]),  # " E" was held back: it could begin " END"
    ]
    first = next(d for d in got if d is not None)
    assert first.logprobs == [{"token": "Hel", "logprob": -0.5, "top": [["Hel", -0.5],
                                                                          ["lo", -2.0]]}]
    fields = first.fields()
    assert fields["q"] == "0" and fields["l"].startswith("[")
    plain = StreamTexts(Bytes())
    plain.add("j", SamplingParams(max_tokens=4))
    d = plain.update(_out([1]))
    assert d is not None and d.logprobs is None and "l" not in d.fields()
