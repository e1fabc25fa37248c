"""The sampler and the stop checker cannot be poisoned by one row: non-finite logits fail
that row alone, logit_bias is honoured or refused per row, and stop-string matching
does not grow with the output or with the number of stop strings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from worker.engine.sampler import NON_FINITE_ERROR, Sampler
from worker.engine.stop_matcher import StopMatcher
from worker.engine.stopping import StopChecker
from worker.protocol.sampling_params import SamplingParams


@dataclass
class Row:
    params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2])
    output_token_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


def _rows(*params: SamplingParams) -> list[Row]:
    return [Row(p) for p in params]


def test_non_finite_rows_fail_alone_and_the_input_is_untouched() -> None:
    logits = torch.tensor(
        [
            [0.0, 5.0, 1.0, 0.0],
            [float("nan"), 1.0, 0.0, 0.0],
            [0.0, float("inf"), 0.0, 0.0],
            [float("-inf")] * 4,
            [3.0, 0.0, 0.0, 0.0],
        ]
    )
    before = logits.clone()
    rows = _rows(
        SamplingParams(temperature=0),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.9, top_p=0.5),
    )
    out = Sampler(eos_token_ids={9}, device="cpu").sample(logits, rows)
    assert out.errors == [None, NON_FINITE_ERROR, NON_FINITE_ERROR, NON_FINITE_ERROR, None]
    assert out.token_ids[0] == 1 and out.token_ids[4] == 0
    assert torch.equal(torch.nan_to_num(logits), torch.nan_to_num(before))


def test_temperature_overflow_is_caught_after_dividing() -> None:
    logits = torch.tensor([[3.0e38, 0.0, -3.0e38], [1.0, 2.0, 0.0]])
    rows = _rows(SamplingParams(temperature=0.5), SamplingParams(temperature=0.5, seed=1))
    out = Sampler(eos_token_ids=set(), device="cpu").sample(logits, rows)
    assert out.errors[0] == NON_FINITE_ERROR and out.errors[1] is None


def test_logit_bias_moves_the_argmax_and_bad_ids_fail_their_row() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    rows = _rows(
        SamplingParams(temperature=0, logit_bias={2: 100.0}),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, logit_bias={7: 1.0}),
    )
    out = Sampler(eos_token_ids=set(), device="cpu").sample(logits, rows)
    assert out.token_ids[:2] == [2, 0]
    assert out.errors[0] is None and out.errors[1] is None
    assert "outside this model's vocabulary of 3 tokens" in (out.errors[2] or "")


def test_matcher_finds_the_earliest_stop_like_a_search_of_each() -> None:
    stops = ["abc", "bc", "c", "zz", "bcd"]
    matcher = StopMatcher(stops)
    for text in ["xxabcd", "bcbc", "zzc", "nothing", "aabcabc", "cab"]:
        found = [(text.find(s), i) for i, s in enumerate(stops) if s in text]
        expect = min(found) if found else None
        got = matcher.earliest(text)
        assert got == (None if expect is None else (expect[0], stops[expect[1]])), text
    assert matcher.earliest("abc", end_from=3) is None  # must end in new text
    assert matcher.earliest("abcc", end_from=3) == (3, "c")


class _CharTokenizer:
    """Token id i decodes to chr(97 + i % 26); id 0 is a special token skipped."""

    def __init__(self) -> None:
        self.decoded_chars = 0

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        text = "".join(chr(97 + t % 26) for t in token_ids if not (skip_special_tokens and t == 0))
        self.decoded_chars += len(token_ids)
        return text


def test_stop_check_cost_does_not_grow_with_output_or_with_stop_count() -> None:
    tok = _CharTokenizer()
    checker = StopChecker(tokenizer=tok, eos_token_ids=set(), max_model_len=1 << 20)
    params = SamplingParams(stop=[f"q{i:02d}" for i in range(16)], max_tokens=100_000)
    for length in (1_000, 50_000):
        output = [1 + (i % 5) for i in range(length)]
        tok.decoded_chars = 0
        assert not checker.check(prompt_len=1, output_token_ids=output, params=params).finished
        assert tok.decoded_chars < 100, length  # a tail window, not the whole output
    empty_tail = [1] * 1000 + [0] * 20_000  # skipped special tokens decode to nothing
    tok.decoded_chars = 0
    checker.check(prompt_len=1, output_token_ids=empty_tail, params=params)
    assert tok.decoded_chars < 2_000
    many = StopMatcher([f"stop-{i:04d}" for i in range(2_000)])
    few = StopMatcher(["stop-0001"])
    text = "x" * 20_000
    t0 = time.perf_counter()
    many.earliest(text)
    t_many = time.perf_counter() - t0
    t0 = time.perf_counter()
    few.earliest(text)
    t_few = time.perf_counter() - t0
    assert t_many < 5 * t_few + 0.01


def test_stop_string_is_still_found_and_cut() -> None:
    checker = StopChecker(tokenizer=_CharTokenizer(), eos_token_ids=set(), max_model_len=1000)
    params = SamplingParams(stop=["zz", "cde"], max_tokens=50)
    ids = [1, 2, 3, 4]  # "bcde"
    decision = checker.check(prompt_len=1, output_token_ids=ids, params=params)
    assert decision.finished and decision.stop_reason == "cde" and decision.text == "b"


def test_engine_fails_a_poisoned_request_alone() -> None:
    """A row whose logits turn NaN mid-generation fails that request alone; its
    batch-mates finish with the same tokens as when run without it, and no step raises."""
    from worker.engine.llm_engine import LLMEngine

    engine = LLMEngine(
        model="tiny-llama", num_kv_blocks=128, max_num_seqs=8, attention_backend="torch",
        prepack_weights=False,
    )
    execute = engine.runner.execute

    def poisoned(plan, between_layers=None):  # a "bad" row's logits become NaN at its 3rd token
        logits = execute(plan, between_layers).clone()
        for s, row in plan.logits_rows.owners:  # [rows, vocab]: the plan's one row layout
            if s.seq.request_id.startswith("bad") and len(s.seq.output_token_ids) == 2:
                logits[row] = float("nan")
        return logits

    engine.runner.execute = poisoned  # type: ignore[method-assign]

    def run(tag: str, poison: bool) -> dict[str, tuple[list[int], str | None]]:
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        prompts = {"good-0": [5, 6, 7], "bad": [8, 9, 10], "good-1": [11, 12]}
        for rid, prompt in prompts.items():
            if poison or rid != "bad":
                engine.add_request(f"{rid}-{tag}", prompt, params)
        done: dict[str, tuple[list[int], str | None]] = {}
        while engine.has_unfinished_requests():
            outputs, _ = engine.step()
            for o in outputs:
                if o.finished:
                    done[o.request_id.rsplit("-", 1)[0]] = (list(o.token_ids), o.error)
        return done

    clean, poisoned_run = run("a", False), run("b", True)
    assert poisoned_run["bad"][1] == NON_FINITE_ERROR and len(poisoned_run["bad"][0]) == 2
    for rid in ("good-0", "good-1"):
        assert poisoned_run[rid] == clean[rid] and clean[rid][1] is None
        assert len(clean[rid][0]) == 6


def test_a_drafted_sequence_with_non_finite_logits_fails_alone() -> None:
    """The draft verifier takes the argmax of each drafted row: a NaN row there would pick a
    meaningless token, so such a sequence fails alone, as a sampled row does."""
    from worker.engine.outputs import RequestMetrics
    from worker.engine.sequence import Sequence
    from worker.engine.speculation import verify_drafts
    from worker.engine.step_plan import ScheduledSequence

    def drafted(rid: str) -> ScheduledSequence:
        seq = Sequence(rid, [1, 2, 3], SamplingParams(temperature=0), RequestMetrics(0.0))
        seq.num_computed_tokens = 2  # the last prompt token plus two drafts run this step
        seq.draft_token_ids = [2, 2]
        return ScheduledSequence(seq, num_new_tokens=3, num_draft_tokens=2)

    good, bad = drafted("good"), drafted("bad")
    logits = torch.full((6, 4), -1.0)  # [2 sequences x 3 rows, vocab]
    logits[:, 2] = 1.0  # every row agrees with the drafts
    logits[4, 0] = float("nan")  # the bad sequence's second row
    results, accepted, failed = verify_drafts([(good, 0), (bad, 3)], logits)
    assert [r.seq.request_id for r in results] == ["good"] and accepted == 2
    assert [(s.request_id, why) for s, why in failed] == [("bad", NON_FINITE_ERROR)]
    assert bad.seq.draft_token_ids == [] and good.seq.draft_token_ids == []
