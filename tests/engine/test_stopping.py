"""StopChecker against a real (tiny, in-memory, deterministic) byte-level BPE tokenizer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from worker.engine.stopping import StopChecker, StopDecision
from worker.protocol.sampling_params import SamplingParams

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Stop here and END now.",
    "A stitch in time saves nine. STOP.",
    "Numbers: 12345 and 67890; the end of the story.",
    "Observation: the answer is 42. Question: what next?",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=330,
        special_tokens=["<eos>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


class CountingTokenizer:
    """Wraps a tokenizer, recording the length of every decode call."""

    def __init__(self, inner: PreTrainedTokenizerFast) -> None:
        self.inner = inner
        self.calls: list[int] = []
        self.eos_token_id = inner.eos_token_id

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        self.calls.append(len(token_ids))
        return str(self.inner.decode(token_ids, skip_special_tokens=skip_special_tokens))


def enc(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def checker(tokenizer, max_model_len: int = 10_000) -> StopChecker:
    return StopChecker(
        tokenizer=tokenizer, eos_token_ids={tokenizer.eos_token_id}, max_model_len=max_model_len
    )


def run(
    c: StopChecker, ids: list[int], params: SamplingParams, prompt_len: int = 3
) -> tuple[int, StopDecision]:
    """Append ``ids`` one at a time like the engine; return (tokens generated, decision)."""
    out: list[int] = []
    for token in ids:
        out.append(token)
        decision = c.check(prompt_len=prompt_len, output_token_ids=out, params=params)
        if decision.finished:
            return len(out), decision
    return len(out), StopDecision(None, None, None)


def first_stop_reference(
    tokenizer, ids: list[int], stops: list[str]
) -> tuple[int, str, str] | None:
    """Brute force: decode every prefix, stop at the first that contains a stop string."""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n], skip_special_tokens=True)
        found = [(text.find(s), i, s) for i, s in enumerate(stops) if s in text]
        if found:
            index, _, stop = min(found)
            return n, stop, text[:index]
    return None


# ----------------------------------------------------------- stop strings


def test_tokenizer_splits_the_test_strings(tokenizer) -> None:
    """The cases below rely on these strings taking several tokens."""
    assert len(enc(tokenizer, "Observation:")) > 1
    assert len(enc(tokenizer, "日")) == 3  # one character, three byte tokens


def test_stop_string_spanning_tokens(tokenizer) -> None:
    c = checker(tokenizer)
    text = "the answer is 42. Observation: more text"
    ids = enc(tokenizer, text)
    params = SamplingParams(max_tokens=100, stop=["Observation:"])
    n, decision = run(c, ids, params)
    assert decision == StopDecision("stop", "Observation:", "the answer is 42. ")
    # it stops at the token that completes the stop string, not later, not earlier
    assert "Observation:" in tokenizer.decode(ids[:n])
    assert "Observation:" not in tokenizer.decode(ids[: n - 1])


def test_stop_string_inside_one_token(tokenizer) -> None:
    c = checker(tokenizer)
    ids = enc(tokenizer, "Hello world! Stop here")
    n, decision = run(c, ids, SamplingParams(max_tokens=100, stop=["ell"]))
    assert decision == StopDecision("stop", "ell", "H")
    assert "ell" in tokenizer.decode(ids[:n]) and "ell" not in tokenizer.decode(ids[: n - 1])


def test_stop_string_at_the_very_start(tokenizer) -> None:
    c = checker(tokenizer)
    ids = enc(tokenizer, "STOP. and then more")
    assert run(c, ids, SamplingParams(max_tokens=100, stop=["STOP"]))[1] == StopDecision(
        "stop", "STOP", ""
    )
    ids = enc(tokenizer, "Hello world")
    n, decision = run(c, ids, SamplingParams(max_tokens=100, stop=["H"]))
    assert (n, decision) == (1, StopDecision("stop", "H", ""))


def test_earliest_of_several_stop_strings_wins(tokenizer) -> None:
    c = checker(tokenizer)
    ids = enc(tokenizer, "Stop here and END now.")
    decision = run(c, ids, SamplingParams(max_tokens=100, stop=["now", "END", "here"]))[1]
    assert decision == StopDecision("stop", "here", "Stop ")
    # two stop strings completed by the same token: the one starting earlier wins,
    # whatever the order they are listed in
    ids = enc(tokenizer, "xbcdef")
    assert tokenizer.decode(ids[-1:]) == "f"
    for stops in (["cdef", "ef"], ["ef", "cdef"]):
        n, decision = run(c, ids, SamplingParams(max_tokens=100, stop=stops))
        assert (n, decision) == (len(ids), StopDecision("stop", "cdef", "xb"))
    # same start: the one listed first
    for stops in (["cde", "cdef"], ["cdef", "cde"]):
        assert run(c, ids, SamplingParams(max_tokens=100, stop=stops))[1].text == "xb"
    assert run(c, ids, SamplingParams(stop=["cdef", "cdefg"]))[1].stop_reason == "cdef"


def test_stop_string_made_of_multi_byte_characters(tokenizer) -> None:
    c = checker(tokenizer)
    text = "the end 日本🙂 is here"
    ids = enc(tokenizer, text)
    for stop, before in (("日本", "the end "), ("🙂", "the end 日本"), ("本🙂 is", "the end 日")):
        n, decision = run(c, ids, SamplingParams(max_tokens=100, stop=[stop]))
        assert decision == StopDecision("stop", stop, before)
        # exactly when the last byte of the stop string arrives
        assert stop in tokenizer.decode(ids[:n]) and stop not in tokenizer.decode(ids[: n - 1])


def test_no_stop_string_no_stop(tokenizer) -> None:
    c = checker(tokenizer)
    ids = enc(tokenizer, "The quick brown fox jumps over the lazy dog.")
    n, decision = run(c, ids, SamplingParams(max_tokens=100, stop=["cat", "Fox"]))
    assert (n, decision.finished) == (len(ids), False)


def test_stop_string_is_not_matched_in_text_before_min_tokens(tokenizer) -> None:
    c = checker(tokenizer)
    ids = enc(tokenizer, "Hello world! Stop here and END now.")
    n_hello = next(n for n in range(1, len(ids) + 1) if "Hello" in tokenizer.decode(ids[:n]))
    params = SamplingParams(max_tokens=100, min_tokens=n_hello + 1, stop=["Hello", "END"])
    decision = run(c, ids, params)[1]
    assert decision == StopDecision("stop", "END", "Hello world! Stop here and ")


def test_stop_strings_use_skip_special_tokens(tokenizer) -> None:
    c = checker(tokenizer)
    eos = tokenizer.eos_token_id
    ids = [*enc(tokenizer, "Hello"), eos, *enc(tokenizer, " world")]
    keep = SamplingParams(
        max_tokens=100, ignore_eos=True, skip_special_tokens=False, stop=["o<eos> w"]
    )
    assert run(c, ids, keep)[1] == StopDecision("stop", "o<eos> w", "Hell")
    skip = SamplingParams(max_tokens=100, ignore_eos=True, stop=["o w", "o<eos> w"])
    assert run(c, ids, skip)[1] == StopDecision("stop", "o w", "Hell")


def test_stop_string_decodes_only_a_tail_window(tokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    c = checker(counting)
    sentence = enc(tokenizer, "The quick brown fox jumps over the lazy dog. ")
    ids = sentence * 40 + enc(tokenizer, "Observation: x")
    params = SamplingParams(max_tokens=5000, stop=["Observation:", "END"])
    n, decision = run(c, ids, params)
    assert decision.finish_reason == "stop"
    assert decision.text == tokenizer.decode(sentence * 40)
    full_decodes = [k for k in counting.calls if k > 40]
    assert full_decodes == [n]  # the whole output is decoded once, at the match
    assert max(k for k in counting.calls if k != n) <= 2 * (len("Observation:") + 3)
    assert len(counting.calls) <= 2 * n + 1


def test_no_tokenizer_work_without_stop_strings(tokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    c = checker(counting)
    ids = enc(tokenizer, "The quick brown fox jumps over the lazy dog.")
    run(c, ids, SamplingParams(max_tokens=100, stop_token_ids=[5]))
    run(c, [*ids, tokenizer.eos_token_id], SamplingParams(max_tokens=100))
    assert counting.calls == []


def test_window_widens_over_multi_byte_characters(tokenizer) -> None:
    """Many tokens per character: the decoded tail must still hold the stop string."""
    c = checker(CountingTokenizer(tokenizer))
    text = "日本日本日本日本 x 日本日本日本日本日本"
    ids = enc(tokenizer, text)
    stop = "本日本日本日本日本"  # 9 characters, about 27 tokens
    decision = run(c, ids, SamplingParams(max_tokens=500, stop=[stop]))[1]
    assert decision == StopDecision("stop", stop, "日本日本日本日本 x 日")


@settings(max_examples=120, deadline=None)
@given(
    text=st.text(alphabet=list("ab cé日🙂.XY"), min_size=1, max_size=30),
    stops=st.lists(
        st.text(alphabet=list("ab cé日🙂.XY"), min_size=1, max_size=4), min_size=1, max_size=3
    ),
)
def test_stop_strings_match_brute_force_on_encoded_text(
    tokenizer, text: str, stops: list[str]
) -> None:
    ids = enc(tokenizer, text)
    n, decision = run(checker(tokenizer), ids, SamplingParams(max_tokens=500, stop=stops))
    reference = first_stop_reference(tokenizer, ids, stops)
    if reference is None:
        assert not decision.finished
    else:
        assert (n, decision.stop_reason, decision.text) == reference


@settings(max_examples=120, deadline=None)
@given(
    ids=st.lists(st.integers(2, 329), min_size=1, max_size=40),
    stops=st.lists(
        st.text(alphabet=list("ab cé日.eostTh"), min_size=1, max_size=5), min_size=1, max_size=3
    ),
)
def test_stop_strings_match_brute_force_on_random_tokens(
    tokenizer, ids: list[int], stops: list[str]
) -> None:
    """Arbitrary token ids, including byte tokens that cut characters anywhere."""
    n, decision = run(checker(tokenizer), ids, SamplingParams(max_tokens=500, stop=stops))
    reference = first_stop_reference(tokenizer, ids, stops)
    if reference is None:
        assert not decision.finished
    else:
        assert (n, decision.stop_reason, decision.text) == reference


# ------------------------------------------------------- eos, stop tokens


def test_eos_stops_unless_ignore_eos(tokenizer) -> None:
    c = checker(tokenizer)
    eos = tokenizer.eos_token_id
    ids = [*enc(tokenizer, "Hello"), eos, *enc(tokenizer, " world")]
    n, decision = run(c, ids, SamplingParams(max_tokens=100))
    assert (n, decision) == (ids.index(eos) + 1, StopDecision("stop", None, None))
    n, decision = run(c, ids, SamplingParams(max_tokens=100, ignore_eos=True))
    assert (n, decision.finished) == (len(ids), False)


def test_other_eos_ids_stop_too(tokenizer) -> None:
    c = StopChecker(tokenizer=tokenizer, eos_token_ids={0, 7}, max_model_len=100)
    decision = c.check(prompt_len=1, output_token_ids=[5, 7], params=SamplingParams())
    assert decision == StopDecision("stop", None, None)


def test_stop_token_ids(tokenizer) -> None:
    c = checker(tokenizer)
    ids = enc(tokenizer, "Hello world! Stop here")
    target = ids[3]
    n, decision = run(c, ids, SamplingParams(max_tokens=100, stop_token_ids=[999, target]))
    assert (n, decision) == (ids.index(target) + 1, StopDecision("stop", target, None))
    # stop_token_ids apply with ignore_eos as well
    n, decision = run(
        c, ids, SamplingParams(max_tokens=100, ignore_eos=True, stop_token_ids=[target])
    )
    assert decision.stop_reason == target


def test_min_tokens_delays_eos_and_stop_token_ids(tokenizer) -> None:
    c = checker(tokenizer)
    eos = tokenizer.eos_token_id
    ids = [11, eos, 12, 13, eos, 14]
    n, decision = run(c, ids, SamplingParams(max_tokens=100, min_tokens=3))
    assert (n, decision.finish_reason) == (5, "stop")
    n, decision = run(
        c, [11, 12, 13, 12, 14], SamplingParams(max_tokens=100, min_tokens=4, stop_token_ids=[12])
    )
    assert (n, decision) == (4, StopDecision("stop", 12, None))
    n, decision = run(c, [eos, 11], SamplingParams(max_tokens=100, min_tokens=1))
    assert (n, decision.finish_reason) == (1, "stop")  # min_tokens=1 is met by the eos itself


# ------------------------------------------------------------------ length


def test_max_tokens_gives_length(tokenizer) -> None:
    c = checker(tokenizer)
    ids = enc(tokenizer, "The quick brown fox jumps over the lazy dog.")
    n, decision = run(c, ids, SamplingParams(max_tokens=4))
    assert (n, decision) == (4, StopDecision("length", None, None))
    n, decision = run(c, ids, SamplingParams(max_tokens=None))
    assert (n, decision.finished) == (len(ids), False)


def test_max_model_len_gives_length(tokenizer) -> None:
    c = checker(tokenizer, max_model_len=10)
    ids = enc(tokenizer, "The quick brown fox jumps over the lazy dog.")
    n, decision = run(c, ids, SamplingParams(max_tokens=None), prompt_len=7)
    assert (n, decision) == (3, StopDecision("length", None, None))
    # also while under min_tokens: the context cannot grow further
    n, decision = run(c, ids, SamplingParams(max_tokens=50, min_tokens=20), prompt_len=7)
    assert (n, decision.finish_reason) == (3, "length")


def test_stop_wins_over_length_on_the_same_token(tokenizer) -> None:
    c = checker(tokenizer, max_model_len=6)
    eos = tokenizer.eos_token_id
    assert run(c, [11, 12, eos], SamplingParams(max_tokens=3))[1].finish_reason == "stop"
    assert (
        run(c, [11, 12, eos], SamplingParams(max_tokens=50), prompt_len=3)[1].finish_reason
        == "stop"
    )
    assert (
        run(c, [11, 12, 13], SamplingParams(max_tokens=3, stop_token_ids=[13]))[1].stop_reason == 13
    )
    ids = enc(tokenizer, "Hello world")
    c = checker(tokenizer, max_model_len=3 + len(ids))
    decision = run(c, ids, SamplingParams(max_tokens=len(ids), stop=["world"]))[1]
    assert decision == StopDecision("stop", "world", "Hello ")


# -------------------------------------------------------------- final text


def test_final_text(tokenizer) -> None:
    c = checker(tokenizer)
    eos = tokenizer.eos_token_id
    hello = enc(tokenizer, "Hello world")
    assert c.final_text([*hello, eos], SamplingParams()) == "Hello world"
    assert c.final_text([*hello, eos], SamplingParams(skip_special_tokens=False)) == "Hello world"
    ignoring = SamplingParams(skip_special_tokens=False, ignore_eos=True)
    assert c.final_text([*hello, eos], ignoring) == "Hello world<eos>"
    head, tail = tokenizer.decode(hello[:2]), tokenizer.decode(hello[2:])
    assert c.final_text([*hello[:2], eos, *hello[2:]], ignoring) == f"{head}<eos>{tail}"
    stop_id = hello[-1]
    assert c.final_text(hello, SamplingParams(stop_token_ids=[stop_id])) == tokenizer.decode(
        hello[:-1]
    )
    assert c.final_text(hello, SamplingParams()) == "Hello world"
    assert c.final_text([], SamplingParams()) == ""


def test_keep_going_decisions_are_independent_objects(tokenizer) -> None:
    """The engine may edit a decision (e.g. set "length"); that must not leak."""
    c = checker(tokenizer)
    first = c.check(prompt_len=1, output_token_ids=[11], params=SamplingParams(max_tokens=50))
    first.finish_reason = "length"
    second = c.check(prompt_len=1, output_token_ids=[11, 12], params=SamplingParams(max_tokens=50))
    assert second == StopDecision(None, None, None)
