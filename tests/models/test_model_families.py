"""Every supported family gives transformers' greedy output, token for token (fp32).

Each family runs as a tiny random checkpoint of a real model's config scaled down
(``worker/engine/models/tiny_archs.py``: GQA ratios, head_dim != hidden / heads, windows
shorter than the prompts, layer patterns, soft-caps, multipliers, experts kept). The
engine runs a ragged batch of prompts longer than the windows with chunked prefill, a
pool small enough to force preemption, and prefix caching with shared prompt heads, and
must equal ``generate(do_sample=False)`` of transformers' own implementation on each
prompt alone.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import hf_greedy, prompt_token_lists
from worker.engine import LLMEngine, SamplingParams
from worker.engine.models.tiny import TINY_ARCHS

NEW_TOKENS = 24
WINDOWED = ("mistral", "gemma2", "gemma3", "phi3")


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def family_prompts(tokenizer) -> list[list[int]]:
    """Six ragged prompts of 21-70 tokens (all longer than the tiny windows), the last two
    sharing a 48-token head with the first (prefix-cache hits once it has run)."""
    prompts = prompt_token_lists(tokenizer, 4, seed=3, lo=21, hi=70)
    head = prompts[-1][:48]
    return [*prompts, [*head, 5, 9, 13], [*head, 7, 11]]


def run_engine(engine: LLMEngine, prompts: list[list[int]]) -> tuple[list[list[int]], int, int]:
    """Outputs in order, preemptions and prefix-cache tokens; the first prompt runs alone
    first so that later ones can hit its cached blocks."""
    done: dict[str, list[int]] = {}
    preemptions = cached = 0

    def drain() -> None:
        nonlocal preemptions, cached
        while engine.has_unfinished_requests():
            outputs, stats = engine.step()
            preemptions += stats.num_preemptions
            cached += stats.num_cached_tokens
            done.update({o.request_id: o.token_ids for o in outputs if o.finished})

    engine.add_request("r3", prompts[3], greedy(NEW_TOKENS))
    drain()
    for i, prompt in enumerate(prompts):
        if i != 3:
            engine.add_request(f"r{i}", prompt, greedy(NEW_TOKENS))
    drain()
    return [done[f"r{i}"] for i in range(len(prompts))], preemptions, cached


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_equals_transformers(arch: str) -> None:
    spec = f"tiny-{arch}"
    # 9 blocks of 16 tokens hold one or two of these sequences (a few more where windows
    # release blocks): the others wait or are preempted; 24 tokens a step chunk every prefill.
    tight = LLMEngine(model=spec, num_kv_blocks=9, max_num_seqs=6, max_num_batched_tokens=24,
                      enable_prefix_caching=True)
    prompts = family_prompts(tight.tokenizer)
    expected = [hf_greedy(spec, prompt, NEW_TOKENS) for prompt in prompts]
    outputs, preemptions, _ = run_engine(tight, prompts)
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        assert out == expected[i], f"{arch}, preempting: prompt {i} of {len(prompt)} tokens"
    assert preemptions > 0, "the pool was meant to force preemption"
    if tight.runner.spec.moe is not None and tight.runner.prepacked:  # experts packed for oneDNN
        assert all(layer.mlp.packed for layer in tight.runner.model.decoder_layers)
    # A committed pool with room hands out never-used blocks before cached ones, so what
    # the first sequence left (or released behind its windows) stays findable.
    roomy = LLMEngine(model=spec, num_kv_blocks=64, max_num_seqs=6, max_num_batched_tokens=24,
                      enable_prefix_caching=True, commit_kv_pool=True)
    outputs, _, cached = run_engine(roomy, prompts)
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        assert out == expected[i], f"{arch}, prefix cache: prompt {i} of {len(prompt)} tokens"
    assert cached >= 2 * 48, "the shared heads were meant to hit the prefix cache"


@pytest.mark.parametrize("arch", WINDOWED)
def test_an_ignored_window_would_be_caught(arch: str, monkeypatch) -> None:
    """The same checkpoint read with its windows switched off answers differently from
    transformers on these prompts, so the test above fails if the window is ignored."""
    from worker.engine.models import registry

    spec = f"tiny-{arch}"
    windowed = registry.arch_spec

    def unwindowed(config):
        read = windowed(config)
        assert any(read.layer_windows)
        return dataclasses.replace(read, layer_windows=(0,) * read.num_layers)

    monkeypatch.setattr(registry, "arch_spec", unwindowed)
    engine = LLMEngine(model=spec, num_kv_blocks=64, max_num_seqs=6)
    assert not any(engine.runner.spec.layer_windows)
    prompts = family_prompts(engine.tokenizer)[:4]
    outputs, _, _ = run_engine(engine, prompts)
    differ = sum(out != hf_greedy(spec, p, NEW_TOKENS) for p, out in zip(prompts, outputs, strict=True))
    assert differ >= 3, f"{arch}: only {differ} of 4 prompts depend on the window"


def test_every_family_has_a_tiny_checkpoint() -> None:
    from worker.engine.models.registry import SUPPORTED_MODEL_TYPES
    from worker.engine.models.tiny_archs import REAL_CONFIGS

    covered = {c["model_type"] for c in REAL_CONFIGS.values()} | {"llama", "qwen2"}
    assert covered == set(SUPPORTED_MODEL_TYPES)


def test_spec_reads_each_family_as_its_real_config_says() -> None:
    from transformers import AutoConfig

    from worker.engine.models.registry import arch_spec
    from worker.engine.models.tiny_archs import REAL_CONFIGS

    def spec_of(arch: str):
        real = dict(REAL_CONFIGS[arch])
        return arch_spec(AutoConfig.for_model(real.pop("model_type"), **real, vocab_size=1000))

    gemma3 = spec_of("gemma3")
    assert gemma3.layer_windows[:6] == (1024,) * 5 + (0,)
    assert gemma3.layer_rope[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert gemma3.max_window == 0 and gemma3.qk_norm == "head" and gemma3.norm_offset == 1.0
    gemma2 = spec_of("gemma2")
    assert (gemma2.attn_softcap, gemma2.final_softcap) == (50.0, 30.0)
    assert gemma2.layer_windows[:2] == (4096, 0)
    assert spec_of("mistral").max_window == 4096
    assert spec_of("phi4mini").ropes["default"].rotary_dim == 96
    smollm3 = spec_of("smollm3")
    assert [r is None for r in smollm3.layer_rope[:4]] == [False, False, False, True]
    qwen3moe = spec_of("qwen3moe")
    assert qwen3moe.moe is not None and qwen3moe.moe.sparse_layers == frozenset(range(48))
