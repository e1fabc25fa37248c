"""Interactive work is never starved by a batch backlog (issue 27): reserved slots and
token budget, interactive-first admission, preemption of batch sequences, and the old
behaviour with the feature off."""

from __future__ import annotations

import argparse
import itertools

import pytest

from cli.engine_flags import add_engine_flags, engine_kwargs_from
from tests.conftest import prompt_token_lists
from tests.engine.test_policies import NO_STOPS
from worker.engine import InvalidRequestError, LLMEngine, SamplingParams
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineArgs
from worker.engine.outputs import RequestMetrics
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence, SequenceStatus

_clock = itertools.count()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def make_seq(prompt_len: int, max_tokens: int, service_class: str) -> Sequence:
    n = next(_clock)
    seq = Sequence(f"{service_class[0]}{n}", [1] * prompt_len, SamplingParams(max_tokens=max_tokens),
                   RequestMetrics(arrival_time=float(n)), service_class=service_class)
    seq.max_tokens = max_tokens
    return seq


def scheduler(*, seqs: int = 8, budget: int = 256, blocks: int = 256, reserve_seqs: int = 2,
              reserve_tokens: int = 32, priority: bool = True, batch_rows: int = 0,
              fast_lane: bool = False) -> Scheduler:
    return Scheduler(block_manager=BlockManager(blocks, 4), stop_checker=NO_STOPS, max_num_seqs=seqs,
                     max_num_batched_tokens=budget,
                     interactive_reserve_seqs=reserve_seqs, interactive_reserve_tokens=reserve_tokens,
                     interactive_priority=priority, interactive_batch_rows=batch_rows,
                     interactive_fast_lane=fast_lane)


def sim_step(sched: Scheduler):
    out = sched.schedule(0, 0.0)
    for s in out.scheduled:
        s.seq.num_computed_tokens += s.num_new_tokens
        if s.samples:
            s.seq.append_token(7, None)
            if s.seq.num_output_tokens >= s.seq.max_tokens:
                sched.remove(s.seq)
    return out


def test_batch_admission_leaves_the_reserved_slots_and_tokens_free() -> None:
    sched = scheduler(seqs=8, budget=64, reserve_seqs=2, reserve_tokens=16)
    for _ in range(20):
        sched.add(make_seq(40, 50, "batch"))
    out = sim_step(sched)
    assert sum(s.num_new_tokens for s in out.scheduled) <= 64 - 16  # prompt chunks leave the reserve
    for _ in range(6):
        sim_step(sched)
    assert len(sched.running) == 6  # never the last two slots
    urgent = make_seq(12, 3, "interactive")
    sched.add(urgent)
    out = sim_step(sched)
    assert urgent.status is SequenceStatus.RUNNING and not out.preempted
    assert any(s.seq is urgent for s in out.scheduled)


def test_interactive_is_admitted_before_waiting_batch() -> None:
    sched = scheduler(seqs=1, reserve_seqs=0, reserve_tokens=0)
    batch = [make_seq(4, 2, "batch") for _ in range(3)]
    urgent = make_seq(4, 2, "interactive")
    for s in (*batch, urgent):
        sched.add(s)
    assert sim_step(sched).scheduled[0].seq is urgent


def test_interactive_preempts_the_latest_batch_runner_when_slots_are_full() -> None:
    sched = scheduler(seqs=4, reserve_seqs=0, reserve_tokens=0)
    batch = [make_seq(4, 30, "batch") for _ in range(4)]
    for s in batch:
        sched.add(s)
    sim_step(sched)
    urgent = make_seq(4, 3, "interactive")
    sched.add(urgent)
    out = sim_step(sched)
    assert urgent.status is SequenceStatus.RUNNING
    assert out.preempted == [batch[-1]]


def test_feature_off_keeps_fcfs() -> None:
    sched = scheduler(seqs=1, reserve_seqs=0, reserve_tokens=0, priority=False)
    batch = [make_seq(4, 2, "batch") for _ in range(2)]
    urgent = make_seq(4, 2, "interactive")
    for s in (*batch, urgent):
        sched.add(s)
    order: list[str] = []
    while sched.has_unfinished():
        out = sim_step(sched)
        assert not out.preempted
        order += [s.seq.request_id for s in out.scheduled if s.seq.request_id not in order]
    assert order == [batch[0].request_id, batch[1].request_id, urgent.request_id]


def _run(engine: LLMEngine, until: set[str] | None = None) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step()[0]:
            if o.finished:
                done[o.request_id] = o.token_ids
    return done


def test_interactive_starts_within_one_step_behind_forty_batch_requests() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=1024, max_num_seqs=8,
                       interactive_reserve_seqs=2, interactive_reserve_tokens=64)
    prompts = prompt_token_lists(engine.tokenizer, 41, seed=3, lo=8, hi=40)
    for i, p in enumerate(prompts[:40]):
        engine.add_request(f"b{i}", p, greedy(12), service_class="batch")
    for _ in range(5):
        engine.step()
    assert len(engine.scheduler.running) == 6 and len(engine.scheduler.waiting) == 34
    engine.add_request("i", prompts[40], greedy(6), service_class="interactive")
    outputs, stats = engine.step()
    first = [o for o in outputs if o.request_id == "i"]
    assert first and len(first[0].token_ids) == 1
    assert (stats.num_running_interactive, stats.num_waiting_interactive) == (1, 0)
    assert stats.num_interactive_tokens == len(prompts[40])  # the trace row's class counts
    done = _run(engine)
    alone = LLMEngine(model="tiny-llama", num_kv_blocks=1024, max_num_seqs=8)
    alone.add_request("i", prompts[40], greedy(6))
    alone.add_request("b0", prompts[0], greedy(12))
    ref = _run(alone)
    assert done["i"] == ref["i"] and done["b0"] == ref["b0"]  # greedy outputs unchanged


def test_interactive_preempts_batch_when_the_kv_pool_is_full() -> None:
    args = dict(model="tiny-llama", block_size=16, num_kv_blocks=8, max_num_seqs=8,
                interactive_reserve_seqs=0, interactive_reserve_tokens=0)
    engine = LLMEngine(**args)  # type: ignore[arg-type]
    prompts = prompt_token_lists(engine.tokenizer, 5, seed=11, lo=20, hi=28)
    for i, p in enumerate(prompts[:4]):
        engine.add_request(f"b{i}", p, greedy(20), service_class="batch")  # 2 blocks each
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks == 0 and len(engine.scheduler.running) == 4
    engine.add_request("i", prompts[4], greedy(4), service_class="interactive")
    outputs, stats = engine.step()
    assert stats.num_preemptions >= 1
    assert any(o.request_id == "i" and len(o.token_ids) == 1 for o in outputs)
    assert engine.requests["b3"].metrics.num_preemptions >= 1  # the latest batch one gave way
    done = _run(engine)
    for i in range(4):
        alone = LLMEngine(model="tiny-llama", num_kv_blocks=64)
        alone.add_request(f"b{i}", prompts[i], greedy(20))
        assert _run(alone)[f"b{i}"] == done[f"b{i}"]


def test_feature_off_engine_matches_the_old_schedule() -> None:
    off = dict(interactive_reserve_seqs=0, interactive_reserve_tokens=0, interactive_priority=False)
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=256, max_num_seqs=2, **off)  # type: ignore[arg-type]
    prompts = prompt_token_lists(engine.tokenizer, 4, seed=7, lo=6, hi=20)
    for i, p in enumerate(prompts[:3]):
        engine.add_request(f"b{i}", p, greedy(5), service_class="batch")
    engine.step()
    engine.add_request("i", prompts[3], greedy(5), service_class="interactive")
    order: list[str] = []
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        assert stats.num_preemptions == 0
        order += [o.request_id for o in outputs if o.finished]
    assert order[-1] == "i"  # it waited behind the batch ones, as before


def test_inbox_hands_out_interactive_jobs_first() -> None:
    from worker.service.held_jobs import HeldJob
    from worker.service.inbox import Inbox

    def held(i: int, cls: str) -> HeldJob:
        return HeldJob(job_id=f"j{i}", stream=f"inflight:jobs:{cls}", entry_id=f"{i}-0",
                       delivery=None)  # type: ignore[arg-type]

    inbox = Inbox()
    inbox.put([held(0, "batch"), held(1, "batch"), held(2, "interactive"), held(3, "batch")])
    assert inbox.num_interactive() == 1
    assert inbox.take(0, interactive_only=True) == []
    assert [h.job_id for h in inbox.take(2)] == ["j2", "j0"]
    assert inbox.take(5, interactive_only=True) == []
    assert [h.job_id for h in inbox.take(5)] == ["j1", "j3"]


def test_top_shows_running_and_waiting_per_class() -> None:
    from types import SimpleNamespace

    from cli.top_cmd import format_workers

    w = SimpleNamespace(id="w1", status="running", alive=True, heartbeat_age_s=0.5, step=9,
                        running=8, waiting=30, kv_use=0.5, tokens_per_s=1.0,
                        decode_tokens_per_s=1.0, jobs_per_s=0.1, model="tiny-llama",
                        running_interactive=2, waiting_interactive=1)
    header, row = format_workers([w])
    assert "INTER" in header and "BATCH R/W" in header
    assert row.split()[-3:] == ["2/1", "6/29", "tiny-llama"]


def test_a_whole_batch_prompt_longer_than_the_unreserved_budget_still_runs() -> None:
    sched = Scheduler(block_manager=BlockManager(256, 4), stop_checker=NO_STOPS, max_num_seqs=8,
                      max_num_batched_tokens=64,
                      enable_chunked_prefill=False, interactive_reserve_seqs=2,
                      interactive_reserve_tokens=16, interactive_priority=True)
    long = make_seq(60, 2, "batch")  # more than 64 - 16: the reserve would never let it in
    sched.add(long)
    out = sim_step(sched)
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(long, 60)]


def test_capacities_leave_the_reserve_to_interactive_jobs() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=256, max_num_seqs=8, interactive_reserve_seqs=2)
    assert (engine.admission_capacity(), engine.interactive_capacity()) == (6, 8)
    for i in range(10):
        engine.add_request(f"b{i}", [5, 6, 7], greedy(20), service_class="batch")
    engine.step()
    assert len(engine.scheduler.running) == 6
    assert (engine.admission_capacity(), engine.interactive_capacity()) == (0, 8)
    engine.add_request("i", [5, 6, 7], greedy(2), service_class="interactive")
    assert engine.interactive_capacity() == 7


def _batch_rows(out) -> int:
    return sum(s.num_new_tokens for s in out.scheduled if s.seq.is_batch)


def test_while_interactive_work_is_present_batch_rows_are_capped_and_take_turns() -> None:
    sched = scheduler(seqs=32, budget=256, blocks=512, reserve_seqs=0, reserve_tokens=0,
                      batch_rows=5)
    batch = [make_seq(3, 40, "batch") for _ in range(12)]
    for s in batch:
        sched.add(s)
    first = sim_step(sched)  # no interactive work: no cap, every prompt at once
    assert _batch_rows(first) == 12 * 3
    urgent = make_seq(20, 30, "interactive")
    sched.add(urgent)
    out = sim_step(sched)
    assert any(s.seq is urgent and s.num_new_tokens == 20 for s in out.scheduled)  # not capped
    assert _batch_rows(out) == 5
    progress = {s: s.num_output_tokens for s in batch}
    for _ in range(4):  # 12 runners, 5 a step: within 3 steps every one advanced
        assert _batch_rows(sim_step(sched)) <= 5
    assert all(s.num_output_tokens > progress[s] for s in batch)
    while urgent.status is not SequenceStatus.FINISHED:
        sim_step(sched)
    assert _batch_rows(sim_step(sched)) == 12  # the interactive request left: no cap again


def test_the_cap_limits_batch_prompt_chunks_and_admission_too() -> None:
    sched = scheduler(seqs=8, budget=256, blocks=512, reserve_seqs=0, reserve_tokens=0,
                      batch_rows=16)
    sched.add(make_seq(4, 50, "interactive"))
    for _ in range(3):
        sched.add(make_seq(40, 5, "batch"))
    out = sim_step(sched)
    assert _batch_rows(out) == 16  # one prompt's first chunk; the others wait for room
    assert sum(1 for s in out.scheduled if s.seq.is_batch) == 1


def _running_batch(sched: Scheduler, count: int) -> list[Sequence]:
    """``count`` batch sequences past their prompts (no interactive work yet: no cap)."""
    for _ in range(count):
        sched.add(make_seq(3, 200, "batch"))
    sim_step(sched)
    return [s for s in sched.running if s.is_batch]


def test_a_fast_lane_step_admits_the_arrival_with_no_batch_rows_then_the_batch_resumes() -> None:
    sched = scheduler(seqs=32, budget=256, blocks=512, reserve_seqs=0, reserve_tokens=0,
                      batch_rows=5, fast_lane=True)
    _running_batch(sched, 12)
    chatting = make_seq(6, 50, "interactive")  # an interactive request already decoding
    sched.add(chatting)
    sim_step(sched)  # its own fast-lane step
    assert _batch_rows(sim_step(sched)) == 5  # capped, not fast: nothing arrived
    arrival = make_seq(20, 30, "interactive")
    sched.add(arrival)
    out = sim_step(sched)
    assert _batch_rows(out) == 0  # the arrival's prompt waits on interactive rows only
    assert any(s.seq is arrival and s.num_new_tokens == 20 for s in out.scheduled)
    assert any(s.seq is chatting for s in out.scheduled)  # running interactive work goes on
    assert _batch_rows(sim_step(sched)) == 5  # back to the cap


def test_arrivals_before_every_step_never_stop_the_batch() -> None:
    sched = scheduler(seqs=64, budget=256, blocks=1024, reserve_seqs=0, reserve_tokens=0,
                      batch_rows=5, fast_lane=True)
    batch = _running_batch(sched, 12)
    progress = {s: s.num_output_tokens for s in batch}
    rows, arrivals = [], []
    for _ in range(10):
        arrival = make_seq(8, 100, "interactive")
        arrivals.append(arrival)
        sched.add(arrival)
        rows.append(_batch_rows(sim_step(sched)))
    assert rows == [0, 5] * 5  # never two fast-lane steps in a row
    assert all(a.status is SequenceStatus.RUNNING for a in arrivals)  # each admitted on arrival
    assert all(s.num_output_tokens > progress[s] for s in batch)  # every batch runner advanced


def test_fast_lane_off_or_without_priority_keeps_the_capped_step() -> None:
    for fast_lane, priority in ((False, True), (True, False)):
        sched = scheduler(seqs=32, budget=256, blocks=512, reserve_seqs=0, reserve_tokens=0,
                          batch_rows=5, fast_lane=fast_lane, priority=priority)
        _running_batch(sched, 12)
        sched.add(make_seq(20, 30, "interactive"))
        assert _batch_rows(sim_step(sched)) == 5


def test_the_engine_runs_the_fast_lane_by_default_and_the_flag_turns_it_off() -> None:
    assert EngineArgs().interactive_fast_lane is True
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    assert engine_kwargs_from(parser.parse_args(["--no-interactive-fast-lane"]))["interactive_fast_lane"] is False
    assert "interactive_fast_lane" not in engine_kwargs_from(parser.parse_args([]))


def test_the_step_budget_caps_batch_rows_by_the_time_recent_steps_took() -> None:
    sched = Scheduler(block_manager=BlockManager(1024, 4), stop_checker=NO_STOPS, max_num_seqs=64,
                      max_num_batched_tokens=256, interactive_priority=True,
                      interactive_step_ms=42.0)
    batch = _running_batch(sched, 40)
    assert _batch_rows(sim_step(sched)) == 40  # no interactive work: no cap
    chatting = make_seq(6, 50, "interactive")
    sched.add(chatting)
    assert _batch_rows(sim_step(sched)) == 40  # no estimate yet: nothing to cap by
    for rows in (8, 40, 16, 33):  # this machine: 10 ms a step, 1 ms a row
        sched.step_time.observe(rows, 0.010 + 0.001 * rows)
    out = sim_step(sched)
    assert _batch_rows(out) == 32 - 1  # 32 rows fit in 42 ms, one of them the chat's
    assert any(s.seq is chatting for s in out.scheduled)
    assert all(s.num_output_tokens >= 3 for s in batch)
    for _ in range(200):
        sched.step_time.observe(16, 0.300)  # the machine slowed down: 19 ms a row
    assert _batch_rows(sim_step(sched)) == 4  # never below MIN_CAPPED_BATCH_ROWS
    sched.interactive_batch_rows = 2  # a fixed cap below the time's still holds
    assert _batch_rows(sim_step(sched)) == 2


def test_engine_steps_teach_the_step_time_model_and_the_flags_set_the_budget() -> None:
    assert EngineArgs().interactive_step_ms == 0.0 and EngineArgs().interactive_batch_rows == 0
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=64, max_num_seqs=8, interactive_step_ms=100.0)
    engine.add_request("b", [5, 6, 7], greedy(6), service_class="batch")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.step_time.steps == 6
    assert engine.scheduler.interactive_step_s == pytest.approx(0.1)
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    assert engine_kwargs_from(parser.parse_args(["--interactive-step-ms", "250"]))["interactive_step_ms"] == 250.0


def test_a_negative_or_nan_step_budget_or_reserve_is_refused_clearly() -> None:
    for bad in ({"interactive_step_ms": -1.0}, {"interactive_step_ms": float("nan")},
                {"interactive_batch_rows": -1}, {"interactive_reserve_seqs": -1},
                {"interactive_interject_ms": -1.0}, {"interactive_interject_ms": float("nan")}):
        with pytest.raises(InvalidRequestError, match="interactive_interject_ms must be >= 0"):
            EngineArgs(**bad)  # type: ignore[arg-type]
