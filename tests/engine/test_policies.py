"""Scheduling policies on the scheduler alone (no model): who runs, who waits, who is preempted."""

from __future__ import annotations

import itertools

from worker.engine.block_manager import BlockManager
from worker.engine.outputs import RequestMetrics
from worker.engine.scheduler import Scheduler
from worker.engine.scheduling_policy import SHIELD_AFTER_PREEMPTIONS, pick_victim
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.stopping import StopChecker
from worker.protocol.sampling_params import SamplingParams

_clock = itertools.count()
# The scheduler alone: the tests append and remove themselves, so nothing is stop-checked.
NO_STOPS = StopChecker(tokenizer=None, eos_token_ids=set(), max_model_len=1 << 20)


def make_seq(prompt_len: int, max_tokens: int, *, priority: int = 0, tenant: str | None = None) -> Sequence:
    n = next(_clock)
    seq = Sequence(f"s{n}", [1] * prompt_len, SamplingParams(max_tokens=max_tokens),
                   RequestMetrics(arrival_time=float(n)), priority=priority, tenant=tenant)
    seq.max_tokens = max_tokens
    return seq


def make_scheduler(policy: str, *, blocks: int = 64, seqs: int = 8, budget: int = 256) -> Scheduler:
    return Scheduler(block_manager=BlockManager(blocks, 4), stop_checker=NO_STOPS, max_num_seqs=seqs,
                     max_num_batched_tokens=budget, policy=policy)


def step(sched: Scheduler):
    """Run one simulated step: computed tokens advance, sampling appends token 7."""
    out = sched.schedule(0, 0.0)
    for s in out.scheduled:
        samples = s.samples
        s.seq.num_computed_tokens += s.num_new_tokens
        if samples:
            s.seq.append_token(7, None)
            if s.seq.num_output_tokens >= s.seq.max_tokens:
                sched.remove(s.seq)
    return out


def test_priority_preempts_a_lower_priority_runner_when_memory_is_short() -> None:
    sched = make_scheduler("priority", blocks=8, seqs=8)
    low = [make_seq(8, 40, priority=0) for _ in range(4)]  # 2 blocks each: the pool is full
    for s in low:
        sched.add(s)
    step(sched)
    assert len(sched.running) == 4 and sched.block_manager.num_free_blocks == 0
    urgent = make_seq(6, 4, priority=5)
    sched.add(urgent)
    out = step(sched)
    assert urgent.status is SequenceStatus.RUNNING
    assert out.preempted and all(p.priority == 0 for p in out.preempted)
    assert out.preempted[0] is low[-1]  # the latest-arrived low-priority one goes
    assert not out.preempted[0].block_table


def test_priority_orders_admission() -> None:
    sched = make_scheduler("priority", seqs=1)
    a, b, c = make_seq(4, 2, priority=1), make_seq(4, 2, priority=9), make_seq(4, 2, priority=5)
    for s in (a, b, c):
        sched.add(s)
    order = []
    while sched.has_unfinished():
        order += [s.seq.request_id for s in step(sched).scheduled if s.seq.request_id not in order]
    assert order == [b.request_id, c.request_id, a.request_id]


def test_sjf_admits_the_shortest_max_tokens_first() -> None:
    sched = make_scheduler("sjf", seqs=1)
    seqs = [make_seq(4, n) for n in (30, 5, 12)]
    for s in seqs:
        sched.add(s)
    first = step(sched).scheduled[0].seq
    assert first is seqs[1]


def test_fair_share_lets_a_small_tenant_start_within_bounded_steps() -> None:
    sched = make_scheduler("fair", blocks=512, seqs=4, budget=64)
    for _ in range(300):
        sched.add(make_seq(8, 20, tenant="big"))
    for _ in range(30):  # the big tenant has been served for a while
        step(sched)
    small = [make_seq(8, 20, tenant="small") for _ in range(6)]
    for s in small:
        sched.add(s)
    started = {}
    admitted: list[str | None] = []  # tenants in the order they were admitted
    for i in range(200):
        before = {s.request_id for s in sched.running}
        out = step(sched)
        admitted += [s.seq.tenant for s in out.scheduled if s.seq.request_id not in before]
        for s in small:
            if s.num_computed_tokens and s.request_id not in started:
                started[s.request_id] = i
        if len(started) == len(small):
            break
    # 4 slots, 20-token jobs: each small job starts as soon as a slot frees up.
    assert len(started) == len(small) and max(started.values()) <= 60, started
    # The next four admissions (a slot's worth each) go to the tenant served least, ahead
    # of the 260-odd big jobs that arrived before; then the two tenants share.
    assert admitted[:4] == ["small"] * 4, admitted


def test_fair_share_without_it_the_small_tenant_waits_behind_the_queue() -> None:
    sched = make_scheduler("fcfs", blocks=512, seqs=4, budget=64)
    for _ in range(300):
        sched.add(make_seq(8, 20, tenant="big"))
    small = make_seq(8, 20, tenant="small")
    sched.add(small)
    for _ in range(200):
        step(sched)
    assert small.num_computed_tokens == 0  # the contrast that makes the fair test meaningful


def test_a_sequence_preempted_often_is_shielded() -> None:
    sched = make_scheduler("fcfs", blocks=64, seqs=8)
    old, new = make_seq(4, 50), make_seq(4, 50)
    for s in (old, new):
        sched.add(s)
    step(sched)
    assert pick_victim("fcfs", sched.running) is new
    new.metrics.num_preemptions = SHIELD_AFTER_PREEMPTIONS
    assert pick_victim("fcfs", sched.running) is old


def test_static_policy_fills_its_cohort_then_admits_nothing_until_it_drains() -> None:
    sched = make_scheduler("static", blocks=256, seqs=4, budget=16)  # prompts need two steps
    seqs = [make_seq(10, 3 + 10 * (i % 4)) for i in range(8)]
    for s in seqs:
        sched.add(s)
    first, second = {s.request_id for s in seqs[:4]}, {s.request_id for s in seqs[4:]}
    sizes = {"first": 0, "second": 0}
    while sched.has_unfinished():
        step(sched)
        running = {s.request_id for s in sched.running}
        assert running <= first or running <= second, "cohorts overlap"
        cohort = "first" if running and running <= first else "second"
        sizes[cohort] = max(sizes[cohort], len(running))
        if running & second:
            assert all(s.is_finished for s in seqs[:4]), "admitted before the cohort drained"
    assert sizes == {"first": 4, "second": 4}
