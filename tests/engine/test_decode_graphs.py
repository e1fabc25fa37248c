"""The decode-graph path (static, padded buffers) gives the same tokens as the plain path.

On the CPU the buffers run eagerly, which checks the padding rows and buffer plumbing
that CUDA graph replay relies on.
"""

from __future__ import annotations

from tests.conftest import prompt_token_lists
from worker.engine import LLM, SamplingParams
from worker.engine.decode_graphs import batch_ladder


def test_ladder_covers_every_batch_size() -> None:
    assert batch_ladder(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_ladder(5) == [1, 2, 4, 5]
    assert batch_ladder(1) == [1]
    for max_batch in (1, 3, 17, 64):
        ladder = batch_ladder(max_batch)
        assert all(any(size >= n for size in ladder) for n in range(1, max_batch + 1))


def test_padded_decode_buffers_give_the_same_outputs() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM("tiny-llama", num_kv_blocks=128, max_num_seqs=16, decode_graphs=False)
    graphed = LLM("tiny-llama", num_kv_blocks=128, max_num_seqs=16, decode_graphs=True)
    assert graphed.engine.runner.decode_graphs is not None
    prompts = prompt_token_lists(plain.tokenizer, 11, seed=4)  # 11: padded up to 16
    expected = [o.token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    assert [o.token_ids for o in graphed.generate(prompts, params, use_tqdm=False)] == expected


def test_decode_buffers_return_only_the_sampling_rows_when_pad_rows_run() -> None:
    # static-padded steps are all one-row sequences, but pad rows sample nothing: the
    # buffers give a row per sequence and the runner must keep the sampling ones only.
    lengths = [2, 7, 4, 1, 6]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    plain = LLM("tiny-llama", num_kv_blocks=64, max_num_seqs=8, decode_graphs=False)
    padded = LLM("tiny-llama", num_kv_blocks=64, max_num_seqs=8, decode_graphs=True,
                 policy="static-padded")
    prompts = prompt_token_lists(plain.tokenizer, len(lengths), seed=6)
    expected = [o.token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    assert [o.token_ids for o in padded.generate(prompts, params, use_tqdm=False)] == expected
