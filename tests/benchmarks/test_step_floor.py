"""benchmarks/step_floor.py on the tiny model: every timed step runs all its sequences (also
when chunked prefill lets the first ones decode before the last is prefilled), and the split
counts each part once (the nested timers never exceed the forward they sit in)."""

from __future__ import annotations

from collections import defaultdict

from benchmarks import step_floor
from worker.engine.config import EngineArgs
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.step_stats import StepStats


def test_timed_steps_run_every_sequence_and_the_split_adds_up() -> None:
    engine = LLMEngine(EngineArgs(model="tiny-llama", max_num_seqs=16, num_threads=1,
                                  max_num_batched_tokens=256, num_kv_blocks=1024))
    totals: dict[str, float] = defaultdict(float)
    step_floor.instrument(engine, totals)
    # the split times the Python loop's parts; the decode stack runs them in one native
    # call (step_floor's main times both, the split from the loop)
    assert engine.runner.model.native_stack is not None
    engine.runner.model.native_stack = None
    stats_seen: list[StepStats] = []
    step = engine.step

    def recorded_step() -> tuple[list[RequestOutput], StepStats]:
        outputs, stats = step()
        stats_seen.append(stats)
        return outputs, stats

    engine.step = recorded_step  # type: ignore[method-assign]
    # 16 prompts of 100 tokens over a budget of 256: seven prefill steps, the first prompts
    # decoding during them; the timed steps must still hold all 16
    for batch in (1, 16):
        stats_seen.clear()
        step_ms = step_floor.time_steps(engine, batch, context=100, steps=4, totals=totals)
        prefilled = next(i for i, s in enumerate(stats_seen)
                         if s.num_prefill_tokens == 0 and s.num_waiting == 0)
        assert [s.num_decode_tokens for s in stats_seen[prefilled + 1:prefilled + 5]] == [batch] * 4
        # the timers' own seconds: the split rounds to 0.01 ms, and the tiny model's linears
        # of a step can take less than that on a fast core
        assert sum(totals[k] for k in step_floor.LINEAR_KINDS) > 0.0
        assert totals["attention"] > 0.0
        split = step_floor.split_ms(totals, step_ms, steps=4)
        step_floor.matmul_ms(engine, batch, reps=1)  # after the split: its calls are not in it
        assert split["rest_of_forward"] >= 0.0
        assert not engine.has_unfinished_requests()  # aborted after the timed steps


def test_the_native_steps_split_adds_up_to_the_step() -> None:
    """The engine's own steps (the decode stack): the coarse parts sum to the step, none of
    them negative, and the head is timed on its own."""
    engine = LLMEngine(EngineArgs(model="tiny-llama", max_num_seqs=4, num_threads=1,
                                  max_num_batched_tokens=256, num_kv_blocks=256))
    totals: dict[str, float] = defaultdict(float)
    step_floor.instrument(engine, totals)
    assert engine.runner.model.native_stack is not None
    step_ms = step_floor.time_steps(engine, 4, context=40, steps=4, totals=totals)
    split = step_floor.native_split_ms(totals, step_ms, steps=4)
    assert set(split) == set(step_floor.NATIVE_PARTS)
    assert all(v >= 0.0 for v in split.values()), split
    assert totals["lm_head"] > 0.0 and totals["run"] > totals["lm_head"]
    assert abs(sum(split.values()) - step_ms) < 0.05  # each rounded to 0.01 ms
