"""The engine's hot host path: the block-table mirror, the packed step inputs, the shared-
block count, the stop checker's short path and the positional outputs each say exactly
what the general code they stand in for says, through preemption, swaps, the prefix
cache, forked samples, drafts, chunked prefill and sliding windows."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.conftest import blocks_consistent, prompt_token_lists
from worker.engine import LLMEngine, SamplingParams
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.block_tables import BlockTables
from worker.engine.outputs import RequestMetrics, RequestOutput
from worker.engine.request_tracker import RequestTracker
from worker.engine.sequence import Sequence
from worker.engine.step_plan import SchedulerOutput
from worker.engine.step_stats import distinct_kv_tokens
from worker.engine.stopping import StopChecker


def _holder(name: str, table: list[int]) -> Sequence:
    seq = Sequence(name, [1, 2], SamplingParams(), RequestMetrics(arrival_time=0.0))
    seq.block_table = table
    return seq


def test_block_tables_grow_in_rows_and_columns_and_zero_what_they_give_back() -> None:
    tables = BlockTables(rows=2, width=2)
    seqs = [_holder(f"s{i}", list(range(10 * i, 10 * i + i + 1))) for i in range(5)]
    for seq in seqs:
        tables.load(seq)  # 5 rows (from 2), up to 5 columns (from 2)
    assert all(tables.matches(seq) for seq in seqs)
    assert tables.array.shape[0] >= 5 and tables.array.shape[1] >= 5
    out = np.empty((2, 5), dtype=np.int64)
    tables.gather(np.array([seqs[4].table_row, seqs[1].table_row]), out=out)
    assert out.tolist() == [[40, 41, 42, 43, 44], [10, 11, 0, 0, 0]]
    seqs[4].block_table = [7]
    tables.load(seqs[4])  # shorter: the tail past it is zero again
    tables.gather(np.array([seqs[4].table_row]), out=out[:1])
    assert out[:1].tolist() == [[7, 0, 0, 0, 0]]
    freed = seqs[3].table_row
    seqs[3].block_table = []
    tables.load(seqs[3])
    assert seqs[3].table_row is None and not tables.array[freed].any()
    newcomer = _holder("new", [5, 6])
    tables.set(newcomer, 0, 5)
    tables.set(newcomer, 1, 6)
    assert newcomer.table_row == freed and tables.matches(newcomer)


def _reference_inputs(plan: SchedulerOutput, bs: int) -> tuple[list[int], dict[str, list]]:
    """The step inputs written the plain way, sequence by sequence, from the lists."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    context, tables = [], []
    for s in plan.scheduled:
        ids += s.query_token_ids()
        end = s.start + s.num_new_tokens
        context.append(end)
        tables.append(s.seq.block_table[: -(-end // bs)])
        for p in range(s.start, end):
            positions.append(p)
            slots.append(-1 if s.is_pad else s.seq.block_table[p // bs] * bs + p % bs)
    q = [s.num_new_tokens for s in plan.scheduled]
    return ids, {"positions": positions, "slot_mapping": slots, "context_lens": context,
                 "cu_seqlens_q": np.concatenate([[0], np.cumsum(q)]).tolist(),
                 "cu_seqlens_k": np.concatenate([[0], np.cumsum(context)]).tolist(),
                 "tables": tables, "logits_indices": plan.logits_rows.token_indices}


def _check_inputs(engine: LLMEngine, ids: torch.Tensor, meta: AttentionMetadata,
                  plan: SchedulerOutput) -> None:
    want_ids, want = _reference_inputs(plan, engine.block_size)
    assert ids.tolist() == want_ids
    for name in ("positions", "slot_mapping", "context_lens", "cu_seqlens_q", "cu_seqlens_k",
                 "logits_indices"):
        assert getattr(meta, name).tolist() == want[name], name
    got_tables = meta.block_tables.tolist()
    for row, table in zip(got_tables, want["tables"], strict=True):
        assert row[: len(table)] == table  # past a sequence's blocks: never read
    assert meta.num_decode_seqs == sum(1 for s in plan.scheduled if s.is_decode)


def _checked_run(engine: LLMEngine, prompts: list[list[int]],
                 params: list[SamplingParams]) -> tuple[dict, dict[str, int]]:
    """Run ``prompts`` to the end, checking after every step that each sequence's mirror
    row, the shared-block count and the KV token count agree with the lists, and before
    every forward that the packed inputs equal the plain ones. Returns the final outputs
    and what the run went through (preemptions, drafts, shared blocks, pad rows)."""
    bm, runner = engine.block_manager, engine.runner
    build = runner.build_inputs
    built = []

    def checked_build(plan: SchedulerOutput):
        ids, meta = build(plan)
        _check_inputs(engine, ids, meta, plan)
        built.append(plan.num_prefill_tokens + plan.num_verify_tokens)
        return ids, meta

    runner.build_inputs = checked_build  # type: ignore[method-assign]
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p)
    finals = {}
    seen = {"preemptions": 0, "drafts": 0, "shared": 0, "pads": 0}
    try:
        while engine.has_unfinished_requests():
            outputs, stats = engine.step()
            seen["preemptions"] += stats.num_preemptions
            seen["drafts"] += stats.num_draft_tokens
            seen["pads"] += stats.num_pad_rows
            seen["shared"] = max(seen["shared"], bm.num_shared)
            finals.update({o.request_id: o for o in outputs if o.finished})
            holders = [*engine.scheduler.running, *engine.scheduler.padding, *engine.scheduler.waiting]
            assert all(bm.tables.matches(s) for s in holders)
            assert bm.num_shared == sum(1 for r in bm.ref_counts if r > 1)
            assert blocks_consistent(bm, holders)
            if not bm.window:  # the sum's short path against the walk over shared heads
                want = {}
                for seq in [*engine.scheduler.running, *engine.scheduler.padding]:
                    for j, block in enumerate(seq.block_table):
                        filled = min(engine.block_size, seq.num_computed_tokens - j * engine.block_size)
                        if filled > 0:
                            want[block] = max(want.get(block, 0), filled)
                holding = [*engine.scheduler.running, *engine.scheduler.padding]
                assert distinct_kv_tokens(holding, bm) == sum(want.values())
    finally:
        runner.build_inputs = build  # type: ignore[method-assign]
    assert built and max(built) > 0  # prefill chunks (and verify rows) were built too
    return finals, seen


def _mixed_params(count: int) -> list[SamplingParams]:
    kinds = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=7, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.8, n=3, seed=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, logprobs=2, prompt_logprobs=1, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.0, min_tokens=6, max_tokens=18),
    ]
    return [kinds[i % len(kinds)] for i in range(count)]


@pytest.mark.parametrize("setting", ["preempt", "swap", "speculate", "window", "padded"])
def test_mirror_inputs_and_counts_agree_with_the_lists_every_step(setting: str) -> None:
    model = "tiny-mistral" if setting == "window" else "tiny-llama"
    kwargs: dict = {"num_kv_blocks": 40, "max_num_seqs": 12, "max_num_batched_tokens": 96,
                    "block_size": 8}
    if setting == "swap":
        kwargs.update(swap_space=1 << 20, swap_min_tokens=1)
    if setting == "speculate":
        kwargs.update(num_speculative_tokens=3, num_kv_blocks=400)
    if setting == "window":
        kwargs.update(num_kv_blocks=400)
    if setting == "padded":
        kwargs.update(policy="static-padded", num_kv_blocks=400)
    engine = LLMEngine(model=model, **kwargs)
    prompts = prompt_token_lists(engine.tokenizer, 14, seed=3, lo=4, hi=70)
    prompts = [prompts[0][:30] + p for p in prompts]  # a shared head for the prefix cache
    if setting == "speculate":
        prompts = [(p * 4)[:60] for p in prompts]
    params = _mixed_params(len(prompts))
    finals, seen = _checked_run(engine, prompts, params)
    assert len(finals) == len(prompts) and seen["shared"] > 0
    if setting in ("preempt", "swap"):
        assert seen["preemptions"] > 0 and engine.block_manager.num_free_blocks == 40
    if setting == "swap":
        assert engine.swapper is not None and engine.swapper.manager.total_swapped_out > 0
    if setting == "speculate":
        assert seen["drafts"] > 0
    if setting == "padded":
        assert seen["pads"] > 0
    if setting == "window":
        assert engine.block_manager.window > 0


def test_short_stop_path_decides_as_the_general_rule() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=64)
    eos = min(engine.runner.eos_token_ids)
    # a short context, so that the context limit decides too
    checker = StopChecker(tokenizer=engine.tokenizer, eos_token_ids={eos}, max_model_len=9)
    rng = random.Random(0)
    for _ in range(3000):
        params = SamplingParams(
            max_tokens=rng.choice([5, 8, 12]), min_tokens=rng.choice([0, 0, 2, 5]),
            ignore_eos=rng.random() < 0.3,
            stop_token_ids=rng.choice([[], [], [7]]), stop=rng.choice([[], [], ["ab"]]))
        prompt = [rng.randrange(3, 300) for _ in range(rng.randrange(1, 6))]
        seq = Sequence("s", prompt, params, RequestMetrics(arrival_time=0.0), max_tokens=params.max_tokens or 8)
        for _ in range(rng.randrange(1, 9)):
            seq.append_token(rng.choice([eos, 7, 11, 12, rng.randrange(3, 300)]), None)
        want = checker._decide(len(prompt), seq.output_token_ids, params, seq.max_tokens)
        assert checker.decide(seq) == want


def test_positional_output_fills_every_field_by_name() -> None:
    seq = Sequence("r", [1, 2, 3], SamplingParams(logprobs=1), RequestMetrics(arrival_time=1.0),
                   prompt="hi")
    seq.append_token(5, None)
    seq.finish_reason, seq.stop_reason, seq.error, seq.text = "stop", 5, "boom", "x"
    seq.sample_index, seq.prompt_logprobs = 2, [None]
    got = RequestTracker._output(seq, [5])
    want = RequestOutput(
        request_id="r", prompt="hi", prompt_token_ids=[1, 2, 3], text="x", token_ids=[5],
        finish_reason="stop", metrics=seq.metrics, finished=False, new_token_ids=[5],
        logprobs=[], stop_reason=5, error="boom", index=2, samples=[], prompt_logprobs=[None])
    assert got == want
