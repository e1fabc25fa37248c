"""Sampler: handmade logits over a small vocabulary, fixed seeds (no flaky draws)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from worker.engine import sampler as sampler_module
from worker.engine.rank_filter import rank_filter_mask
from worker.engine.sampler import Sampler, make_generator
from worker.protocol.sampling_params import SamplingParams

VOCAB = 8
EOS = 7


@dataclass
class Row:
    """A stand-in for a sequence, satisfying SamplingInput."""

    params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None

    @classmethod
    def of(cls, prompt: list[int] | None = None, output: list[int] | None = None, **kw) -> Row:
        params = SamplingParams(**kw)
        return cls(
            params, list(prompt or []), list(output or []), make_generator(params.seed, "cpu")
        )


def sampler(seed: int = 0) -> Sampler:
    return Sampler(eos_token_ids={EOS}, device="cpu", seed=seed)


def logits_of(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


@pytest.fixture(params=["full_sort", "candidates"])
def rank_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the full-vocabulary sort and with the top-k candidate shortcut."""
    if request.param == "candidates":
        monkeypatch.setattr(sampler_module, "NUM_CANDIDATES", 2)  # 2 <= VOCAB // 2: used
    return str(request.param)


def draw(s: Sampler, logits: torch.Tensor, make_row, n: int) -> Counter[int]:
    """Sample ``n`` copies of a one-row batch as one batch of ``n`` rows, count the tokens."""
    rows = [make_row() for _ in range(n)]
    return Counter(s.sample(logits.expand(n, logits.shape[1]), rows).token_ids)


# ------------------------------------------------------------------- greedy


def test_greedy_is_argmax_with_ties_to_lowest_index() -> None:
    logits = logits_of(
        [0.0, 3.0, 3.0, 1.0, -1.0, 2.0, 0.5, 0.0],
        [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0],
        [-4.0, -3.0, -2.0, -9.0, -1.0, -1.0, -5.0, -8.0],
    )
    rows = [Row.of(temperature=0.0) for _ in range(3)]
    out = sampler().sample(logits, rows)
    assert out.token_ids == [1, 0, 4]
    assert out.token_ids == torch.argmax(logits, dim=-1).tolist()
    assert out.logprobs == [None, None, None]


def test_all_greedy_batch_draws_no_randomness() -> None:
    s = sampler()
    seeded = Row.of(temperature=0.0, seed=5)
    assert seeded.generator is not None
    before_shared = s.generator.get_state().clone()
    before_row = seeded.generator.get_state().clone()
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    original = logits.clone()
    out = s.sample(logits, [seeded, Row.of(temperature=0.0)])
    assert out.token_ids == torch.argmax(logits, dim=-1).tolist()
    assert torch.equal(s.generator.get_state(), before_shared)
    assert torch.equal(seeded.generator.get_state(), before_row)
    assert torch.equal(logits, original)  # the input is never modified


def test_greedy_rows_in_a_mixed_batch_are_argmax() -> None:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(6, VOCAB, generator=gen)
    logits[0, 2] = logits[0, 5] = logits[0].max() + 1.0  # a tie in a greedy row
    rows = [Row.of(temperature=0.0 if i % 2 == 0 else 1.0) for i in range(6)]
    out = sampler().sample(logits, rows)
    expected = torch.argmax(logits, dim=-1).tolist()
    assert [out.token_ids[i] for i in (0, 2, 4)] == [expected[i] for i in (0, 2, 4)]
    assert out.token_ids[0] == 2


def test_tiny_temperature_is_greedy() -> None:
    logits = logits_of([0.0, 1.0, 1.0, 0.9, 0.0, 0.0, 0.0, 0.0])
    s = sampler()
    assert draw(s, logits, lambda: Row.of(temperature=1e-7), 50) == Counter({1: 50})


# ----------------------------------------------------------- top-k, top-p, min-p


def test_top_k_1_equals_greedy_including_ties(rank_path: str) -> None:
    logits = logits_of([0.0, 2.0, 4.0, 4.0, 3.9, 0.0, 0.0, 0.0])
    s = sampler()
    assert draw(s, logits, lambda: Row.of(temperature=1.5, top_k=1), 100) == Counter({2: 100})


def test_top_k_keeps_the_k_best(rank_path: str) -> None:
    logits = logits_of([0.0, 1.0, 1.2, 1.1, 0.9, 0.0, 0.0, 0.0])
    counts = draw(sampler(1), logits, lambda: Row.of(temperature=1.0, top_k=3), 600)
    assert set(counts) == {1, 2, 3}


# probabilities 0.5, 0.3, 0.15, 0.05 on tokens 3, 0, 6, 1; the rest impossible
FOUR = [
    math.log(0.3),
    math.log(0.05),
    -math.inf,
    math.log(0.5),
    -math.inf,
    -math.inf,
    math.log(0.15),
    -math.inf,
]


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.4, {3}),  # 0.5 already reaches 0.4
        (0.75, {3, 0}),  # 0.5 < 0.75 <= 0.8
        (0.9, {3, 0, 6}),  # 0.8 < 0.9 <= 0.95
        (0.97, {3, 0, 6, 1}),
        (1.0, {3, 0, 6, 1}),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(
    top_p: float, kept: set[int], rank_path: str
) -> None:
    counts = draw(sampler(2), logits_of(FOUR), lambda: Row.of(temperature=1.0, top_p=top_p), 1500)
    assert set(counts) == kept


def test_top_p_renormalizes_over_the_kept_set(rank_path: str) -> None:
    counts = draw(sampler(3), logits_of(FOUR), lambda: Row.of(temperature=1.0, top_p=0.75), 2000)
    # kept {3: 0.5, 0: 0.3} -> 0.625 / 0.375
    assert abs(counts[3] / 2000 - 0.625) < 0.05


@pytest.mark.parametrize(
    ("min_p", "kept"),
    [
        (0.05, {3, 0, 6, 1}),  # threshold 0.025
        (0.25, {3, 0, 6}),  # threshold 0.125: 0.05 goes
        (0.5, {3, 0}),  # threshold 0.25: 0.15 goes
        (0.7, {3}),  # threshold 0.35
    ],
)
def test_min_p_drops_tokens_below_min_p_times_the_top_probability(
    min_p: float, kept: set[int]
) -> None:
    counts = draw(sampler(4), logits_of(FOUR), lambda: Row.of(temperature=1.0, min_p=min_p), 1500)
    assert set(counts) == kept


def test_per_row_filters_in_one_batch(rank_path: str) -> None:
    """Each row gets its own top-k / top-p / min-p from the batched parameter tensors."""
    s = sampler(5)
    makers = [
        lambda: Row.of(temperature=1.0, top_k=2),
        lambda: Row.of(temperature=1.0, top_p=0.9),
        lambda: Row.of(temperature=1.0, min_p=0.7),
        lambda: Row.of(temperature=1.0),
    ]
    rows = [make() for _ in range(800) for make in makers]  # interleaved
    tokens = s.sample(logits_of(FOUR).expand(len(rows), VOCAB), rows).token_ids
    seen = [set(tokens[i::4]) for i in range(4)]
    assert seen == [{3, 0}, {3, 0, 6}, {3}, {3, 0, 6, 1}]


# ------------------------------------------------------------- temperature


def chi_square(counts: Counter[int], probs: torch.Tensor, n: int) -> float:
    return sum((counts[t] - n * p) ** 2 / (n * p) for t, p in enumerate(probs.tolist()) if p > 0)


def test_temperature_sampling_matches_softmax() -> None:
    raw = [1.0, 0.2, -0.5, 0.8, 0.0, -1.0, 0.4, -2.0]
    logits = logits_of(raw)
    n = 4000
    counts = draw(sampler(6), logits, lambda: Row.of(temperature=0.7), n)
    expected = torch.softmax(torch.tensor(raw) / 0.7, dim=-1)
    wrong = torch.softmax(torch.tensor(raw), dim=-1)  # temperature ignored
    # df = 7: the 99.9% quantile is 24.3
    assert chi_square(counts, expected, n) < 24.3
    assert chi_square(counts, wrong, n) > 100


def test_unseeded_rows_in_one_batch_draw_independently() -> None:
    """A batch of identical unseeded rows must not give all rows the same token."""
    logits = torch.zeros(16, VOCAB)
    out = sampler(7).sample(logits, [Row.of(temperature=1.0) for _ in range(16)])
    assert len(set(out.token_ids)) > 3


# ------------------------------------------------------------------ seeds


def test_seeded_row_gives_the_same_tokens_alone_and_in_any_batch() -> None:
    gen = torch.Generator().manual_seed(123)
    steps = [torch.randn(VOCAB, generator=gen) * 0.5 for _ in range(50)]

    def run(batch_with: int, sampler_seed: int) -> list[int]:
        s = sampler(sampler_seed)
        me = Row.of(temperature=0.9, seed=1234)
        other_seeded = Row.of(temperature=1.0, seed=99)
        tokens = []
        for t, row_logits in enumerate(steps):
            if batch_with == 0:
                rows, logits, pos = [me], row_logits.unsqueeze(0), 0
            else:
                # other rows around it: unseeded, seeded, greedy, penalized; position varies
                others = [
                    Row.of(temperature=1.0),
                    other_seeded,
                    Row.of(temperature=0.0),
                    Row.of(temperature=1.2, top_p=0.8, presence_penalty=1.0, output=[1, 2]),
                ][:batch_with]
                pos = t % (len(others) + 1)
                rows = [*others[:pos], me, *others[pos:]]
                other_logits = torch.randn(len(rows), VOCAB, generator=gen)
                other_logits[pos] = row_logits
                logits = other_logits
            token = s.sample(logits, rows).token_ids[pos]
            me.output_token_ids.append(token)
            tokens.append(token)
        return tokens

    alone = run(0, sampler_seed=0)
    assert run(4, sampler_seed=0) == alone
    assert run(2, sampler_seed=77) == alone
    assert run(4, sampler_seed=5) == alone
    assert len(set(alone)) > 3  # it does sample


def test_different_seeds_give_different_tokens() -> None:
    logits = torch.zeros(1, VOCAB)

    def tokens(seed: int) -> list[int]:
        s, row = sampler(), Row.of(temperature=1.0, seed=seed)
        return [s.sample(logits, [row]).token_ids[0] for _ in range(30)]

    assert tokens(1) == tokens(1)
    assert tokens(1) != tokens(2)


def test_make_generator() -> None:
    assert make_generator(None, "cpu") is None
    a, b = make_generator(42, "cpu"), make_generator(42, torch.device("cpu"))
    assert a is not None and b is not None
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
    assert make_generator(2**70 + 3, "cpu") is not None  # any int is accepted
    assert make_generator(-1, "cpu") is not None


# -------------------------------------------------------------- penalties


def penalized_logprobs(logits: list[float], **kw) -> list[float]:
    """Full logprob vector the sampler reports (logprobs are taken after penalties)."""
    prompt, output = kw.pop("prompt", []), kw.pop("output", [])
    row = Row.of(prompt, output, temperature=0.0, logprobs=VOCAB, **kw)
    lp = sampler().sample(logits_of(logits), [row]).logprobs[0]
    assert lp is not None
    return [lp.top[t] for t in range(VOCAB)]


def expected_logprobs(logits: list[float]) -> list[float]:
    return torch.log_softmax(torch.tensor(logits), dim=-1).tolist()


BASE = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0, 0.25]


def test_repetition_penalty_divides_positive_and_multiplies_negative_over_prompt_and_output() -> (
    None
):
    got = penalized_logprobs(BASE, prompt=[0, 4, 4], output=[1, 3], repetition_penalty=2.0)
    want = [1.0, -2.0, 0.5, 1.5, -4.0, 1.0, 0.0, 0.25]
    assert got == pytest.approx(expected_logprobs(want), abs=1e-6)


def test_repetition_penalty_below_one_rewards() -> None:
    got = penalized_logprobs(BASE, prompt=[5], output=[4], repetition_penalty=0.5)
    want = [2.0, -1.0, 0.5, 3.0, -1.0, 2.0, 0.0, 0.25]
    assert got == pytest.approx(expected_logprobs(want), abs=1e-6)


def test_presence_and_frequency_penalties_count_output_tokens_only() -> None:
    got = penalized_logprobs(
        BASE,
        prompt=[0, 0, 3],
        output=[1, 2, 2, 2, 5],
        presence_penalty=0.5,
        frequency_penalty=0.25,
    )
    want = list(BASE)
    want[1] -= 0.5 + 0.25 * 1
    want[2] -= 0.5 + 0.25 * 3
    want[5] -= 0.5 + 0.25 * 1
    assert got == pytest.approx(expected_logprobs(want), abs=1e-6)


def test_negative_presence_penalty_rewards_repeats() -> None:
    got = penalized_logprobs(BASE, output=[6], presence_penalty=-1.5)
    want = list(BASE)
    want[6] += 1.5
    assert got == pytest.approx(expected_logprobs(want), abs=1e-6)


def test_all_penalties_together_and_greedy_follows_them() -> None:
    logits = [2.9, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]
    row = Row.of(
        [3],
        [3, 3],
        temperature=0.0,
        repetition_penalty=1.2,
        frequency_penalty=0.1,
        presence_penalty=0.1,
    )
    out = sampler().sample(logits_of(logits), [row])
    # token 3: 3.0 / 1.2 = 2.5, then - 0.1 * 2 - 0.1 = 2.2 < 2.9
    assert out.token_ids == [0]
    unpenalized = Row.of([3], [3, 3], temperature=0.0)
    assert sampler().sample(logits_of(logits), [unpenalized]).token_ids == [3]


def test_penalties_apply_to_their_rows_only() -> None:
    logits = logits_of(BASE, BASE, BASE)
    rows = [
        Row.of([3], [0], temperature=0.0, logprobs=VOCAB),
        Row.of([3], [0], temperature=0.0, logprobs=VOCAB, repetition_penalty=4.0),
        Row.of([3], [0], temperature=0.0, logprobs=VOCAB, frequency_penalty=2.0),
    ]
    out = sampler().sample(logits, rows)
    full = [[lp.top[t] for t in range(VOCAB)] for lp in out.logprobs if lp is not None]
    assert full[0] == pytest.approx(expected_logprobs(BASE), abs=1e-6)
    rep = list(BASE)
    rep[0], rep[3] = 0.5, 0.75
    assert full[1] == pytest.approx(expected_logprobs(rep), abs=1e-6)
    freq = list(BASE)
    freq[0] = 2.0 - 2.0
    assert full[2] == pytest.approx(expected_logprobs(freq), abs=1e-6)
    assert out.token_ids == [3, 5, 3]


def test_out_of_vocab_history_tokens_are_ignored() -> None:
    got = penalized_logprobs(BASE, prompt=[VOCAB + 5, 0], output=[-1, 1], repetition_penalty=2.0)
    want = list(BASE)
    want[0], want[1] = 1.0, -2.0
    assert got == pytest.approx(expected_logprobs(want), abs=1e-6)


# -------------------------------------------------------------- min_tokens


def test_min_tokens_masks_eos_and_stop_token_ids() -> None:
    logits = logits_of([0.0, 0.0, 5.0, 0.0, 1.0, 0.0, 0.0, 9.0])  # eos (7) best, then 2
    s = sampler()

    def greedy(output: list[int], **kw) -> int:
        return s.sample(logits, [Row.of(output=output, temperature=0.0, **kw)]).token_ids[0]

    assert greedy([1, 1], min_tokens=3) == 2
    assert greedy([1, 1], min_tokens=3, ignore_eos=True) == 2  # eos masked all the same
    assert greedy([1, 1], min_tokens=3, stop_token_ids=[2]) == 4
    assert greedy([1, 1, 1], min_tokens=3, stop_token_ids=[2]) == 7  # min reached
    assert greedy([], min_tokens=0) == 7


def test_min_tokens_masks_eos_when_sampling_and_in_logprobs() -> None:
    logits = logits_of([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 3.0])
    s = sampler(8)
    rows = [Row.of(output=[0], temperature=1.0, min_tokens=2, logprobs=1) for _ in range(200)]
    out = s.sample(logits.expand(200, VOCAB), rows)
    assert EOS not in out.token_ids
    lp = out.logprobs[0]
    assert lp is not None and lp.top.keys() == {2}
    masked = logits.clone()
    masked[0, EOS] = -math.inf
    assert lp.top[2] == pytest.approx(torch.log_softmax(masked, -1)[0, 2].item(), abs=1e-6)


def test_min_tokens_ignores_out_of_range_ids() -> None:
    s = Sampler(eos_token_ids={EOS, 1000}, device="cpu")
    out = s.sample(logits_of(BASE), [Row.of(temperature=0.0, min_tokens=2, stop_token_ids=[500])])
    assert out.token_ids == [3]


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_before_temperature_and_filters() -> None:
    raw = [1.0, 0.2, -0.5, 0.8, 0.0, -1.0, 0.4, -2.0]
    logits = logits_of(raw, raw, raw, raw)
    rows = [
        Row.of(temperature=0.3, top_k=2, logprobs=3),
        Row.of(temperature=2.0, top_p=0.5, min_p=0.2, logprobs=0),
        Row.of(temperature=0.0, logprobs=20),
        Row.of(temperature=1.0),
    ]
    out = sampler(9).sample(logits, rows)
    want = torch.log_softmax(torch.tensor(raw), dim=-1)
    lp0, lp1, lp2, lp3 = out.logprobs
    assert lp3 is None
    assert lp0 is not None and lp1 is not None and lp2 is not None
    for lp, token in zip((lp0, lp1, lp2), out.token_ids, strict=False):
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(want[token].item(), abs=1e-6)
    assert list(lp0.top) == [0, 3, 6]  # best first
    assert list(lp0.top.values()) == pytest.approx(want[[0, 3, 6]].tolist(), abs=1e-6)
    assert lp1.top == {}
    assert len(lp2.top) == VOCAB  # top-n capped at the vocabulary
    assert lp2.token_id == 0


# -------------------------------------------------------------- bad inputs


def test_bad_shapes_and_types_raise() -> None:
    s = sampler()
    row = Row.of(temperature=0.0)
    with pytest.raises(ValueError, match="num_rows, vocab"):
        s.sample(torch.zeros(VOCAB), [row])
    with pytest.raises(ValueError, match="num_rows, vocab"):
        s.sample(torch.zeros(1, 1, VOCAB), [row])
    with pytest.raises(ValueError, match="2 rows but 1"):
        s.sample(torch.zeros(2, VOCAB), [row])
    with pytest.raises(ValueError, match="empty vocabulary"):
        s.sample(torch.zeros(1, 0), [row])
    with pytest.raises(ValueError, match="floating point"):
        s.sample(torch.zeros(1, VOCAB, dtype=torch.long), [row])
    with pytest.raises(ValueError, match=r"torch\.Tensor"):
        s.sample([[0.0] * VOCAB], [row])  # type: ignore[arg-type]


def test_half_precision_logits_are_accepted() -> None:
    logits = logits_of(BASE).to(torch.bfloat16)
    assert sampler().sample(logits, [Row.of(temperature=0.0)]).token_ids == [3]


# ------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(
        st.floats(min_value=-20, max_value=20, allow_nan=False, width=32),
        min_size=VOCAB,
        max_size=VOCAB,
    ),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    top_k=st.integers(0, VOCAB + 2),
    top_p=st.sampled_from([0.1, 0.5, 0.9, 1.0]),
    min_p=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 2**32),
)
def test_sampled_token_is_always_allowed(
    logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float, seed: int
) -> None:
    row = Row.of(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, logprobs=1
    )
    t = torch.tensor(logits)
    out = sampler().sample(t.unsqueeze(0), [row])
    token = out.token_ids[0]
    assert 0 <= token < VOCAB
    rank = sorted(range(VOCAB), key=lambda i: (-logits[i], i)).index(token)
    if temperature == 0.0 or top_k == 1:
        assert token == int(torch.argmax(t))
    if top_k > 0:
        assert rank < top_k
    probs = torch.softmax(t / (temperature or 1.0), dim=-1)
    if min_p > 0 and temperature > 0:
        # min-p runs on what top-k/top-p left, whose renormalization keeps the ratio
        assert probs[token] >= min_p * probs.max() * (1 - 1e-5)
    assert out.logprobs[0] is not None
    assert out.logprobs[0].logprob == pytest.approx(
        torch.log_softmax(t, -1)[token].item(), abs=1e-5
    )


def reference_kept(row: list[float], top_k: int, top_p: float) -> tuple[set[int], float]:
    """Brute force top-k then top-p in float64; also the closest cumulative mass to top_p."""
    vocab = len(row)
    ranking = sorted(range(vocab), key=lambda i: (-row[i], i))
    if 0 < top_k < vocab:
        ranking = ranking[:top_k]
    weights = [math.exp(row[i] - max(row)) for i in ranking]
    total = sum(weights)
    kept, before, closest = [], 0.0, math.inf
    for token, w in zip(ranking, weights, strict=True):
        if top_p < 1.0:
            closest = min(closest, abs(before - top_p))
            if before >= top_p:
                break
        kept.append(token)
        before += w / total
    return set(kept), closest


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(st.lists(st.integers(-4, 4), min_size=12, max_size=12), min_size=1, max_size=4),
    top_k=st.lists(st.integers(0, 13), min_size=4, max_size=4),
    top_p=st.lists(st.sampled_from([0.05, 0.3, 0.5, 0.8, 0.95, 1.0]), min_size=4, max_size=4),
    num_candidates=st.sampled_from([None, 1, 2, 3, 5]),
)
def test_rank_filter_mask_matches_brute_force(
    data: list[list[int]], top_k: list[int], top_p: list[float], num_candidates: int | None
) -> None:
    """Ties (integer logits) and both paths: candidates only, or the full sort."""
    rows = [[v * 0.5 for v in row] for row in data]
    ks, ps = top_k[: len(rows)], top_p[: len(rows)]
    expected = [reference_kept(r, k, p) for r, k, p in zip(rows, ks, ps, strict=True)]
    assume(all(closest > 1e-4 for _, closest in expected))
    remove = rank_filter_mask(torch.tensor(rows), ks, ps, num_candidates=num_candidates)
    assert remove.shape == (len(rows), 12)
    for i, (kept, _) in enumerate(expected):
        assert set((~remove[i]).nonzero().flatten().tolist()) == kept


def test_rank_filter_candidates_fall_back_when_the_nucleus_is_wide() -> None:
    flat = torch.zeros(2, 64)
    flat[1, 5] = 1.0
    remove = rank_filter_mask(flat, [0, 0], [0.9, 0.9], num_candidates=4)
    assert int((~remove[0]).sum()) == 58  # ceil(0.9 * 64) = 58 of 64 equal tokens, lowest ids
    assert not remove[0, :58].any() and remove[0, 58:].all()
    assert not remove[1, 5]


@pytest.mark.parametrize("num_candidates", [None, 1])
def test_top_p_stops_as_soon_as_the_mass_reaches_p(num_candidates: int | None) -> None:
    """Equal logits: probabilities exactly 1/4 each; p=0.5 is reached by two tokens, the
    lowest ids, with no third token for an exact tie with p."""
    logits = torch.tensor([[-math.inf, 1.0, 1.0, -math.inf, 1.0, 1.0, -math.inf, -math.inf]])
    remove = rank_filter_mask(logits, [0], [0.5], num_candidates=num_candidates)
    assert (~remove[0]).nonzero().flatten().tolist() == [1, 2]
    counts = draw(sampler(10), logits, lambda: Row.of(temperature=1.0, top_p=0.5), 400)
    assert set(counts) == {1, 2}


# ------------------------------------------------- issue 26: edges that broke later


@pytest.mark.parametrize("num_candidates", [None, 2])
def test_a_top_p_that_is_zero_in_float32_keeps_the_best_token(num_candidates: int | None) -> None:
    """top_p=1e-300 is accepted ((0, 1]) but is 0 in float32: the nucleus still keeps the
    most likely token (ties: the lowest id), never nothing."""
    logits = torch.tensor([
        [0.5, 2.0, -1.0, 2.0, 0.0, 1.0, -3.0, 0.2],
        [3.0, 0.0, 1.0, 2.0, -1.0, 0.5, 0.1, 2.9],
    ])
    remove = rank_filter_mask(logits, [0, 3], [1e-300, 1e-300], num_candidates=num_candidates)
    assert [(~row).nonzero().flatten().tolist() for row in remove] == [[1], [0]]


def test_a_vanishing_top_p_samples_the_greedy_token(rank_path: str) -> None:
    logits = logits_of([0.1, 0.3, -0.2, 0.4, 0.0, 0.9, 0.2, -1.0])  # token 5 is the best
    counts = draw(sampler(3), logits, lambda: Row.of(temperature=1.5, top_p=1e-300), 200)
    assert counts == Counter({5: 200})


def test_logprobs_are_finite_where_a_token_is_masked() -> None:
    """The min_tokens ban puts EOS at -inf: its logprob reads -9999.0 (OpenAI's), not -inf,
    which JSON cannot carry."""
    logits = logits_of([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 3.0])
    out = sampler(8).sample(logits, [Row.of(temperature=1.0, min_tokens=2, logprobs=VOCAB)])
    lp = out.logprobs[0]
    assert lp is not None and lp.top[EOS] == -9999.0
    assert all(math.isfinite(v) for v in [lp.logprob, *lp.top.values()])


def test_a_grammar_mask_decides_the_token_but_not_the_logprobs() -> None:
    """``constrain`` (structured output's mask) removes tokens from the draw; logprobs are
    the distribution before it, and the caller's logits are left as they were."""
    raw = [1.0, 0.2, -0.5, 0.8, 0.0, -1.0, 0.4, -2.0]
    logits = logits_of(raw, raw)
    before = logits.clone()

    def only_2_and_4(x: torch.Tensor) -> None:
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[[2, 4]] = True
        x[:, ~keep] = -math.inf

    rows = [Row.of(temperature=0.0, logprobs=3), Row.of(temperature=1.0, seed=1, logprobs=3)]
    out = sampler(2).sample(logits, rows, constrain=only_2_and_4)
    want = torch.log_softmax(torch.tensor(raw), dim=-1)
    assert out.token_ids[0] == 4 and out.token_ids[1] in (2, 4)
    for lp, token in zip(out.logprobs, out.token_ids, strict=True):
        assert lp is not None and lp.logprob == pytest.approx(want[token].item(), abs=1e-6)
        assert list(lp.top) == [0, 3, 6]  # the model's best, though the grammar forbids them
    assert torch.equal(logits, before)


def test_llm_with_a_vanishing_top_p_generates_the_greedy_tokens() -> None:
    """In-process on the tiny model: top_p=1e-300 at temperature 1 gives the greedy
    output, not a stream of token 0."""
    from worker.engine import LLM

    llm = LLM("tiny-llama", num_kv_blocks=64, attention_backend="torch")
    prompts = ["the quick brown fox", "hello there"]
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                          use_tqdm=False)
    tiny = llm.generate(prompts, SamplingParams(temperature=1.0, top_p=1e-300, seed=4,
                                                max_tokens=8, ignore_eos=True), use_tqdm=False)
    for g, t in zip(greedy, tiny, strict=True):
        assert g.token_ids != [0] * 8  # else the check below would prove nothing
        assert t.token_ids == g.token_ids
