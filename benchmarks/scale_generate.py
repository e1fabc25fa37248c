"""``inflight generate`` as the file grows: wall time, resident memory over the run, and
throughput next to ``LLM.generate`` on the same requests.

    .venv/bin/python benchmarks/scale_generate.py [--sizes 1000,5000,20000]
        [--model tiny-llama] [--out docs/bench_scale_generate.json]

Each size gets a file of that many OpenAI Batch chat lines (the chat workload's shared
system prompt and user turns, cycled; output lengths cycled through ``--lengths``, greedy,
``ignore_eos``). ``inflight generate`` runs on it as a subprocess whose resident memory is
sampled every 0.2 s (the series is kept in the JSON); then a subprocess runs ``LLM.generate`` on the same requests (all
added at once, as that API does). Both report tokens/s after the model has loaded. Not a
test: it prints a Markdown table and the fitted slope of wall time against line count.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from itertools import cycle
from pathlib import Path
from typing import Any

from benchmarks.make_chat_workload import SYSTEM_PROMPT, read_turns
from cli.bench.linear_fit import fit_line
from cli.bench.machine import RssSampler, cpu_description

ROOT = Path(__file__).resolve().parents[1]

SUMMARY = re.compile(r"(\d+) tokens generated \(([\d.]+) tok/s\)")


def write_input(path: Path, count: int, lengths: list[int]) -> int:
    """Write ``count`` chat lines; returns the number of tokens they ask for."""
    turns, sizes, asked = cycle(read_turns()), cycle(lengths), 0
    with path.open("w", encoding="utf-8") as f:
        for i in range(count):
            n_out = next(sizes)
            asked += n_out
            body = {"messages": [{"role": "system", "content": SYSTEM_PROMPT},
                                 {"role": "user", "content": next(turns)}],
                    "max_tokens": n_out, "temperature": 0, "ignore_eos": True}
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")
    return asked


def run_cli(path: Path, out: Path, model: str, threads: int, kv_bytes: int | None
            ) -> dict[str, Any]:
    """``inflight generate`` on ``path``; its wall time, tok/s after load and memory."""
    cmd = [sys.executable, "-m", "cli.main", "generate", str(path), "-o", str(out),
           "--no-resume", "--model", model, "--num-threads", str(threads)]
    if kv_bytes is not None:
        cmd += ["--kv-cache-memory", str(kv_bytes)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    with RssSampler(interval=0.2, pid=proc.pid) as rss:
        _, err = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"inflight generate failed ({proc.returncode}): {err[-2000:]}")
    found = SUMMARY.findall(err)
    if not found:
        raise RuntimeError(f"no summary line in: {err[-2000:]}")
    tokens, tok_s = found[-1]
    with out.open(encoding="utf-8") as f:
        ok = sum(1 for line in f if json.loads(line)["response"]["status_code"] == 200)
    return {"wall_s": wall, "tokens": int(tokens), "tok_s": float(tok_s), "ok_lines": ok,
            "peak_rss": rss.peak, "rss_series": rss.series}


def run_llm(path: Path, model: str, threads: int, kv_bytes: int | None) -> dict[str, Any]:
    """``LLM.chat`` (the chat form of ``LLM.generate``) on the same requests in a
    subprocess (see :func:`llm_child`)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--llm-child", str(path),
           "--model", model, "--threads", str(threads)]
    if kv_bytes is not None:
        cmd += ["--kv-cache-mib", str(kv_bytes >> 20)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    with RssSampler(interval=0.2, pid=proc.pid) as rss:
        out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"LLM.generate failed ({proc.returncode}): {err[-2000:]}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss": rss.peak}


def llm_child(path: str, model: str, threads: int, kv_bytes: int | None) -> None:
    """Load the model, then time ``LLM.chat`` on every line of ``path``; prints JSON."""
    import torch

    from worker.engine import LLM
    from worker.protocol.openai_batch import parse_request_line

    torch.set_num_threads(threads)
    llm = LLM(model, kv_cache_memory=kv_bytes)
    requests = [parse_request_line(line, line_number=i)
                for i, line in enumerate(Path(path).read_text().splitlines(), start=1)]
    started = time.perf_counter()  # tokenizing is timed too, as in ``inflight generate``
    outputs = llm.chat([r.messages or [] for r in requests], [r.params for r in requests],
                       use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outputs)
    print(json.dumps({"tokens": tokens, "tok_s": tokens / seconds, "seconds": seconds}))


def report(rows: list[dict[str, Any]], cpu: dict[str, Any]) -> str:
    """The Markdown table, the fit and the machine line."""
    fit = fit_line([r["lines"] for r in rows], [r["cli"]["wall_s"] for r in rows])
    mb = 1 / 2**20
    out = ["| lines | `inflight generate` wall s | tok/s | `LLM.generate` tok/s | ratio | "
           "peak RSS MB (generate / LLM) |", "|---|---|---|---|---|---|"]
    for r in rows:
        cli, llm = r["cli"], r["llm"]
        out.append(f"| {r['lines']:,} | {cli['wall_s']:.1f} | {cli['tok_s']:.1f} | "
                   f"{llm['tok_s']:.1f} | {cli['tok_s'] / llm['tok_s']:.3f} | "
                   f"{cli['peak_rss'] * mb:.0f} / {llm['peak_rss'] * mb:.0f} |")
    out.append("")
    out.append(f"Wall time fit: {fit.slope * 1000:.2f} s per 1,000 lines + {fit.intercept:.1f} s; "
               f"worst point {fit.worst_ratio:.3f}x the fit; marginal cost per line "
               f"{fit.marginal_growth:.3f}x from the first interval to the last.")
    out.append(f"CPU: {cpu['model']} ({', '.join(cpu['vector_extensions'])})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run every size; print the table and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,5000,20000")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--lengths", default="4,8,16,8", help="max_tokens, cycled over the lines")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-mib", type=int, default=None, metavar="MIB",
                   help="the KV pool of both, in MiB (default: the engine's); a tiny model's 1 GiB "
                        "pool has 131k blocks, whose prefix-cache index fills over a long "
                        "run, so its memory is not flat until the pool has cycled once")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--llm-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.kv_cache_memory = args.kv_cache_mib << 20 if args.kv_cache_mib else None
    if args.llm_child:
        llm_child(args.llm_child, args.model, args.threads, args.kv_cache_memory)
        return 0
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="inflight-scale-") as tmp:
        for size in (int(x) for x in args.sizes.split(",")):
            path, out = Path(tmp) / f"in-{size}.jsonl", Path(tmp) / f"out-{size}.jsonl"
            asked = write_input(path, size, lengths)
            cli = run_cli(path, out, args.model, args.threads, args.kv_cache_memory)
            if cli["ok_lines"] != size or cli["tokens"] != asked:
                raise RuntimeError(f"{size} lines: {cli['ok_lines']} ok, {cli['tokens']} tokens "
                                   f"of {asked}")
            llm = run_llm(path, args.model, args.threads, args.kv_cache_memory)
            rows.append({"lines": size, "tokens": asked, "cli": cli, "llm": llm})
            print(f"{size} lines: generate {cli['wall_s']:.1f}s {cli['tok_s']:.1f} tok/s, "
                  f"LLM.generate {llm['tok_s']:.1f} tok/s", file=sys.stderr)
    cpu = cpu_description()
    print(report(rows, cpu))
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "lengths": lengths,
                                              "cpu": cpu, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
