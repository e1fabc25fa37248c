"""Mixed load: interactive chat streams against a batch backlog, on one worker.

    .venv/bin/python -m benchmarks.mixed_load [--model smollm2-135m] [--batch-lines 2000]
        [--rate 1.0] [--duration 120] [--batch-window 60] [--threads 2]
        [--out docs/bench_mixed_load.json] [--plot docs/bench_mixed_load.png]

It starts a throwaway service (``benchmarks/service_stack.py``: its own PostgreSQL database
and Redis prefix, ``inflight api`` and one ``inflight worker`` on ``--model``) and runs,
in order:

1. **Streaming overhead.** ``--overhead-requests`` chat prompts, each alone: in-process
   ``LLM.chat`` first (before the stack starts, same engine defaults and threads; TTFT
   from the call to the engine's ``first_token_time``, and the decode step time from its
   later tokens), then the same prompts streamed through
   ``/v1/chat/completions`` (client-side TTFT: request sent to first content chunk).
   Target: the API's TTFT is at most the in-process TTFT plus one decode step plus 20 ms.
2. **Idle.** Interactive requests at a steady ``--rate`` per second for ``--duration``
   seconds (an open loop: request i is sent at i / rate whatever the others do), streamed,
   on a worker with nothing else to do: TTFT and time per output token (TPOT).
3. **Backlog.** A ``--batch-lines`` batch is uploaded (``POST /v1/files``) and created
   (``POST /v1/batches``) first; once it runs at full occupancy (``--batch-warmup`` s
   after its first step), the batch alone is measured for ``--batch-window`` s, then the
   same interactive traffic as in 2 runs against it, then the batch alone again for
   ``--batch-window`` s. The batch is cancelled afterwards (``--finish-batch`` lets it
   complete).
4. **Control.** The same batch again, alone, under another tenant, for as long after its
   warm-up as part 3 ran after its own (``--no-control`` skips it).

Requests are natural-language chat turns: the system prompt and user turns of
``benchmarks/chat_workload.jsonl`` (``workloads/chat_turns.txt``). Batch lines take the
workload's heavy-tailed output lengths; interactive requests ``--interactive-max-tokens``;
all greedy with ``ignore_eos``, so every run produces the same number of tokens.

The batch's tokens/s comes from the worker's step traces (the ``iterations`` table): the
decode rows of the steps in a window, less the interactive requests' decode rows
(``completion_tokens - 1`` each) in the window with traffic, over the window's length.
What the batch alone runs at drifts for minutes while it runs (its running sequences'
contexts grow, and with a small KV pool fewer of them fit), so the window with traffic is
compared with the same stretch of the control run, counted from each batch's end of
warm-up; without the control run, with the mean of the windows alone before and after it.
Targets, reported and never asserted: interactive TTFT p99 under the backlog at most 2x its
idle p99; the batch keeps at least 90% of its tokens/s under the interactive traffic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import text

from benchmarks.make_chat_workload import SYSTEM_PROMPT, output_lengths, read_turns
from benchmarks.mixed_load_batch import (
    Window,
    batch_backlog,
    batch_window,
    control_run,
    create_batch,
    shifted,
    steps_in,
    wait_batch_done,
    wait_batch_running,
    wait_traces,
)
from benchmarks.mixed_load_plot import plot_ttft
from benchmarks.process_cpu import cores_used, cpu_sample
from benchmarks.service_stack import ServiceStack, new_api_key, service_stack
from benchmarks.stream_timing import StreamTiming, run_one_by_one, run_steady
from cli.bench.machine import cpu_description
from worker.store.db import make_engine

OVERHEAD_MAX_TOKENS = 16
QUANTILES = (50, 90, 99)


def messages(turn: str) -> list[dict[str, str]]:
    """The workload's system prompt and one user turn."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": turn}]


def chat_body(model: str, turn: str, max_tokens: int) -> dict[str, Any]:
    """A greedy chat request of exactly ``max_tokens`` tokens."""
    return {"model": model, "messages": messages(turn), "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


def batch_file(model: str, lines: int, turns: list[str], max_tokens: int | None = None) -> bytes:
    """``lines`` OpenAI Batch lines, the turns and heavy-tailed lengths cycled (each at most
    ``max_tokens`` when given)."""
    lengths = [min(n, max_tokens or n) for n in output_lengths(len(turns))]
    out = []
    for i in range(lines):
        body = chat_body(model, turns[i % len(turns)], lengths[i % len(lengths)])
        out.append(json.dumps({"custom_id": f"line-{i}", "method": "POST",
                               "url": "/v1/chat/completions", "body": body}))
    return ("\n".join(out) + "\n").encode()


def interactive_bodies(model: str, count: int, turns: list[str], max_tokens: int,
                       offset: int) -> list[dict[str, Any]]:
    """``count`` interactive requests, from turn ``offset`` on (backwards, so they are
    not the batch's first lines)."""
    return [chat_body(model, turns[(offset - i) % len(turns)], max_tokens) for i in range(count)]


# -- 1. streaming overhead ----------------------------------------------------------------
def in_process_reference(model: str, turns: list[str], threads: int) -> list[dict[str, float]]:
    """Each turn alone through in-process ``LLM.chat``: TTFT (from the call, so the chat
    template is in it as it is in the worker's) and the decode step time."""
    from worker.engine import LLM, SamplingParams

    llm = LLM(model, num_threads=threads)
    params = SamplingParams(max_tokens=OVERHEAD_MAX_TOKENS, temperature=0, ignore_eos=True)
    llm.chat(messages("Warm up."), params, use_tqdm=False)
    rows = []
    for turn in turns:
        called = time.time()
        (out,) = llm.chat(messages(turn), params, use_tqdm=False)
        m = out.metrics
        assert m.first_token_time is not None and m.finished_time is not None
        rows.append({"ttft": m.first_token_time - called,
                     "step": (m.finished_time - m.first_token_time) / (OVERHEAD_MAX_TOKENS - 1)})
    del llm
    return rows


def overhead_report(reference: list[dict[str, float]],
                    api: list[StreamTiming]) -> dict[str, Any]:
    """Medians of the two TTFTs, the decode step, the difference and its target."""
    ttft_ref = float(np.median([r["ttft"] for r in reference]))
    step = float(np.median([r["step"] for r in reference]))
    ttft_api = float(np.median([t.ttft for t in api if t.ttft is not None]))
    overhead = ttft_api - ttft_ref
    return {"requests": len(api), "in_process_ttft_s": ttft_ref, "api_ttft_s": ttft_api,
            "decode_step_s": step, "overhead_s": overhead, "target_s": step + 0.020,
            "target_met": overhead <= step + 0.020,
            "api_ttft_each_s": [t.ttft for t in api],
            "in_process_ttft_each_s": [r["ttft"] for r in reference]}


# -- 3. the batch: benchmarks/mixed_load_batch.py ----------------------------------------

PARTS = ("api_submit", "intake", "engine", "delivery")


def ttft_parts(db_url: str, timings: list[StreamTiming]) -> dict[str, Any]:
    """Where each request's TTFT went, from its job row: ``api_submit`` (sent to the row's
    ``queued_at``: validation, the SQL insert), ``intake`` (to ``started_at``, which the
    result write sets to the engine's first scheduling of the job: the XADD, the worker's
    read and SQL start, and the wait for a step's end or a layer boundary to admit it),
    ``engine`` (to ``first_token_at``: the step that computed its prompt) and ``delivery`` (to
    the first content chunk: the delta publisher, the API's XREAD, the SSE write); p50 and
    p99 of each part, in seconds. Also in steps, which a loaded machine does not blur:
    ``intake_steps``, the worker's steps begun while the job was queued, and
    ``engine_steps``, those begun from its start to its first token (1 when it was admitted
    into the first step after it reached the worker); median and most."""
    ids = [t.job_id for t in timings if t.job_id and t.first_token is not None]
    engine = make_engine(url=db_url)
    try:
        with engine.connect() as conn:
            rows = {r[0]: r[1:] for r in conn.execute(text(
                "SELECT j.id, j.queued_at, j.started_at, j.first_token_at, "
                "(SELECT count(*) FROM iterations i WHERE i.worker_id = j.worker_id "
                " AND i.time >= j.queued_at AND i.time < j.started_at), "
                "(SELECT count(*) FROM iterations i WHERE i.worker_id = j.worker_id "
                " AND i.time >= j.started_at AND i.time < j.first_token_at) "
                "FROM jobs j WHERE j.id = ANY(:ids)"), {"ids": ids})}
    finally:
        engine.dispose()
    parts: dict[str, list[float]] = {name: [] for name in PARTS}
    steps: dict[str, list[int]] = {"intake_steps": [], "engine_steps": []}
    for t in timings:
        row = rows.get(t.job_id or "")
        if row is None or None in row[:3] or t.first_token is None:
            continue
        marks = [t.sent, *(ts.timestamp() for ts in row[:3]), t.first_token]
        for name, a, b in zip(PARTS, marks, marks[1:], strict=False):
            parts[name].append(b - a)
        steps["intake_steps"].append(int(row[3]))
        steps["engine_steps"].append(int(row[4]))
    out: dict[str, Any] = {f"{name}_p{q}_s": float(np.percentile(v, q)) if v else None
                           for name, v in parts.items() for q in (50, 99)}
    for name, counts in steps.items():
        out[f"{name}_p50"] = float(np.median(counts)) if counts else None
        out[f"{name}_max"] = max(counts) if counts else None
    return out


# -- the interactive figures -------------------------------------------------------------
def latency_summary(timings: list[StreamTiming]) -> dict[str, Any]:
    """TTFT and TPOT percentiles (seconds) of the requests that succeeded."""
    ok = [t for t in timings if t.error is None and t.ttft is not None]
    out: dict[str, Any] = {"requests": len(timings), "failed": len(timings) - len(ok)}
    for name in ("ttft", "tpot"):
        values = [getattr(t, name) for t in ok if getattr(t, name) is not None]
        for q in QUANTILES:
            out[f"{name}_p{q}_s"] = float(np.percentile(values, q)) if values else None
    return out


def report(fig: dict[str, Any]) -> str:
    """The Markdown tables of one run."""
    ms = 1000.0
    out = ["| interactive requests | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms |",
           "|---|---|---|"]
    for name in ("idle", "backlog"):
        s = fig[name]
        ttft = " / ".join(_ms(s[f"ttft_p{q}_s"]) for q in QUANTILES)
        tpot = " / ".join(_ms(s[f"tpot_p{q}_s"]) for q in QUANTILES)
        failed = f", {s['failed']} failed" if s["failed"] else ""
        out.append(f"| {name} ({s['requests']}{failed}) | {ttft} | {tpot} |")
    out += ["", "| TTFT parts, p50 / p99 ms | " + " | ".join(PARTS)
            + " | steps queued, median / most | steps to first token, median / most |",
            "|---|" + "---:|" * (len(PARTS) + 2)]
    for name in ("idle", "backlog"):
        parts = fig[name]["parts"]
        out.append(f"| {name} | " + " | ".join(
            f"{_ms(parts[f'{p}_p50_s'])} / {_ms(parts[f'{p}_p99_s'])}" for p in PARTS)
            + f" | {parts['intake_steps_p50']} / {parts['intake_steps_max']}"
            + f" | {parts['engine_steps_p50']} / {parts['engine_steps_max']} |")
    windows = [("alone, before", fig["batch_alone"]),
               ("with interactive traffic", fig["batch_with_interactive"])]
    if fig.get("batch_alone_after") is not None:
        windows.append(("alone, after", fig["batch_alone_after"]))
    for name, b in (fig.get("control") or {}).items():
        windows.append((f"control, {name.replace('_', ' ')}", b))
    out += ["", "| batch | tok/s | steps | mean running | mean step ms |", "|---|---:|---:|---:|---:|"]
    for name, b in windows:
        out.append(f"| {name} ({b['seconds']:.0f} s) | {b['batch_tokens_per_s']:.1f} | "
                   f"{b['steps']} | {b['mean_running']:.1f} | {b['mean_step_ms']:.1f} |")
    cores = fig.get("cores_used") or {}
    if cores:
        labels = list(cores["with_interactive"])
        out += ["", "| cores kept busy over the traffic's window | " + " | ".join(labels) + " |",
                "|---|" + "---:|" * len(labels)]
        for name, used in cores.items():
            out.append(f"| {name.replace('_', ' ')} | "
                       + " | ".join(f"{used.get(k, 0.0):.2f}" for k in labels) + " |")
    o = fig["overhead"]
    out += ["", "| single request, median of " + str(o["requests"]) + " | ms |", "|---|---:|",
            f"| in-process `LLM.chat` TTFT | {o['in_process_ttft_s'] * ms:.1f} |",
            f"| API stream TTFT | {o['api_ttft_s'] * ms:.1f} |",
            f"| decode step (in-process) | {o['decode_step_s'] * ms:.1f} |",
            f"| overhead (API - in-process) | {o['overhead_s'] * ms:.1f} |"]
    t = fig["targets"]
    out += ["", f"Targets: TTFT p99 backlog / idle = {t['ttft_p99_ratio']:.2f} (target <= 2: "
            f"{'met' if t['ttft_met'] else 'missed'}); batch tok/s kept = "
            f"{t['batch_kept']:.1%} of the {t.get('batch_kept_of', 'windows')} (target >= 90%: "
            f"{'met' if t['batch_met'] else 'missed'}; of the windows alone "
            f"{t.get('batch_kept_of_windows', t['batch_kept']):.1%}"
            + (f"; decode rows of both classes {t['decode_rows_kept']:.1%} of the control's"
               if t.get("decode_rows_kept") is not None else "") + "); "
            f"overhead {o['overhead_s'] * ms:.1f} ms against one step + 20 ms = "
            f"{o['target_s'] * ms:.1f} ms ({'met' if o['target_met'] else 'missed'}).",
            f"Batch jobs still queued when the traffic ended: {fig['backlog_left']}"
            + (" (the backlog ran out: the backlog figures are not comparable)"
               if fig["backlog_left"] == 0 else "") + ".",
            f"CPU: {fig['cpu']['model']} ({', '.join(fig['cpu']['vector_extensions'])}); "
            f"{fig['args']['threads']} engine threads."]
    return "\n".join(out)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def targets(idle: dict[str, Any], backlog: dict[str, Any], alone: dict[str, Any],
            mixed: dict[str, Any], after: dict[str, Any] | None = None,
            control: dict[str, Any] | None = None) -> dict[str, Any]:
    """The two ratios of the issue and whether each meets its target. The batch's share is
    of the control run's same window when there is one (``batch_kept_of``: "control"),
    else of the mean of its windows alone (before, and ``after`` when measured);
    ``batch_kept_of_windows`` is the latter either way. ``decode_rows_kept`` (with a control
    run): the batch's and the interactive requests' decode rows together over the control's,
    what the worker kept of its decode rate whoever the rows were for."""
    ratio = (backlog["ttft_p99_s"] or float("inf")) / (idle["ttft_p99_s"] or float("nan"))
    windows = float(np.mean([w["batch_tokens_per_s"] for w in (alone, after) if w is not None]))
    of_windows = mixed["batch_tokens_per_s"] / windows if windows else float("nan")
    rows_kept = None
    if control is not None:
        alone_rate = control["batch_tokens_per_s"]
        kept = mixed["batch_tokens_per_s"] / alone_rate if alone_rate else float("nan")
        rows = mixed["batch_tokens_per_s"] + mixed["interactive_decode_tokens"] / mixed["seconds"]
        rows_kept = rows / alone_rate if alone_rate else float("nan")
    else:
        kept = of_windows
    return {"ttft_p99_ratio": ratio, "ttft_met": ratio <= 2.0, "batch_kept": kept,
            "batch_met": kept >= 0.9, "batch_kept_of": "control" if control else "windows",
            "batch_kept_of_windows": of_windows, "decode_rows_kept": rows_kept}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All three parts; the figures."""
    turns = read_turns()
    count = args.requests or max(1, round(args.rate * args.duration))
    overhead_turns = turns[: args.overhead_requests]
    print(f"in-process reference: {len(overhead_turns)} requests", file=sys.stderr)
    reference = in_process_reference(args.model, overhead_turns, args.threads)
    worker_args = ("--num-threads", str(args.threads), *args.worker_arg)
    with service_stack(model=args.model, workers=1, beat_interval=1.0,
                       worker_args=worker_args) as stack, stack.client() as client:
        warm = [chat_body(args.model, t, OVERHEAD_MAX_TOKENS) for t in turns[-3:]]
        run_one_by_one(stack.base_url, stack.api_key, warm)  # model load, first steps
        api = run_one_by_one(stack.base_url, stack.api_key,
                             [chat_body(args.model, t, OVERHEAD_MAX_TOKENS) for t in overhead_turns])
        overhead = overhead_report(reference, api)
        print(f"overhead: {overhead['overhead_s'] * 1000:.1f} ms", file=sys.stderr)

        bodies = interactive_bodies(args.model, count, turns, args.interactive_max_tokens,
                                    offset=len(turns) - 4)
        print(f"idle: {count} requests at {args.rate}/s", file=sys.stderr)
        idle_start = time.time()
        idle = run_steady(stack.base_url, stack.api_key, bodies, args.rate)

        print(f"backlog: a {args.batch_lines}-line batch", file=sys.stderr)
        data = batch_file(args.model, args.batch_lines, turns, args.batch_max_tokens)
        batch_id = create_batch(client, data)
        alone_start = wait_batch_running(stack.database_url, batch_id, args.batch_lines,
                                         args.batch_warmup)
        time.sleep(args.batch_window)
        alone = Window(alone_start, time.time())
        print(f"backlog: {count} requests at {args.rate}/s", file=sys.stderr)
        sample = _cpu_sampler(stack)
        first = (time.time(), sample())
        backlog = run_steady(stack.base_url, stack.api_key, bodies, args.rate)
        last = (time.time(), sample())
        mixed = Window(min(t.sent for t in backlog),
                       max(t.last_token or t.sent for t in backlog))
        left = batch_backlog(stack.database_url, batch_id)
        after_start = time.time()
        time.sleep(args.batch_window)
        after = Window(after_start, time.time())
        if not batch_backlog(stack.database_url, batch_id):
            print("the backlog ran out before the window after the traffic ended: "
                  "raise --batch-lines", file=sys.stderr)
        wait_traces(stack.database_url, after.end)
        if not args.finish_batch:
            client.post(f"/v1/batches/{batch_id}/cancel")  # a 400 when it ended already
        wait_batch_done(client, batch_id)
        control_start, cpu = None, {"with_interactive": cores_used(first[1], last[1],
                                                                   last[0] - first[0])}
        if args.control:
            print("control: the same batch alone, another tenant", file=sys.stderr)
            with stack.client(api_key=new_api_key(stack.database_url, "bench-control")) as other:
                control_start, (c_first, c_last) = control_run(
                    other, stack.database_url, data, args.batch_lines, args.batch_warmup,
                    after.end - alone_start, sample,
                    (first[0] - alone_start, last[0] - alone_start))
            cpu["control"] = cores_used(c_first, c_last, last[0] - first[0])
        fig = _figures(args, stack, overhead, idle, backlog, (alone, mixed, after), left,
                       idle_start, (alone_start, control_start))
        fig["cores_used"] = cpu
    return fig


def _cpu_sampler(stack: ServiceStack) -> Callable[[], dict[str, float]]:
    """CPU seconds so far of the API (with its server processes), the worker, this load
    generator, Redis and PostgreSQL: where the machine's two cores went."""
    roots = {"api": stack.api.pid, "worker": stack.workers[0].pid}
    return lambda: cpu_sample(roots, ("redis-server", "postgres"))


def _figures(args: argparse.Namespace, stack: ServiceStack, overhead: dict[str, Any],
             idle: list[StreamTiming], backlog: list[StreamTiming],
             windows: tuple[Window, Window, Window], left: int, idle_start: float,
             origins: tuple[float, float | None]) -> dict[str, Any]:
    """The figures of a run; ``windows``: the batch alone, with the traffic, alone again;
    ``origins``: when the batch's warm-up ended and the control run's (None: no control)."""
    alone, mixed, after = windows
    batch_alone = batch_window(stack.database_url, alone, [])
    batch_mixed = batch_window(stack.database_url, mixed, backlog)
    batch_after = batch_window(stack.database_url, after, [])
    origin, control_origin = origins
    control = None if control_origin is None else {
        name: batch_window(stack.database_url, shifted(w, origin, control_origin), [])
        for name, w in (("before", alone), ("with_interactive", mixed), ("after", after))}
    idle_s, backlog_s = latency_summary(idle), latency_summary(backlog)
    idle_s["parts"] = ttft_parts(stack.database_url, idle)
    backlog_s["parts"] = ttft_parts(stack.database_url, backlog)
    traffic = steps_in(stack.database_url, Window(alone.start, after.end))
    control_steps = [] if control_origin is None else [
        (t - control_origin + origin, rows, running, ms) for t, rows, running, ms in
        steps_in(stack.database_url, shifted(Window(alone.start, after.end), origin, control_origin))]
    return {"args": vars(args), "cpu": cpu_description(), "overhead": overhead,
            "idle": idle_s, "backlog": backlog_s, "batch_alone": batch_alone,
            "batch_with_interactive": batch_mixed, "batch_alone_after": batch_after,
            "control": control, "backlog_left": left,
            "targets": targets(idle_s, backlog_s, batch_alone, batch_mixed, batch_after,
                               control and control["with_interactive"]),
            "windows": {"idle_start": idle_start, "alone": [alone.start, alone.end],
                        "mixed": [mixed.start, mixed.end], "after": [after.start, after.end]},
            "requests": {"idle": [t.as_dict() for t in idle],
                         "backlog": [t.as_dict() for t in backlog]},
            "steps": [[s[0], s[1], s[2], s[3]] for s in traffic],
            "control_steps": [list(s) for s in control_steps]}  # on the mixed run's timeline


def main(argv: list[str] | None = None) -> int:
    """Run, print the tables, write the JSON and the plot."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch-lines", type=int, default=2000)
    p.add_argument("--rate", type=float, default=1.0, help="interactive requests per second")
    p.add_argument("--duration", type=float, default=120.0,
                   help="seconds of interactive traffic in each of the idle and backlog parts")
    p.add_argument("--requests", type=int, default=None,
                   help="interactive requests per part (default: rate x duration)")
    p.add_argument("--interactive-max-tokens", type=int, default=64)
    p.add_argument("--batch-max-tokens", type=int, default=None,
                   help="cap the batch lines' heavy-tailed lengths (default: uncapped, 8-512)")
    p.add_argument("--batch-warmup", type=float, default=15.0,
                   help="seconds after the batch's first start before measuring it")
    p.add_argument("--batch-window", type=float, default=60.0,
                   help="seconds the batch runs alone, measured, before and after the traffic")
    p.add_argument("--overhead-requests", type=int, default=10)
    p.add_argument("--threads", type=int, default=2, help="engine threads (worker and in-process)")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="one more `inflight worker` argument (repeatable)")
    p.add_argument("--finish-batch", action="store_true",
                   help="let the batch complete instead of cancelling it (with --no-control)")
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="skip the control run: the batch's share is of its windows alone")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--plot", default=None, help="draw TTFT over time to this PNG")
    args = p.parse_args(argv)
    if args.finish_batch and args.control:
        p.error("--finish-batch runs the batch to its end, which the control run would wait "
                "for: add --no-control")
    fig = run(args)
    print(report(fig))
    if args.out:
        Path(args.out).write_text(json.dumps(fig, indent=1) + "\n")
    if args.plot:
        plot_ttft(args.plot, fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
