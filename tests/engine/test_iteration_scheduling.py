"""Iteration-level scheduling, step by step, on the tiny model: what the seeds are about.

Each test fails when the engine falls back to request-level (cohort) batching in one of
its forms: a finished slot left empty, prefill and decode kept in separate steps,
admission by slot count alone, or KV held past the end of a sequence.
"""

from __future__ import annotations

import pytest

from tests.conftest import blocks_consistent, prompt_token_lists
from worker.engine import InvalidRequestError, LLMEngine, RequestOutput, SamplingParams, StepStats


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def drain(engine: LLMEngine) -> tuple[dict[str, RequestOutput], list[StepStats]]:
    """Step until idle; the final outputs by id and every step's stats."""
    done: dict[str, RequestOutput] = {}
    steps: list[StepStats] = []
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        steps.append(stats)
        done.update({o.request_id: o for o in outputs if o.finished})
        assert len(steps) < 500, "livelock"
    return done, steps


def test_a_finished_sequence_slot_is_refilled_on_the_next_step() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=64, max_num_seqs=2)
    engine.add_request("short", [5, 6, 7], greedy(2))
    engine.add_request("long", [8, 9, 10], greedy(12))
    engine.add_request("next", [11, 12, 13], greedy(3))  # waits: both slots are taken
    done, steps = drain(engine)
    finished_at = done["short"].metrics.last_step
    assert finished_at is not None and finished_at < done["long"].metrics.last_step
    assert done["next"].metrics.first_step == finished_at + 1, "the freed slot stayed empty"
    assert steps[finished_at + 1].num_admitted == 1


def test_a_step_mixes_prefill_chunks_and_decodes_under_the_token_budget() -> None:
    budget = 16
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=64, max_num_seqs=4,
                       max_num_batched_tokens=budget)
    engine.add_request("decoding", [5, 6, 7], greedy(20))
    engine.step()  # its prompt; it decodes from now on
    engine.add_request("long-prompt", list(range(20, 70)), greedy(4))  # 50 tokens: 4 chunks
    _, steps = drain(engine)
    assert all(s.num_batched_tokens <= budget for s in steps)
    rows = [(s.num_decode_tokens, s.num_prefill_tokens) for s in steps[:4]]
    # the decode and a prompt chunk in every step, the chunks filling what the decode leaves
    assert rows == [(1, 15), (1, 15), (1, 15), (1, 5)], rows
    assert sum(s.num_prefill_tokens for s in steps) == 50


def test_admission_is_refused_by_kv_budget_not_by_slot_count_alone() -> None:
    # 8 blocks of 16 tokens; each prompt takes 3 blocks (40 tokens), eight slots are free.
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=8, block_size=16, max_num_seqs=8)
    prompts = [[(7 * i + j) % 200 + 3 for j in range(40)] for i in range(3)]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, greedy(6))
    _, stats = engine.step()
    assert stats.num_admitted == 2 and stats.num_waiting == 1, "admitted past the free KV"
    assert stats.num_preemptions == 0
    assert len(engine.scheduler.running) < engine.args.max_num_seqs  # slots were not the limit
    assert engine.admission_capacity() == 0, "free slots offered while KV cannot take more"
    done, steps = drain(engine)
    assert sorted(done) == ["r0", "r1", "r2"]
    assert done["r2"].metrics.first_step == done["r0"].metrics.last_step + 1
    assert not any(s.num_preemptions for s in steps)


def test_blocks_are_freed_in_the_step_a_sequence_ends() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=64, block_size=16, max_num_seqs=4)
    engine.add_request("ends", list(range(3, 40)), greedy(3))  # 37 + 3 tokens: 3 blocks
    engine.add_request("stays", [5, 6, 7], greedy(10))
    bm = engine.block_manager
    seen_end = False
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        running = engine.scheduler.running
        held = sum(len(s.block_table) for s in running)
        assert blocks_consistent(bm, running), "a finished sequence still holds blocks"
        assert stats.kv_blocks_used == held == bm.num_used_blocks
        if any(o.finished and o.request_id == "ends" for o in outputs):
            seen_end = True
            assert held == 1  # only "stays" is left, in one block
    assert seen_end and bm.num_free_blocks == bm.num_blocks


def test_decode_counts_one_row_sequences_only_and_drafts_apart() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=128, max_num_seqs=4, num_speculative_tokens=3)
    prompts = [([5, 6, 7, 8] * 10)[: 30 + i] for i in range(3)]  # loops the drafter finds
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, greedy(24))
    _, steps = drain(engine)
    assert sum(s.num_draft_tokens for s in steps) > 0
    for s in steps:
        # one row per decoding sequence: never more decode rows than sequences
        assert s.num_decode_tokens + (1 if s.num_prefill_tokens else 0) <= s.num_scheduled_seqs
        verifying = s.num_verify_tokens - s.num_draft_tokens  # one real token each
        assert verifying >= 0 and (verifying > 0) == (s.num_draft_tokens > 0)
        assert s.num_decode_tokens + verifying <= s.num_scheduled_seqs


def _cohort_run(policy: str, prompts: list[list[int]], lengths: list[int]):
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=128, max_num_seqs=4, policy=policy)
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", p, greedy(n))
    done, steps = drain(engine)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [done[f"r{i}"].token_ids for i in range(len(prompts))], steps


def test_static_padded_gives_the_same_outputs_and_pays_for_its_padding() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=8)
    prompts = prompt_token_lists(engine.tokenizer, 8, seed=3, lo=4, hi=30)
    lengths = [2, 9, 4, 6, 3, 11, 5, 1]  # cohorts of 4: longest 9, then 11
    runs = {p: _cohort_run(p, prompts, lengths) for p in ("fcfs", "static", "static-padded")}
    outputs = {p: r[0] for p, r in runs.items()}
    assert outputs["static-padded"] == outputs["fcfs"] == outputs["static"]
    steps = {p: r[1] for p, r in runs.items()}
    # Lockstep: each cohort takes its longest member's steps; every shorter member pads
    # one row per step it waits, as a padded batch of Hugging Face generate does.
    cohorts = [lengths[:4], lengths[4:]]
    assert len(steps["static-padded"]) == sum(max(c) for c in cohorts) == len(steps["static"])
    pads = sum(s.num_pad_rows for s in steps["static-padded"])
    assert pads == sum(max(c) - n for c in cohorts for n in c) == 39
    assert all(s.num_pad_rows == 0 for s in steps["static"] + steps["fcfs"])
    rows = {p: sum(s.num_batched_tokens for s in st) for p, st in steps.items()}
    assert rows["static-padded"] == rows["static"] + pads  # the padding is computed, not free
    assert len(steps["fcfs"]) < len(steps["static"])
    # slots stay occupied in lockstep: every step of a full cohort schedules 4 sequences
    assert max(s.num_scheduled_seqs for s in steps["static-padded"]) == 4


def test_without_chunked_prefill_a_prompt_over_the_budget_is_refused_at_once() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=64, max_num_batched_tokens=32,
                       enable_chunked_prefill=False)
    with pytest.raises(InvalidRequestError, match="chunked prefill off"):
        engine.add_request("too-long", list(range(3, 43)), greedy(4))  # 40 > 32
    engine.add_request("fits", list(range(3, 35)), greedy(4))  # 32: one whole step
    done, steps = drain(engine)
    assert done["fits"].finish_reason == "length"
    assert steps[0].num_prefill_tokens == 32


def test_without_chunked_prefill_a_long_recompute_after_preemption_still_runs() -> None:
    prompts = [list(range(3 + i, 27 + i)) for i in range(3)]  # 24 tokens each
    kwargs = dict(model="tiny-llama", block_size=16, max_num_seqs=3, max_num_batched_tokens=32,
                  enable_chunked_prefill=False)
    roomy = LLMEngine(num_kv_blocks=64, **kwargs)  # type: ignore[arg-type]
    tight = LLMEngine(num_kv_blocks=7, **kwargs)  # type: ignore[arg-type]
    results = []
    for engine in (roomy, tight):
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, greedy(40))  # 64 tokens at the end: > the budget
        done, steps = drain(engine)
        results.append(([done[f"r{i}"].token_ids for i in range(3)], steps))
    (expected, roomy_steps), (got, tight_steps) = results
    assert not any(s.num_preemptions for s in roomy_steps)
    assert any(s.num_preemptions for s in tight_steps)
    assert max(s.num_prefill_tokens for s in tight_steps) <= 32
    assert got == expected
