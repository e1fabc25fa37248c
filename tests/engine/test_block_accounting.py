"""Block accounting under random workloads: nothing owned twice, nothing leaked."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import blocks_consistent
from worker.engine import InvalidRequestError, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def small_engine() -> LLMEngine:
    return LLMEngine(model="tiny-llama", num_kv_blocks=24, block_size=16, max_num_seqs=6,
                     max_num_batched_tokens=64, enable_prefix_caching=True)


_ids = itertools.count()

request = st.tuples(
    st.integers(1, 120),  # prompt length
    st.integers(1, 60),  # max_tokens
    st.integers(0, 3),  # which of a few shared prefixes
    st.booleans(),  # abort it after a few steps
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request, min_size=1, max_size=14))
def test_blocks_are_never_double_owned_or_leaked(small_engine: LLMEngine, requests) -> None:
    engine = small_engine
    bm = engine.block_manager
    to_abort = []
    example = next(_ids)
    for i, (length, max_tokens, prefix, abort) in enumerate(requests):
        prompt = [(prefix * 31 + j) % 300 + 3 for j in range(length)]
        try:
            engine.add_request(f"h{example}-{i}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        except InvalidRequestError:
            assert length + max_tokens > bm.num_blocks * bm.block_size
            continue
        if abort:
            to_abort.append(f"h{example}-{i}")
    steps = 0
    while engine.has_unfinished_requests():
        _, stats = engine.step()
        steps += 1
        if steps == 3:
            for request_id in to_abort:
                engine.abort_request(request_id)
        running = engine.scheduler.running
        assert blocks_consistent(bm, running), "a block is owned twice or a count is off"
        assert bm.num_used_blocks + bm.num_free_blocks == stats.kv_blocks_total
        assert all(not s.block_table for s in engine.scheduler.waiting), "a waiting sequence holds blocks"
        assert len(running) <= engine.args.max_num_seqs
        assert stats.num_batched_tokens <= engine.args.max_num_batched_tokens
        assert steps < 5000, "livelock"
    assert bm.num_free_blocks == bm.num_blocks
    assert not engine.requests
