"""Loading streams the weights: peak host memory is the model once plus at most one shard.

A Qwen3-shaped checkpoint of about 390 MB in five safetensors shards (with
``model.safetensors.index.json``) is written, then loaded by a fresh process through the
engine's own path (``ModelRunner``). That process reports its resident memory before the
load and its peak after; the growth must stay within the model's bytes plus the largest
shard (plus a small allowance for the tokenizer and allocator).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worker.engine.models.cpu_linear import packer_for
from worker.engine.models.tiny import build_tiny_checkpoint

SLACK = 48 << 20  # tokenizer, rope tables, allocator rounding

PROBE = r"""
import json, sys
import torch
from worker.engine.config import EngineArgs
from worker.engine.models.loader import load_checkpoint

def status(field):  # bytes; VmHWM is this address space's peak (ru_maxrss would keep the
    with open("/proc/self/status") as f:  # forked parent's size across exec)
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))

# Before the baseline: transformers, the tokenizer, and the native kernels (whose first
# build in a process imports torch's extension builder).
load_checkpoint(sys.argv[1])
from kernels import get_backend
from kernels.cpu_fused import ops_for
get_backend(torch.device("cpu")), ops_for(torch.device("cpu"), torch.float32)
from worker.engine.model_runner import ModelRunner
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from the current RSS
before = status("VmRSS")
runner = ModelRunner(EngineArgs(model=sys.argv[1], num_kv_blocks=4, dtype=sys.argv[2],
                                prepack_weights=sys.argv[3] == "prepack"))
peak = status("VmHWM")
# the weights' bytes at the model's dtype (prepacked linears hold theirs outside parameters)
index = json.load(open(sys.argv[1] + "/model.safetensors.index.json"))
model_bytes = index["metadata"]["total_size"] // 4 * runner.dtype.itemsize
print(json.dumps({"before": before, "peak": peak, "model_bytes": model_bytes}))
"""


@pytest.fixture(scope="module")
def sharded_checkpoint(tmp_path_factory) -> Path:
    """A Qwen3 of hidden 1024 and 6 layers (~390 MB in fp32), saved in ~80 MB shards."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny = build_tiny_checkpoint(tmp_path_factory.mktemp("tok"), "qwen3")
    config = json.loads((tiny / "config.json").read_text())
    config.update(hidden_size=1024, intermediate_size=3072, num_hidden_layers=6,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=4096,
                  tie_word_embeddings=False)
    config.pop("layer_types", None)  # derived again for 12 layers
    from transformers import AutoConfig

    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    target = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(target, max_shard_size="80MB")
    AutoTokenizer.from_pretrained(tiny).save_pretrained(target)
    return target


@pytest.mark.parametrize("packing", ["prepack", "plain"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_peak_memory_is_the_model_plus_one_shard(sharded_checkpoint: Path, dtype: str, packing: str) -> None:
    shards = sorted(sharded_checkpoint.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (sharded_checkpoint / "model.safetensors.index.json").is_file()
    largest = max(s.stat().st_size for s in shards)
    total = sum(s.stat().st_size for s in shards)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(sharded_checkpoint), dtype, packing],
        capture_output=True, text=True, timeout=600, check=False,
        env={"INFLIGHT_ALLOCATOR": "system", "PATH": "/usr/bin:/bin"},
    )
    if packing == "prepack" and packer_for(getattr(torch, dtype)) is None:
        # no packed linears for this dtype on this CPU (oneDNN's bf16 path needs avx512bw/vl/dq
        # or avx_ne_convert): asking for them must be refused by name, not load unpacked
        assert result.returncode != 0 and "prepack_weights=True needs packed CPU linears" in result.stderr
        return
    assert result.returncode == 0, result.stderr[-3000:]  # the probe's own error, not only its exit code
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    growth = figures["peak"] - figures["before"]
    bound = figures["model_bytes"] + largest + SLACK
    assert growth <= bound, (
        f"loading grew RSS by {growth >> 20} MiB; bound {bound >> 20} MiB (model "
        f"{figures['model_bytes'] >> 20} MiB + largest shard {largest >> 20} MiB; all shards {total >> 20} MiB)")
