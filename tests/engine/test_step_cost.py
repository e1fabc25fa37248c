"""What a step cost its requests: the step's wall time split by the rows each computed
(``worker.engine.step_cost``). The shares of a step add up to its time; a prompt token the
prefix cache served is not a row, so it costs nothing; the ``fair`` policy can charge
tenants these engine-seconds instead of tokens."""

from __future__ import annotations

import math
import random

from tests.engine.test_iteration_scheduling import drain
from tests.engine.test_policies import make_scheduler, make_seq, step
from worker.engine import LLMEngine, SamplingParams
from worker.engine.scheduling_policy import next_waiting
from worker.engine.step_cost import split_seconds


def test_the_shares_of_a_step_add_up_to_its_time() -> None:
    rng = random.Random(7)
    for _ in range(500):
        work = {f"r{i}": rng.randint(1, 2048) for i in range(rng.randint(1, 300))}
        seconds = rng.uniform(1e-5, 3.0)
        shares = split_seconds(seconds, work)
        assert shares.keys() == work.keys()
        assert math.isclose(math.fsum(shares.values()), seconds, rel_tol=1e-12)
        one, other = rng.sample(sorted(work), 2) if len(work) > 1 else (None, None)
        if one is not None and other is not None:  # proportional to rows
            assert math.isclose(shares[one] * work[other], shares[other] * work[one],
                                rel_tol=1e-9)
    assert split_seconds(0.5, {}) == {}


def test_each_request_is_charged_its_computed_rows_and_cached_ones_cost_nothing() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=128, max_num_seqs=8,
                       max_num_batched_tokens=64)
    shared = list(range(10, 74))  # 4 blocks of 16
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("first", [*shared, 5, 6, 7], greedy)
    engine.add_request("plain", list(range(100, 140)), greedy)
    engine.add_request("samples", [3, 4, 5, 6], SamplingParams(n=3, temperature=1.0, seed=2,
                                                               max_tokens=5, ignore_eos=True))
    done, steps = drain(engine)
    engine.add_request("second", [*shared, 8, 9], greedy)  # its prefix is cached now
    later, more = drain(engine)
    done.update(later)
    steps += more
    rows: dict[str, int] = {}
    charged: dict[str, float] = {}
    for s in steps:
        for rid, n in s.work.items():
            rows[rid] = rows.get(rid, 0) + n
        for rid, share in split_seconds(s.seconds, s.work).items():
            charged[rid] = charged.get(rid, 0.0) + share
    assert set(rows) == {"first", "plain", "samples", "second"}  # samples under the request
    assert math.isclose(sum(charged.values()), sum(s.seconds for s in steps), rel_tol=1e-12)
    assert done["first"].metrics.num_cached_tokens == 0
    assert done["second"].metrics.num_cached_tokens == 64
    for rid in ("first", "plain", "second"):
        out = done[rid]
        computed = len(out.prompt_token_ids) - out.metrics.num_cached_tokens
        assert rows[rid] == computed + len(out.token_ids) - 1  # the last token is never fed
    assert rows["samples"] == 4 + 3 * (5 - 1)  # the prompt once, then each sample's decodes
    # "second"'s 64 cached tokens are no rows (the loop above), so no step charges them; its
    # seconds are not compared with "first"'s: they are measured, and "second" ran alone


def test_fair_by_engine_seconds_serves_the_tenant_whose_tokens_cost_less() -> None:
    """Two tenants computed the same tokens, but one's steps took ten times as long: by
    tokens they tie (arrival decides), by engine-seconds the cheap one goes first."""
    for share, first in (("tokens", "costly"), ("engine_seconds", "cheap")):
        sched = make_scheduler("fair", blocks=512, seqs=4, budget=64)
        sched.ledger.unit = share
        for tenant, seconds in (("costly", 1.0), ("cheap", 0.1)):
            for _ in range(4):
                sched.add(make_seq(8, 5, tenant=tenant))
            while sched.has_unfinished():
                sched.record_step_time(step(sched), seconds)
        costly, cheap = sched.ledger.served["costly"], sched.ledger.served["cheap"]
        if share == "tokens":
            assert costly == cheap == 4 * (8 + 5 - 1)
        else:
            assert math.isclose(costly, 10 * cheap)
        waiting = [make_seq(8, 5, tenant="costly"), make_seq(8, 5, tenant="cheap")]
        assert next_waiting("fair", waiting, sched.ledger).tenant == first, share


def test_an_engine_seconds_ledger_is_charged_the_steps_time() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=64, max_num_seqs=4, policy="fair",
                       fair_share="engine_seconds")
    for i, tenant in enumerate(("a", "b", "a", "c")):
        engine.add_request(f"r{i}", [5 + i, 6, 7, 8], SamplingParams(max_tokens=4 + i,
                                                                     ignore_eos=True),
                           tenant=tenant)
    _, steps = drain(engine)
    served = engine.scheduler.ledger.served
    assert set(served) == {"a", "b", "c"}
    assert math.isclose(sum(served.values()), sum(s.seconds for s in steps if s.work),
                        rel_tol=1e-12)
