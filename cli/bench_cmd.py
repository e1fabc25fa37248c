"""``inflight bench``: this engine (continuous and static) against HF ``generate``, one run.

The measuring lives in ``cli.bench``; this module only parses options and
imports torch (through the runner) inside ``run()``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

_CONFIG_NAMES = ("inflight", "inflight-bf16", "static-16", "static-padded-16", "continuous-16",
                 "continuous-64", "continuous-64+ngram", "hf-16", "vllm")
_DEFAULT_CONFIGS = ("inflight", "inflight-bf16", "static-16", "continuous-16", "hf-16")
_DESCRIPTION = """\
Time this engine as LLM() builds it (fp32, and bf16 by choice), with continuous batching
at 16 and 64 slots (64 also with n-gram speculative decoding), its static policies
(cohorts of 16; static-padded-16: finished members keep computing a pad row until their
cohort ends, as HF generate does), Hugging Face generate (left-padded batches of 16) and,
with --peer vllm, vLLM for the CPU (in its own environment: bash benchmarks/peer/setup_vllm.sh), on one workload, one
after another in one invocation, and print every ratio, the share of requests whose first
16 tokens agree with the exact fp32 output, slot utilization, KV waste, peak RSS and the
machine's CPU and vector extensions. Load, compilation and warm-up are never timed.
Writes OUT_DIR/bench.json and OUT_DIR/bench_occupancy.png (sequences per step,
continuous-16 vs static-16, when both run; the plot needs matplotlib:
pip install 'inflight[bench]')."""


BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
# Named workloads of a checkout of the repository (the benchmark's data and peer scripts
# live in its ``benchmarks/``, not in the installed package), with their target over vLLM.
WORKLOADS = {"chat": ("chat_workload.jsonl", 1.5), "long-tail": ("long_tail_workload.jsonl", 1.3)}


def _workload_path(text: str) -> Path:
    """A named workload's file, or the path given."""
    return BENCHMARKS_DIR / WORKLOADS[text][0] if text in WORKLOADS else Path(text)


def _over_vllm_target(path: Path) -> float:
    """The workload's target over vLLM: its own for a named one, the chat's otherwise."""
    for target_file, target in WORKLOADS.values():
        if path == BENCHMARKS_DIR / target_file:
            return target
    return WORKLOADS["chat"][1]


def _configs(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in _CONFIG_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a comma-separated list of {', '.join(_CONFIG_NAMES)}")
    return names


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: must be in (0, 1]")
    return value


def add_parser(subparsers: Any) -> None:
    """Register ``bench`` on the ``inflight`` subparsers."""
    parser = subparsers.add_parser(
        "bench", help="benchmark the engine against its static policy and HF",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m",
                        help="model spec, as for generate (default: %(default)s)")
    parser.add_argument("--workload", action="append", metavar="NAME|JSONL",
                        help="requests {id, prompt_token_ids, max_tokens}: 'chat' "
                             "(benchmarks/chat_workload.jsonl, the default), 'long-tail' "
                             "(benchmarks/long_tail_workload.jsonl: 64 requests of 8-512 "
                             "tokens) or a file (benchmarks/heavy_tailed.jsonl is the older "
                             "random-token workload); repeat it to run several in one "
                             "invocation, each into OUT_DIR/<its name>")
    parser.add_argument("--out-dir", default="benchmarks/results", metavar="DIR",
                        help="where bench.json and the PNG go (default: %(default)s)")
    parser.add_argument("--configs", type=_configs, default=list(_DEFAULT_CONFIGS),
                        metavar="A,B", help=f"runs to do, from {', '.join(_CONFIG_NAMES)} "
                                            f"(default: {','.join(_DEFAULT_CONFIGS)})")
    parser.add_argument("--skip-hf", action="store_true", help="leave out the hf-16 run")
    parser.add_argument("--peer", choices=("vllm",), action="append", default=[],
                        help="also run this peer system in the same invocation")
    parser.add_argument("--peer-search", action="store_true",
                        help="run the peer at its best: try its preloads and batch settings "
                             "one at a time from its defaults and keep the fastest (several "
                             "peer runs per workload)")
    parser.add_argument("--peer-python", type=Path, metavar="PYTHON",
                        help="the peer environment's interpreter "
                             "(default: .peer/vllm-venv/bin/python)")
    parser.add_argument("--peer-memory-fraction", type=_fraction, metavar="F",
                        help="the share of memory the peer may reserve (vLLM's "
                             "gpu_memory_utilization; default 0.5, which leaves a model of "
                             "more than a third of the machine's memory no room for KV)")
    parser.add_argument("--limit", type=_positive, metavar="N",
                        help="only the first N requests (a quick smoke run)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        default="float32", help="weights and KV dtype (default: %(default)s)")
    parser.add_argument("--threads", type=_positive, metavar="N",
                        help="torch CPU threads (default: torch's own)")
    parser.add_argument("--num-kv-blocks", type=_positive, metavar="N",
                        help="KV pool size (default: enough for the whole workload at once)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 on success (targets missed are reported, not an error)."""
    from cli.bench.report import format_report
    from cli.bench.runner import BenchOptions, run_benchmark

    configs = [c for c in args.configs if not (args.skip_hf and c == "hf-16")]
    configs += [p for p in args.peer if p not in configs]
    if not configs:
        print("inflight bench: error: no configuration left to run", file=sys.stderr)
        return 2
    workloads = [_workload_path(w) for w in args.workload or ["chat"]]
    for path in workloads:
        if not path.is_file():
            print(f"inflight bench: error: workload {str(path)!r} does not exist (the named "
                  "workloads are files of a checkout of the repository's benchmarks/; pass "
                  "a file otherwise)", file=sys.stderr)
            return 2
    say = (lambda _: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    summary = []
    for path in workloads:
        out_dir = Path(args.out_dir) / path.stem if len(workloads) > 1 else Path(args.out_dir)
        opts = BenchOptions(
            model=args.model, workload=path, out_dir=out_dir, configs=configs,
            limit=args.limit, dtype=args.dtype, threads=args.threads,
            num_kv_blocks=args.num_kv_blocks, peer_python=args.peer_python,
            peer_search=args.peer_search, peer_memory_fraction=args.peer_memory_fraction,
            over_vllm_target=_over_vllm_target(path),
            command="inflight " + shlex.join(sys.argv[1:]))
        say(f"== workload {path.name}")
        try:
            result = run_benchmark(opts, say=say)
        except (ValueError, OSError, RuntimeError) as exc:
            print(f"inflight bench: error: {exc}", file=sys.stderr)
            return 1
        print(f"== {path.name}\n{format_report(result)}")
        print(f"wrote {out_dir / 'bench.json'}", file=sys.stderr)
        vllm_ratio = result["ratios"].get("inflight / vllm")
        if vllm_ratio is not None:
            summary.append(f"{path.name}: inflight / vllm = {vllm_ratio:.3f}")
    if len(summary) > 1:
        print("\n".join(["== all workloads of this invocation", *summary]))
    return 0
