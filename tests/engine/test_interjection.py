"""Interjected steps (issue 27): a long batch step pauses between two layers and runs the
prompts of newly arrived interactive requests in a step of their own there
(``LLMEngine.interjected_step``). Neither side's tokens change, nothing is preempted,
and the pause is taken off the paused step's time."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from cli.engine_flags import add_engine_flags, engine_kwargs_from
from tests.conftest import blocks_consistent, prompt_token_lists
from worker.engine import LLMEngine, SamplingParams
from worker.engine.config import EngineArgs
from worker.engine.outputs import RequestOutput, StepStats
from worker.service.observe import trace_row


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def engine(**overrides) -> LLMEngine:
    kwargs = dict(model="tiny-llama", max_num_seqs=16, num_kv_blocks=256, block_size=16,
                  max_model_len=256, enable_prefix_caching=True, interactive_interject_ms=1e-6)
    kwargs.update(overrides)
    return LLMEngine(**kwargs)


@pytest.fixture(scope="module")
def prompts() -> dict[str, list[list[int]]]:
    tok = engine().tokenizer
    batch = prompt_token_lists(tok, 6, seed=3, lo=20, hi=90)
    others = prompt_token_lists(tok, 2, seed=4, lo=12, hi=30)
    # one arrival shares two full blocks with a batch prompt (a prefix-cache hit once the
    # batch's prefill is published), one shares nothing
    return {"batch": batch, "arrivals": [batch[-1][:32] + others[0], others[1]]}


def run_alone(prompt_lists: list[list[int]], service_class: str, max_tokens: int) -> dict[str, list[int]]:
    eng = engine()
    for i, ids in enumerate(prompt_lists):
        eng.add_request(f"{service_class[0]}{i}", ids, greedy(max_tokens), service_class=service_class)
    done: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        outputs, _ = eng.step()
        done.update({o.request_id: o.token_ids for o in outputs if o.finished})
    return done


class Interjector:
    """A ``between_layers`` hook: at its ``at``-th call it adds the arrivals and runs an
    interjected step; later calls run one whenever the engine has one to run."""

    def __init__(self, eng: LLMEngine, arrivals: list[list[int]], at: int) -> None:
        self.eng, self.arrivals, self.at = eng, arrivals, at
        self.calls = 0
        self.steps: list[tuple[list[RequestOutput], StepStats]] = []

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == self.at:
            for i, ids in enumerate(self.arrivals):
                self.eng.add_request(f"i{i}", ids, greedy(7), service_class="interactive")
        ran = self.eng.interjected_step()
        if ran is not None:
            self.steps.append(ran)


def run_interjected(prompts: dict[str, list[list[int]]], at: int
                    ) -> tuple[LLMEngine, Interjector, dict[str, list[int]], list[StepStats]]:
    eng = engine()
    for i, ids in enumerate(prompts["batch"]):
        eng.add_request(f"b{i}", ids, greedy(12), service_class="batch")
    hook = Interjector(eng, prompts["arrivals"], at)
    done: dict[str, list[int]] = {}
    stats: list[StepStats] = []
    while eng.has_unfinished_requests():
        before = len(hook.steps)
        outputs, step = eng.step(between_layers=hook)
        for inner_outputs, inner in hook.steps[before:]:
            stats.append(inner)
            done.update({o.request_id: o.token_ids for o in inner_outputs if o.finished})
        stats.append(step)
        done.update({o.request_id: o.token_ids for o in outputs if o.finished})
        assert blocks_consistent(eng.scheduler.block_manager, eng.scheduler.running)
    return eng, hook, done, stats


@pytest.mark.parametrize("at", [1, 2, 9], ids=["in-the-prefill", "first-decode", "later-decode"])
def test_neither_the_batch_nor_the_arrivals_change_their_tokens(prompts, at: int) -> None:
    """Tiny Llama has 2 layers (one pause per step): ``at`` 1 interjects in the batch's
    prefill step (the shared prefix computed by one of two layers, not yet published), 2
    and 9 in decodes (the prefix served from the cache)."""
    alone = run_alone(prompts["batch"], "batch", 12) | run_alone(prompts["arrivals"], "interactive", 7)
    eng, hook, done, stats = run_interjected(prompts, at)
    (_, inner), = hook.steps  # both arrivals in one interjected step
    assert inner.num_admitted == 2 and inner.num_cached_tokens == (0 if at == 1 else 32)
    assert done == alone
    assert eng.scheduler.block_manager.num_free_blocks == eng.scheduler.block_manager.num_blocks
    assert sum(s.num_preemptions for s in stats) == 0


def test_an_interjected_step_is_numbered_after_its_paused_step_and_its_time_is_taken_off() -> None:
    eng = engine()
    tok = eng.tokenizer
    for i, ids in enumerate(prompt_token_lists(tok, 4, lo=30, hi=60)):
        eng.add_request(f"b{i}", ids, greedy(3), service_class="batch")
    hook = Interjector(eng, prompt_token_lists(tok, 1, seed=9, lo=20, hi=20), at=1)
    _, paused = eng.step(between_layers=hook)
    (inner_outputs, inner), = hook.steps
    assert (paused.step, inner.step) == (0, 1)
    assert eng.step_index == 2  # the next regular step is number 2
    assert inner.num_admitted == 1 and inner.num_running == 5
    assert [o.request_id for o in inner_outputs] == ["i0"]
    assert len(inner_outputs[0].token_ids) == 1  # its first token, before the batch's
    assert paused.paused_seconds > 0 and inner.paused_seconds == 0
    assert paused.paused_seconds >= inner.seconds * 0.9  # the inner step ran inside the pause
    assert trace_row("w", paused)["paused_ms"] == pytest.approx(1000 * paused.paused_seconds)
    assert trace_row("w", inner)["paused_ms"] == 0.0
    metrics = eng.scheduler.running[-1].metrics
    assert (metrics.first_step, metrics.last_step) == (1, 1)


def test_no_pause_for_interactive_only_steps_short_steps_or_with_the_feature_off() -> None:
    tok = engine().tokenizer
    ids = prompt_token_lists(tok, 2, lo=20, hi=30)

    def pauses(eng: LLMEngine, service_class: str, teach: Callable[[LLMEngine], None] | None = None) -> int:
        for i, p in enumerate(ids):
            eng.add_request(f"r{i}", p, greedy(2), service_class=service_class)
        if teach is not None:
            teach(eng)
        calls = 0

        def hook() -> None:
            nonlocal calls
            calls += 1
        while eng.has_unfinished_requests():
            eng.step(between_layers=hook)
        return calls

    layers = engine().runner.config.num_hidden_layers
    assert pauses(engine(), "batch") == 2 * (layers - 1)  # no estimate yet: every batch step
    assert pauses(engine(), "interactive") == 0  # an arrival may wait for interactive work
    assert pauses(engine(interactive_interject_ms=0.0), "batch") == 0
    assert pauses(engine(interactive_priority=False), "batch") == 0

    def fast_machine(eng: LLMEngine) -> None:
        for rows in (1, 8, 64, 128):
            eng.scheduler.step_time.observe(rows, 0.001 + 0.00001 * rows)
    assert pauses(engine(interactive_interject_ms=50.0), "batch", fast_machine) == 0


def test_arrivals_are_admitted_whole_without_preemption_or_not_at_all() -> None:
    eng = engine(max_num_seqs=3, num_kv_blocks=12)
    tok = eng.tokenizer
    batch = prompt_token_lists(tok, 2, lo=60, hi=60)
    for i, ids in enumerate(batch):
        eng.add_request(f"b{i}", ids, greedy(40), service_class="batch")
    eng.step()  # both prompts: 8 of the 12 blocks
    sched = eng.scheduler
    eng.add_request("big", prompt_token_lists(tok, 1, seed=5, lo=70, hi=70)[0], greedy(2))
    assert eng.interjected_step() is None  # 5 blocks wanted, 4 free: it waits, nobody is preempted
    assert [s.request_id for s in sched.running] == ["b0", "b1"]
    eng.abort_request("big")
    eng.add_request("small", prompt_token_lists(tok, 1, seed=6, lo=20, hi=20)[0], greedy(2))
    eng.add_request("second", prompt_token_lists(tok, 1, seed=7, lo=20, hi=20)[0], greedy(2))
    outputs, stats = eng.interjected_step() or ([], None)
    assert stats is not None and stats.num_admitted == 1  # one free slot of three
    assert [o.request_id for o in outputs] == ["small"]
    assert stats.num_decode_tokens == 0  # the running batch is not planned
    assert eng.interjected_step() is None  # no slot left: "second" waits for a regular step
    eng.add_request("late-batch", [5, 6, 7], greedy(2), service_class="batch")
    while eng.has_unfinished_requests():
        eng.step()


def test_a_started_interactive_request_is_not_an_arrival() -> None:
    eng = engine(max_num_batched_tokens=16)
    eng.add_request("chat", prompt_token_lists(eng.tokenizer, 1, lo=40, hi=40)[0], greedy(2))
    eng.step()  # its first chunk of 16 rows
    assert eng.interjected_step() is None  # its other chunks wait for a regular step
    while eng.has_unfinished_requests():
        eng.step()


def test_the_decoder_calls_the_hook_between_layers_only() -> None:
    eng = engine()
    layers = eng.runner.config.num_hidden_layers
    eng.add_request("b", [5, 6, 7, 8], greedy(1), service_class="batch")
    calls: list[int] = []
    eng.step(between_layers=lambda: calls.append(1))
    assert len(calls) == layers - 1


def test_the_interject_flag_and_its_default() -> None:
    assert EngineArgs().interactive_interject_ms == 100.0
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    args = parser.parse_args(["--interactive-interject-ms", "0"])
    assert engine_kwargs_from(args)["interactive_interject_ms"] == 0.0


def test_batch_work_leaves_the_kv_reserve_free_so_an_arrival_needs_no_preemption() -> None:
    """A pool too small for the batch: batch runners preempt batch work rather than take the
    reserve's blocks, so an arrival between two layers finds them free."""
    eng = engine(num_kv_blocks=48, interactive_reserve_tokens=256)
    sched, bm = eng.scheduler, eng.block_manager
    assert sched.reserve_blocks == 16  # 256 tokens; 48 - 16 blocks still hold max_model_len
    tok = eng.tokenizer
    for i, ids in enumerate(prompt_token_lists(tok, 6, seed=11, lo=40, hi=70)):
        eng.add_request(f"b{i}", ids, greedy(120), service_class="batch")
    batch_preempted = 0
    for _ in range(30):
        _, stats = eng.step()
        batch_preempted += stats.num_preemptions
        assert bm.num_free_blocks >= sched.reserve_blocks
    assert batch_preempted > 0  # the batch alone outgrew 32 blocks
    hook = Interjector(eng, prompt_token_lists(tok, 1, seed=12, lo=120, hi=120), at=1)
    _, paused = eng.step(between_layers=hook)
    (_, inner), = hook.steps
    assert inner.num_admitted == 1 and inner.num_preemptions == 0 and paused.num_preemptions == 0
    for seq in list(sched.running) + list(sched.waiting):
        eng.abort_request(seq.request_id)
    eng.step()


def test_the_kv_reserve_never_keeps_a_longest_sequence_from_running_alone() -> None:
    eng = engine(num_kv_blocks=20, max_model_len=256, interactive_reserve_tokens=256)
    assert eng.scheduler.reserve_blocks == 4  # 20 blocks less the 16 of one 256-token sequence
    eng.add_request("long", [5] * 100, greedy(150), service_class="batch")
    while eng.has_unfinished_requests():
        eng.step()
