"""Save a model's checkpoint in bf16, as most published checkpoints are, for runs of a bf16
checkpoint in fp32 (``inflight bench --model DIR --dtype float32``, vLLM on the same files).

The SmolLM2 this project ships is a Q4_1 GGUF dequantized to fp32, whose values bf16 cannot
hold, so its linears stay in fp32 panels; the published SmolLM2-135M-Instruct is bf16. This
writes the model's weights rounded to bf16 (each to the nearest bf16 value) with its
tokenizer, so the engine keeps them in bf16 panels (``worker/engine/models/cpu_linear.py``).

Usage: ``.venv/bin/python -m benchmarks.bf16_checkpoint smollm2-135m /tmp/smollm2-bf16``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

TOKENIZER_PREFIXES = ("tokenizer", "special_tokens", "vocab", "merges")


def save_bf16(source: Path, directory: Path) -> Path:
    """The HF checkpoint in ``source`` written to ``directory`` in bf16, tokenizer included."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(directory)
    for path in source.iterdir():
        if path.is_file() and path.name.startswith(TOKENIZER_PREFIXES):
            shutil.copy(path, directory / path.name)
    return directory


def main(argv: list[str] | None = None) -> int:
    from worker.engine.models.loader import resolve_checkpoint_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a model alias (smollm2-135m, tiny-llama, ...) or an HF directory")
    p.add_argument("directory", type=Path)
    args = p.parse_args(argv)
    if (args.directory / "config.json").is_file():
        print(f"{args.directory}: already written")
        return 0
    source = resolve_checkpoint_dir(args.model)
    if not isinstance(source, Path) and not Path(source).is_dir():
        p.error(f"{args.model}: not a local checkpoint")
    save_bf16(Path(source), args.directory)
    size = sum(f.stat().st_size for f in args.directory.glob("*.safetensors"))
    print(f"{args.directory}: {args.model} in bf16, {size / 2**20:.0f} MiB of weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
