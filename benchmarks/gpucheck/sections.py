"""The checks of ``benchmarks/gpu_check.py``, one function per section: ``fn(rec, ws)``.

Each records checks (skipped with a reason where the device cannot run them), figures
and tables; see ``report``. Goals from the issue are recorded as figures, not checks: a
missed goal is a finding, not a broken check.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from benchmarks.gpucheck import bandwidth, graphs, parity, throughput
from benchmarks.gpucheck.device import (
    copy_bandwidth_gbs,
    flush_buffer,
    is_cuda,
    release_memory,
)
from benchmarks.gpucheck.pytest_runs import (
    REPO_ROOT,
    PytestResult,
    gpu_marked_files,
    parallel_args,
    pytest_available,
    run_pytest,
)
from benchmarks.gpucheck.report import Recorder
from benchmarks.gpucheck.workspace import Workspace
from cli.bench.workload import BenchRequest
from kernels.cpu_fused import ops_for

NO_CUDA = "no CUDA device here"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
GOALS = {"engine / HF continuous tokens/s": 2.0, "decode attention / copy bandwidth": 0.7,
         "batch-1 decode step / weight-streaming bound (at most)": 1.5}


def _record_pytest(rec: Recorder, name: str, result: PytestResult) -> None:
    reason = None if result.ok else (
        "did not finish: " + result.output_tail[-300:] if result.returncode is None
        else f"{result.failed} failed, {result.errors} errors, {result.passed} passed")
    rec.check(name, result.ok, reason, passed=result.passed, failed=result.failed,
              errors=result.errors, skipped=result.skipped, failures=result.failures,
              skip_reasons=result.skip_reasons,
              output_tail=None if result.ok else result.output_tail)
    rec.table(name, ["passed", "failed", "errors", "skipped"],
              [[result.passed, result.failed, result.errors, result.skipped]])
    for failure in result.failures:
        rec.note(f"- FAILED {failure}")


def _can_run_pytest_on_cuda(rec: Recorder, ws: Workspace, name: str, off_cuda: str) -> bool:
    """CUDA and pytest are both here; otherwise record the skip and why."""
    if not is_cuda(ws.plan.device):
        rec.skip(name, f"{NO_CUDA}; {off_cuda}")
        return False
    if not pytest_available():
        rec.skip(name, "pytest is not installed: carry its wheels (docs/kernels.md)")
        return False
    return True


def kernel_tests(rec: Recorder, ws: Workspace) -> None:
    """tests/kernels/test_triton.py and test_triton_fused.py compiled on CUDA (same grids as
    under the interpreter)."""
    name = "Triton kernel tests on CUDA"
    if not _can_run_pytest_on_cuda(rec, ws, name, "the test suite runs them under the "
                                                  "Triton interpreter"):
        return
    result = run_pytest(["tests/kernels/test_triton.py", "tests/kernels/test_triton_fused.py"],
                        extra_args=parallel_args(),
                        timeout_s=ws.plan.kernel_tests_timeout_s,
                        env={"INFLIGHT_TRITON_TEST_DEVICE": "cuda", "TRITON_INTERPRET": None})
    _record_pytest(rec, name, result)


def gpu_tests(rec: Recorder, ws: Workspace) -> None:
    """The engine's tests marked ``gpu`` (``pytest -m gpu``)."""
    name = "pytest -m gpu"
    if not _can_run_pytest_on_cuda(rec, ws, name, "gpu-marked tests skip themselves without one"):
        return
    files = gpu_marked_files(REPO_ROOT / "tests")
    if not rec.check("gpu-marked test files found", bool(files), "none under tests/",
                     files=[f.name for f in files]):
        return
    result = run_pytest(files, extra_args=["-m", "gpu"], timeout_s=ws.plan.gpu_tests_timeout_s)
    _record_pytest(rec, name, result)


def decode_graphs(rec: Recorder, ws: Workspace) -> None:
    """Capture over the batch-size ladder; replay equals the eager forward at every size."""
    engine = ws.engine()
    runner = engine.runner
    captured = runner.decode_graphs
    if not rec.check("the engine built its decode graphs", captured is not None):
        return
    if is_cuda(ws.plan.device):
        rec.check("a CUDA graph captured for every ladder size",
                  sorted(captured.graphs) == captured.ladder, "missing sizes",
                  ladder=captured.ladder, captured=sorted(captured.graphs))
    else:
        rec.skip("CUDA graph capture", f"{NO_CUDA}; the padded static buffers run eagerly "
                                       "and are compared below")
    graphs.randomize_kv(runner.kv_caches, ws.plan.seed)
    rows = graphs.compare_replay_with_eager(
        captured, num_blocks=runner.k_pool.shape[1], block_size=runner.block_size,
        max_context=ws.plan.graphs_max_context, seed=ws.plan.seed,
        time_iters=ws.plan.graphs_time_iters)
    tolerance = graphs.TOLERANCE[engine.dtype]
    worst = max(r["padded_diff_over_std"] for r in rows)
    rec.check(f"replay equals the eager forward of its padded buffers at {len(rows)} "
              "batch sizes", worst <= tolerance,
              f"worst |replay - padded eager| / std = {worst:.3g} > {tolerance}", worst=worst,
              tolerance=tolerance)
    tolerance = graphs.PADDING_TOLERANCE[engine.dtype]
    worst = max(r["max_abs_diff_over_std"] for r in rows)
    rec.check(f"replay within rounding of the unpadded eager forward at {len(rows)} batch "
              "sizes", worst <= tolerance,
              f"worst |replay - eager| / std = {worst:.3g} > {tolerance}", worst=worst,
              tolerance=tolerance)
    rec.figures["replay_vs_eager"] = rows
    columns = list(rows[0])
    rec.table(f"Decode graphs, {ws.plan.big_arch} {_dtype_name(engine.dtype)}", columns,
              [[r.get(c) for c in columns] for r in rows])


def _parity_of(ws: Workspace, model: str, dtype: str) -> list[parity.PromptParity]:
    """Greedy tokens of this engine and of HF on seeded prompts, compared per prompt (the
    big engine serves its own model and dtype; other pairs get a small engine)."""
    from worker.engine import EngineArgs, LLMEngine

    plan = ws.plan
    path = ws.checkpoint(model)
    if model == plan.big_arch and dtype == plan.engine_dtype:
        engine = ws.engine()
    else:
        engine = LLMEngine(EngineArgs(
            model=path, device=plan.device.type, dtype=dtype,
            attention_backend=plan.attention_backend, max_num_seqs=plan.parity_prompts,
            max_model_len=plan.max_model_len, num_kv_blocks=256, block_size=plan.block_size,
            seed=plan.seed))
    vocab = engine.runner.model.config.vocab_size
    prompts = parity.random_prompts(plan.parity_prompts, vocab, seed=plan.seed,
                                    min_len=plan.parity_prompt_len[0],
                                    max_len=plan.parity_prompt_len[1])
    ours = parity.engine_greedy(engine, prompts, plan.parity_new_tokens)
    del engine
    release_memory(plan.device)
    hf = parity.load_hf(path, dtype, plan.device)
    results = []
    for prompt, tokens in zip(prompts, ours, strict=True):
        theirs, scores = parity.hf_greedy_with_scores(hf, prompt, plan.parity_new_tokens)
        results.append(parity.compare(tokens, theirs, scores))
    del hf
    release_memory(plan.device)
    return results


def parity_checks(rec: Recorder, ws: Workspace) -> None:
    """Greedy tokens equal HF ``generate`` (up to near ties) per model and dtype."""
    plan = ws.plan
    rows = []
    for model in plan.parity_models:
        for dtype in plan.parity_dtypes:
            name = f"{model} {dtype}"
            results = rec.attempt(name, functools.partial(_parity_of, ws, model, dtype))
            release_memory(plan.device)
            if results is None:
                continue
            margins = [r.margin_over_std for r in results]
            rec.check(name, all(r.verdict(dtype) for r in results),
                      f"a difference that is not a near tie of HF's logits (tolerance "
                      f"{parity.TIE_TOLERANCE[dtype]} std)", matched=[r.matched for r in results],
                      compared=plan.parity_new_tokens, margins_over_std=margins)
            rows.append([model, dtype, len(results), sum(r.matched == r.length for r in results),
                         min(r.matched for r in results), plan.parity_new_tokens,
                         max((m for m in margins if m is not None), default=None)])
    rec.table("Greedy parity against HF generate",
              ["model", "dtype", "prompts", "identical", "min matched", "tokens",
               "worst margin / std"], rows)


def bandwidth_figures(rec: Recorder, ws: Workspace) -> None:
    """Decode attention vs copy bandwidth; decode step time vs weight streaming."""
    from kernels import reference

    plan, device = ws.plan, ws.plan.device
    engine = ws.engine()
    flush = flush_buffer(device)
    copy = copy_bandwidth_gbs(device, plan.copy_bytes, iters=plan.timing_iters, flush=flush)
    rec.figures["copy_gb_per_s"] = copy
    cfg = engine.runner.model.config
    shape = {"num_heads": cfg.num_attention_heads, "num_kv_heads": cfg.num_key_value_heads,
             "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
             "block_size": plan.block_size, "dtype": engine.dtype, "device": device}
    backend = engine.runner.backend
    k, v, table, lens = bandwidth.paged_kv(3, 100, **{k: shape[k] for k in (
        "num_kv_heads", "head_dim", "block_size", "dtype", "device")})
    q = torch.randn(3, shape["num_heads"], shape["head_dim"], device=device).to(engine.dtype)
    got = backend.decode_attention(q, k, v, table, lens, 0.125).float()
    want = reference.decode_attention(q.float(), k.float(), v.float(), table, lens, 0.125)
    rec.check(f"{backend.name} decode attention equals the torch reference",
              torch.allclose(got, want, atol=2e-2, rtol=2e-2), "outputs differ")
    attention = [bandwidth.decode_attention_bandwidth(backend, batch=b, context=c, **shape,
                                                      iters=plan.timing_iters, flush=flush)
                 for b, c in plan.attention_shapes]
    for row in attention:
        row["fraction_of_copy"] = row["gb_per_s"] / copy
    steps = bandwidth.decode_step_times(engine, plan.step_batches, context=plan.step_context,
                                        iters=plan.timing_iters, copy_gbs=copy, flush=flush)
    with bandwidth.torch_layer_ops(engine) as torch_graphs:  # the A/B of the fused ops
        torch_steps = bandwidth.decode_step_times(
            engine, plan.step_batches, context=plan.step_context, iters=plan.timing_iters,
            copy_gbs=copy, flush=flush, graphs=torch_graphs)
    rec.check("decode steps timed at every batch size",
              all(r["step_ms"] > 0 for r in steps + torch_steps), "a step took no time")
    rec.figures.update(decode_attention=attention, decode_steps=steps,
                       decode_steps_torch_ops=torch_steps)
    rec.figures["goals"] = {
        "decode attention / copy bandwidth": max(r["fraction_of_copy"] for r in attention),
        "batch-1 decode step / weight-streaming bound (at most)": steps[0]["over_bound"]}
    rec.table(f"Decode attention ({backend.name}, {_dtype_name(engine.dtype)}); "
              f"copy {copy:.1f} GB/s",
              ["batch", "context", "ms", "GB/s", "of copy"],
              [[r["batch"], r["context"], r["ms"], r["gb_per_s"], r["fraction_of_copy"]]
               for r in attention])
    ops = ops_for(device, engine.dtype).name
    rec.table(f"Decode step, {plan.big_arch} {_dtype_name(engine.dtype)}: element-wise ops "
              f"{ops} against torch's (the same steps, graphs captured each way)",
              ["batch", "mean context", "step ms", "weight bound ms", "step / bound", "graphs",
               "kernels", "kernel ms", "torch ops: step ms", "kernels", "step / torch ops"],
              [[r["batch"], r["mean_context"], r["step_ms"], r["weight_bound_ms"],
                r["over_bound"], r["graphs"], *_profiled(r), t["step_ms"], _profiled(t)[0],
                r["step_ms"] / t["step_ms"]] for r, t in zip(steps, torch_steps, strict=True)])


def _profiled(row: dict[str, Any]) -> list[Any]:
    """Kernels per step and their summed ms from a step row's profile ("-" where none)."""
    prof = row.get("profile") or {}
    return [prof.get("kernels", "-"), prof.get("kernel_ms", "-")]


def throughput_runs(rec: Recorder, ws: Workspace) -> None:
    """The engine (continuous with graphs, again with the torch element-wise ops, without
    graphs; padded static) against HF, in turn."""
    from cli.bench.engine_run import warm_up
    from worker.engine.config import POLICIES

    plan = ws.plan
    requests = ws.workload()
    rec.figures["workload"] = throughput.workload_summary(requests)
    engine = ws.engine()
    warm_up(engine, requests, max_num_seqs=plan.slots)
    has_policy = "static-padded" in POLICIES
    engine_runs = {
        "engine continuous, graphs": functools.partial(
            throughput.run_engine_config, engine, requests, name="cont-graphs",
            slots=plan.slots, policy="fcfs", graphs=True),
        "engine continuous, graphs, torch element-wise ops": functools.partial(
            throughput.run_engine_config, engine, requests, name="cont-graphs-torch-ops",
            slots=plan.slots, policy="fcfs", graphs=True, torch_ops=True),
        "engine continuous, no graphs": functools.partial(
            throughput.run_engine_config, engine, requests, name="cont-eager",
            slots=plan.slots, policy="fcfs", graphs=False),
        "engine static-padded" + ("" if has_policy else " (emulated)"): functools.partial(
            throughput.run_engine_padded_static, engine, requests, slots=plan.slots,
            has_policy=has_policy),
    }
    runs: dict[str, dict[str, Any]] = {}
    for name, run in engine_runs.items():
        result = rec.attempt(name, run)  # run_engine raises unless every token came out
        if result is not None:
            runs[name] = result
            rec.check(f"{name}: every requested token generated", True)
    path = ws.checkpoint(plan.big_arch)
    ws.drop_engine()
    _hf_runs(rec, ws, path, requests, runs)
    _throughput_tables(rec, runs)


def _hf_time_cap(ws: Workspace, runs_left: int) -> float:
    """The plan's cap, shortened so the runs still to come fit in what is left."""
    return max(10.0, min(ws.plan.hf_time_cap_s, (ws.seconds_left() - 20) / runs_left))


def _hf_runs(rec: Recorder, ws: Workspace, path: str, requests: list[BenchRequest],
             runs: dict[str, dict[str, Any]]) -> None:
    """HF static generate, then HF continuous batching; a failure of one is recorded."""
    plan = ws.plan
    hf = parity.load_hf(path, plan.engine_dtype, plan.device)
    try:
        warm = [BenchRequest(r.id, r.prompt_token_ids, 4) for r in requests[:2]]
        throughput.run_hf_static(hf, warm, batch_size=2, time_cap_s=60)  # warm-up
        runs["HF static generate"] = throughput.run_hf_static(
            hf, requests, batch_size=plan.slots, time_cap_s=_hf_time_cap(ws, 2))
    except Exception as exc:  # recorded; the continuous run still goes
        rec.check("HF static generate", False, f"{type(exc).__name__}: {exc}")
    if not throughput.hf_continuous_available():
        rec.skip("HF continuous batching", "this transformers has no continuous batching API")
    else:
        try:
            result = throughput.run_hf_continuous(
                hf, requests, max_batch=plan.slots, block_size=plan.block_size,
                num_blocks=ws.kv_blocks(), time_cap_s=_hf_time_cap(ws, 1))
            runs["HF continuous batching"] = result
            rec.check("HF continuous batching gave each request its max_tokens",
                      result["wrong_lengths"] == 0, f"{result['wrong_lengths']} wrong lengths")
        except Exception as exc:  # recorded with the runs that did finish
            rec.check("HF continuous batching", False, f"{type(exc).__name__}: {exc}")
    del hf
    release_memory(plan.device)


def _throughput_tables(rec: Recorder, runs: dict[str, dict[str, Any]]) -> None:
    for name, run in runs.items():
        if run.get("complete") is False:
            rec.note(f"- {name}: stopped at its time cap after {run['finished_requests']} "
                     "requests; its tokens/s is over those only.")
    rec.figures["runs"] = runs
    rec.table("Throughput", ["run", "tokens/s", "wall s", "steps", "step ms", "device busy",
                             "slot util", "KV waste", "complete"],
              [[name, r.get("useful_tokens_per_s"), r.get("wall_seconds"), r.get("num_steps"),
                r.get("mean_step_ms"), r.get("device_busy_fraction", "-"), r.get("slot_utilization"),
                r.get("kv_waste"), r.get("complete", True)] for name, r in runs.items()])
    tps = {name: r.get("useful_tokens_per_s") for name, r in runs.items()}
    best = tps.get("engine continuous, graphs") or 0.0
    ratios = {f"engine continuous, graphs / {name}": best / value for name, value in tps.items()
              if best and value and not name.startswith("engine continuous, g")}
    rec.figures["ratios"] = ratios
    hf_continuous = tps.get("HF continuous batching")
    if hf_continuous:
        rec.figures["goals"] = {"engine / HF continuous tokens/s": best / hf_continuous}
    rec.table("Ratios (tokens/s)", ["ratio", "value"], [[k, v] for k, v in ratios.items()])
