"""n > 1: samples share the prompt's blocks, copy the partial block on write, finish together."""

from __future__ import annotations

from tests.conftest import prompt_token_lists
from worker.engine import LLMEngine, SamplingParams


def drain(engine: LLMEngine) -> dict:
    finished, max_shared = {}, 0
    while engine.has_unfinished_requests():
        outputs, _ = engine.step()
        bm = engine.block_manager
        max_shared = max(max_shared, sum(1 for c in bm.ref_counts if c > 1))
        for out in outputs:
            if out.finished:
                assert out.request_id not in finished, "a request finished twice"
                finished[out.request_id] = out
    return {"outputs": finished, "max_shared": max_shared}


def test_samples_equal_single_requests_with_their_seeds_and_share_blocks() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=128, max_num_seqs=16)
    prompt = prompt_token_lists(engine.tokenizer, 1, seed=3, lo=40, hi=40)[0]  # 2.5 blocks
    assert len(prompt) % engine.block_size, "the test needs a partial last block"

    def params(seed: int, n: int = 1) -> SamplingParams:
        return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=20, ignore_eos=True)

    engine.add_request("multi", prompt, params(10, n=3))
    result = drain(engine)
    multi = result["outputs"]["multi"]
    assert [s.index for s in multi.samples] == [0, 1, 2]
    assert result["max_shared"] >= len(prompt) // engine.block_size  # full prompt blocks shared
    for k in range(3):
        engine.add_request(f"single{k}", prompt, params(10 + k))
    singles = drain(engine)["outputs"]
    for k in range(3):
        assert multi.samples[k].token_ids == singles[f"single{k}"].token_ids, f"sample {k}"
    assert len({tuple(s.token_ids) for s in multi.samples}) > 1, "samples should differ"
    assert multi.token_ids == multi.samples[0].token_ids
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_of_a_request_with_samples_ends_all_of_them() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=128)
    engine.add_request("multi", [5, 6, 7, 8, 9], SamplingParams(n=4, temperature=1.0, max_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()
    engine.abort_request("multi")
    outputs = drain(engine)["outputs"]
    assert list(outputs) == ["multi"]
    assert outputs["multi"].finish_reason == "abort"
    assert len(outputs["multi"].samples) == 4
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_samples_forked_from_an_unusable_row_fail_with_it() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=128)
    bad = SamplingParams(n=3, temperature=1.0, seed=2, max_tokens=5, logit_bias={10**7: 1.0})
    engine.add_request("bad", [5, 6, 7, 8, 9], bad)
    outputs = drain(engine)["outputs"]
    out = outputs["bad"]
    assert out.finish_reason == "abort" and out.error and "logit_bias" in out.error
    assert [(s.index, s.finish_reason, s.token_ids) for s in out.samples] == [(k, "abort", []) for k in range(3)]
    assert not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
