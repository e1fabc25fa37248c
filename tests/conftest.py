"""Shared fixtures: model checkpoints (built or converted once, cached) and HF references."""

from __future__ import annotations

import functools

import pytest
import torch

from worker.engine.models.loader import resolve_checkpoint_dir


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` are skipped, saying why, where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class EarlyFailureLines:
    """Prints why each of the first failures failed as it happens, not only at the
    end: a run cut short (CI's time limit) still says why its first tests failed."""

    def __init__(self, config, limit: int = 20) -> None:
        self.config = config
        self.left = limit

    def pytest_runtest_logreport(self, report) -> None:
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if not report.failed or self.left <= 0 or reporter is None:
            return
        self.left -= 1
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
        why = crash or (str(report.longrepr).strip().splitlines() or [""])[-1]
        reporter.write_line(f"\n{report.when} failed: {report.nodeid}: {' | '.join(why.splitlines())[:300]}")


def pytest_configure(config) -> None:
    config.pluginmanager.register(EarlyFailureLines(config), "early-failure-lines")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A three-node Redis Cluster on loopback made for this session (skipped, saying why,
    where redis-server is not installed); ``.url`` names it (``redis+cluster://``)."""
    from tests.service.redis_cluster import local_cluster, missing_binaries

    why = missing_binaries()
    if why is not None:
        pytest.skip(why)
    with local_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


@functools.cache
def checkpoint_dir(spec: str) -> str:
    """Local HF directory of ``spec`` (tiny models are built, GGUF converted, once)."""
    return str(resolve_checkpoint_dir(spec))


@functools.cache
def hf_model(spec: str):
    """The Hugging Face model for ``spec`` in fp32, eval mode (cached per session)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint_dir(spec), dtype=torch.float32)
    return model.eval()


def hf_greedy(spec: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face ``generate(do_sample=False)`` on one prompt alone, never stopping early."""
    model = hf_model(spec)
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            eos_token_id=[],  # run to max_new_tokens, like ignore_eos on our side
            pad_token_id=model.config.pad_token_id or 0,
        )
    return out[0, len(prompt_ids) :].tolist()


def blocks_consistent(bm, seqs) -> bool:
    """Block-manager invariants: reference counts match the owners' block tables, a block
    is free exactly when nobody owns it, the free count counts those, and a free block is
    in the cache's queue exactly when it is findable. Entries released out of a sliding
    window (-1) own nothing and must form a prefix of their table."""
    counts = [0] * bm.num_blocks
    for seq in seqs:
        held = [block for block in seq.block_table if block != -1]
        if seq.block_table[len(seq.block_table) - len(held):] != held:
            return False  # a -1 after a held block
        for block in held:
            counts[block] += 1
    free_ok = all((counts[b] == 0) == bm.is_free(b) for b in range(bm.num_blocks))
    count_ok = sum(map(bm.is_free, range(bm.num_blocks))) == bm.num_free_blocks
    queues_ok = (all(bm.block_hashes[b] is not None for b in bm.free_cached)
                 and all(bm.block_hashes[b] is None for b in bm.free_plain))
    return counts == bm.ref_counts and free_ok and count_ok and queues_ok


def prompt_token_lists(tokenizer, count: int, seed: int = 0, lo: int = 3, hi: int = 60) -> list[list[int]]:
    """``count`` prompts of spread-out lengths, from real text, deterministic."""
    words = ["the", "engine", "schedules", "one", "token", "per", "running", "sequence", "while", "new", "requests", "wait", "for", "free", "blocks", "in", "the", "paged", "cache", "and", "finished", "ones", "leave", "at", "once", "so", "the", "batch", "stays", "full"]
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(lo, hi, count).round().int().tolist()
    prompts = []
    for n in lengths:
        order = torch.randint(0, len(words), (n,), generator=gen).tolist()
        ids = tokenizer(" ".join(words[i] for i in order), add_special_tokens=False)["input_ids"]
        prompts.append(list(ids[:n]) or [1])
    return prompts


@pytest.fixture(scope="session")
def tiny_llama_engine():
    """A session-wide engine on the tiny random Llama (tests must leave it drained)."""
    from worker.engine import LLMEngine

    return LLMEngine(model="tiny-llama", max_num_seqs=32, num_kv_blocks=256, block_size=16)
