"""Engine options shared by the commands that run an engine (no torch import here).

``add_engine_flags(parser)`` adds ``--model``, ``--dtype``, ``--device``, ``--max-num-seqs``...;
``engine_args_from(args)`` turns the parsed flags into an ``EngineArgs``. Flags left unset
keep EngineArgs' own defaults.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

# flag dest -> EngineArgs field (the same name)
_ENGINE_FIELDS = (
    "model", "dtype", "device", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
    "num_kv_blocks", "kv_cache_memory", "commit_kv_pool", "block_size", "policy", "fair_share",
    "enable_prefix_caching",
    "enable_chunked_prefill", "attention_backend", "seed", "num_threads", "prepack_weights",
    "num_speculative_tokens", "speculative_max_rows",
    "interactive_reserve_seqs", "interactive_reserve_tokens", "interactive_priority",
    "interactive_batch_rows", "interactive_step_ms", "interactive_fast_lane", "interactive_interject_ms",
)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_bytes(text: str) -> int:
    """``"4GiB"``, ``"512MB"``, ``"1e9"`` or ``"1073741824"`` as a number of bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]i?)?[bB]?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (examples: 4GiB, 512MB)")
    try:
        value = float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least one byte")
    return int(value)


def add_engine_flags(parser: argparse.ArgumentParser, *, default_model: str = "smollm2-135m"
                     ) -> None:
    """Add the engine's options to ``parser`` (in an "engine" argument group)."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=default_model,
                   help="smollm2-135m, tiny-llama, tiny-qwen2, a HF directory, a GGUF file or "
                        "a hub id (default: %(default)s)")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights and KV dtype (default: auto: float32 on CPU, bfloat16 on CUDA)")
    g.add_argument("--device", help="cpu, cuda, cuda:1... (default: cuda when available)")
    g.add_argument("--max-num-seqs", type=int, metavar="N",
                   help="most sequences running in one step (default: 256)")
    g.add_argument("--max-num-batched-tokens", type=int, metavar="N",
                   help="token budget of one step, prefill chunks included (default: 2048)")
    g.add_argument("--max-model-len", type=int, metavar="N",
                   help="context length, prompt plus output (default: the model's)")
    g.add_argument("--num-kv-blocks", type=int, metavar="N",
                   help="size of the KV pool in blocks (overrides --kv-cache-memory)")
    g.add_argument("--kv-cache-memory", type=parse_bytes, metavar="SIZE",
                   help="memory for the KV pool, e.g. 2GiB (default: 80%% of free GPU "
                        "memory, 1GiB on CPU)")
    g.add_argument("--commit-kv-pool", action="store_true", default=None,
                   help="CPU: hold the whole KV pool from the start, so freed prefix blocks "
                        "stay cached until the pool is full (default: the pool's memory "
                        "follows the most blocks in use at once, and freed blocks are reused "
                        "first)")
    g.add_argument("--block-size", type=int, metavar="N", help="tokens per KV block (default: 16)")
    g.add_argument("--policy", choices=("fcfs", "static", "static-padded", "priority", "sjf", "fair"),
                   help="scheduling policy (default: fcfs)")
    g.add_argument("--fair-share", choices=("tokens", "engine_seconds"),
                   help="fair policy: serve next the tenant served least in tokens computed "
                        "or in engine-seconds (each step's time split by rows; default: "
                        "tokens)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse the KV of shared prompt prefixes (default: on; "
                        "--no-enable-prefix-caching turns it off)")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                   default=None, help="prefill each prompt in one step")
    g.add_argument("--attention-backend", choices=("torch", "cpu", "triton"),
                   help="attention kernels (default: triton on CUDA, the native C++ kernel "
                        "on CPU; torch is the pure-torch reference)")
    g.add_argument("--no-prepack-weights", dest="prepack_weights", action="store_false",
                   default=None, help="CPU: plain F.linear instead of oneDNN-prepacked weights")
    g.add_argument("--num-speculative-tokens", type=int, metavar="K",
                   help="n-gram draft tokens per greedy sequence per step (default: 0, off)")
    g.add_argument("--speculative-max-rows", type=int, metavar="N",
                   help="no drafts beyond N decode rows plus drafts in a step (default: 128)")
    g.add_argument("--interactive-reserve-seqs", type=int, metavar="N",
                   help="sequence slots batch jobs never take, kept for interactive ones "
                        "(default: 4, at most a quarter of --max-num-seqs)")
    g.add_argument("--interactive-reserve-tokens", type=int, metavar="N",
                   help="step tokens batch prefill never takes, kept for interactive "
                        "prompts (default: 256, at most a quarter of the step budget)")
    g.add_argument("--interactive-priority", action=argparse.BooleanOptionalAction, default=None,
                   help="admit waiting interactive jobs before batch ones, preempting a batch "
                        "sequence when slots or KV blocks are full (default: on)")
    g.add_argument("--interactive-step-ms", type=float, metavar="MS",
                   help="while interactive jobs run or wait, only as many rows of batch work "
                        "per step as fit in about MS milliseconds (learnt from the recent "
                        "steps), the batch sequences taking turns: interactive streams get a "
                        "token every MS, the batch fewer rows a step (default: 0, no time target)")
    g.add_argument("--interactive-batch-rows", type=int, metavar="N",
                   help="while interactive jobs run or wait, at most N rows of batch work "
                        "per step, whatever the time (default: 0, no fixed cap)")
    g.add_argument("--interactive-fast-lane", action=argparse.BooleanOptionalAction, default=None,
                   help="the step that admits a newly arrived interactive job computes no "
                        "batch rows (never two such steps in a row), so its prompt waits on "
                        "interactive work only (default: on; needs --interactive-priority)")
    g.add_argument("--interactive-interject-ms", type=float, metavar="MS",
                   help="a step expected to take longer than MS milliseconds pauses between "
                        "layers to run newly arrived interactive jobs' prompts in a step of "
                        "their own (default: 100; 0: never; needs --interactive-priority)")
    g.add_argument("--seed", type=int, help="seed of requests that do not set their own")
    g.add_argument("--num-threads", type=int, metavar="N", help="torch threads on CPU")


def engine_kwargs_from(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options given on the command line, ``--model`` aside (torch-free)."""
    return {name: getattr(args, name) for name in _ENGINE_FIELDS
            if name != "model" and getattr(args, name, None) is not None}


def engine_args_from(args: argparse.Namespace) -> Any:
    """An ``EngineArgs`` from the parsed flags (imports the engine: call it inside run())."""
    from worker.engine.config import EngineArgs

    return EngineArgs(model=args.model, **engine_kwargs_from(args))
