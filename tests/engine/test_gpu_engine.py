"""The engine's CUDA path: decode graphs, Triton attention and greedy parity on a GPU.

Marked ``gpu``: skipped without CUDA (tests/conftest.py), run by ``pytest -m gpu`` and by
benchmarks/gpu_check.py on a GPU machine. Tiny models only, so each test takes seconds.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpucheck.graphs import TOLERANCE, compare_replay_with_eager, randomize_kv
from kernels.cpu_fused import ops_for
from tests.conftest import hf_greedy, prompt_token_lists
from worker.engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [list(o.token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_cuda_defaults_are_bf16_triton_and_captured_graphs() -> None:
    llm = LLM("tiny-llama", num_kv_blocks=128, max_num_seqs=8)
    runner = llm.engine.runner
    assert llm.engine.device.type == "cuda" and llm.engine.dtype == torch.bfloat16
    assert runner.backend.name == "triton"
    assert ops_for(llm.engine.device, llm.engine.dtype).name == "triton"  # fused element-wise ops
    assert runner.decode_graphs is not None
    assert sorted(runner.decode_graphs.graphs) == runner.decode_graphs.ladder == [1, 2, 4, 8]
    outputs = _tokens(llm, prompt_token_lists(llm.tokenizer, 5, seed=1))
    assert all(len(tokens) == MAX_TOKENS for tokens in outputs)


def test_graph_replay_gives_the_eager_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same greedy tokens with and without CUDA graphs, and decode steps really replayed."""
    args = dict(device="cuda", dtype="float32", num_kv_blocks=256, max_num_seqs=16)
    eager = LLM("tiny-llama", decode_graphs=False, **args)
    graphed = LLM("tiny-llama", decode_graphs=True, **args)
    graphs = graphed.engine.runner.decode_graphs
    assert graphs is not None and sorted(graphs.graphs) == graphs.ladder
    replayed: list[int] = []
    real_run = graphs.run

    def counting_run(input_ids, meta):  # same signature as DecodeGraphs.run
        replayed.append(meta.num_seqs)
        return real_run(input_ids, meta)

    monkeypatch.setattr(graphs, "run", counting_run)
    prompts = prompt_token_lists(eager.tokenizer, 11, seed=4)  # 11: padded to 16
    assert _tokens(graphed, prompts) == _tokens(eager, prompts)
    assert replayed and max(replayed) == 11


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe"])
def test_fused_element_wise_ops_give_the_torch_ops_tokens(model: str) -> None:
    """fp32 greedy tokens with the Triton element-wise ops (the CUDA default) equal those of
    the torch ops (``native_ops`` off), prefill chunks and decode steps alike."""
    llm = LLM(model, device="cuda", dtype="float32", num_kv_blocks=256, max_num_seqs=8,
              max_num_batched_tokens=32, decode_graphs=False)
    prompts = prompt_token_lists(llm.tokenizer, 6, seed=7)
    fused = _tokens(llm, prompts)
    llm.engine.runner.model.native_ops = False
    assert _tokens(llm, prompts) == fused


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_logits_equal_eager_at_every_ladder_size(dtype: str) -> None:
    """Random decode steps at every ladder size and one below (padding rows)."""
    llm = LLM("tiny-qwen2", device="cuda", dtype=dtype, num_kv_blocks=512, max_num_seqs=24,
              decode_graphs=True)
    runner = llm.engine.runner
    assert runner.decode_graphs is not None
    randomize_kv(runner.kv_caches, seed=0)
    rows = compare_replay_with_eager(runner.decode_graphs, num_blocks=512,
                                     block_size=runner.block_size, max_context=300)
    assert [r["batch"] for r in rows] == [1, 2, 3, 4, 7, 8, 15, 16, 23, 24]
    for row in rows:
        assert row["padded_diff_over_std"] <= TOLERANCE[llm.engine.dtype], row
        # the tiny model's two layers leave padding's reordered sums within the same bound
        # (on an H200, in fp32 and bf16); the check's 16-layer model needs PADDING_TOLERANCE
        assert row["max_abs_diff_over_std"] <= TOLERANCE[llm.engine.dtype], row


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2"])
def test_fp32_greedy_on_cuda_equals_hf_generate(model: str) -> None:
    llm = LLM(model, device="cuda", dtype="float32", num_kv_blocks=256, max_num_seqs=8)
    prompts = prompt_token_lists(llm.tokenizer, 6, seed=2)
    ours = _tokens(llm, prompts)
    assert ours == [hf_greedy(model, p, MAX_TOKENS) for p in prompts]


def test_swap_preemption_through_pinned_host_memory_loses_nothing() -> None:
    """A pool too small for the batch: preempted KV goes to pinned host memory and back."""
    args = dict(device="cuda", dtype="float32", max_num_seqs=16)
    roomy = LLM("tiny-llama", num_kv_blocks=256, **args)
    tight = LLM("tiny-llama", num_kv_blocks=12, swap_space=1 << 20, swap_min_tokens=1, **args)
    assert tight.engine.swapper is not None and tight.engine.swapper.pool.k_host.is_pinned()
    prompts = prompt_token_lists(roomy.tokenizer, 10, seed=6, lo=10, hi=50)
    assert _tokens(tight, prompts) == _tokens(roomy, prompts)
    assert tight.engine.swapper.manager.total_swapped_out > 0
