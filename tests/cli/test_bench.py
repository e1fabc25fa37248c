"""Smoke test of ``inflight bench`` on the tiny model (no timing assertions), and the
workload and metric helpers it is built on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli.bench.metrics import StepRecord, fcfs_steps, static_steps, summarize_steps
from cli.bench.workload import DEFAULT_WORKLOAD, read_workload, static_utilization
from cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _small_workload(path: Path) -> list[int]:
    """Twenty requests with short outputs, so every configuration runs in about a second;
    more than 16, so a second cohort of static-16 waits for the first's longest member."""
    outs = [3, 20, 5, 8, 4, 12, 6, 3, 9, 7, 4, 3, 5, 6, 3, 4, 18, 3, 4, 5]
    with open(path, "w", encoding="utf-8") as f:
        for i, n in enumerate(outs):
            row = {"id": f"r{i}", "prompt_token_ids": list(range(5, 9 + 3 * i)), "max_tokens": n}
            f.write(json.dumps(row) + "\n")
    return outs


def test_bench_smoke_tiny_llama(tmp_path: Path, capsys) -> None:
    import torch

    outs = _small_workload(tmp_path / "w.jsonl")
    out_dir = tmp_path / "out"
    threads = torch.get_num_threads()
    try:  # one thread: a tiny model gains nothing from two, and suffers on a busy machine
        status = main(["bench", "--model", "tiny-llama", "--limit", "20", "-q", "--threads", "1",
                       "--workload", str(tmp_path / "w.jsonl"), "--out-dir", str(out_dir)])
    finally:
        torch.set_num_threads(threads)
    assert status == 0
    assert "continuous-16 / static-16" in capsys.readouterr().out
    data = json.loads((out_dir / "bench.json").read_text())
    assert (out_dir / "bench_occupancy.png").stat().st_size > 0
    for key in ("command", "date", "machine", "workload", "definitions", "runs", "ratios",
                "targets", "complete"):
        assert key in data
    assert data["complete"] is True
    assert set(data["runs"]) == {"inflight", "inflight-bf16", "static-16", "continuous-16",
                                 "hf-16"}
    assert data["runs"]["inflight"]["peak_rss_bytes"] > 0
    assert data["runs"]["inflight-bf16"]["dtype"] == "bfloat16"
    assert data["agreement_reference"] == "inflight"
    assert data["runs"]["continuous-16"]["agreement"] == 1.0  # fp32 greedy: the same tokens
    assert 0 <= data["runs"]["inflight-bf16"]["agreement"] <= 1
    assert data["machine"]["cpu"]["vector_extensions"]  # the CPU is named with every figure
    assert data["workload"]["num_requests"] == 20
    assert 0 < data["workload"]["u_static"] <= 1
    for name, run in data["runs"].items():
        assert run["useful_tokens"] == sum(outs), name
        assert run["useful_tokens_per_s"] > 0
        assert 0 <= run["slot_utilization"] <= 1
        if run["kind"] == "engine":
            assert run["num_preemptions"] == 0
            assert 0 <= run["kv_waste"] < 1
            assert 0 <= run["scheduler_overhead"] < 1
            assert max(run["occupancy"]) <= run["max_num_seqs"]
            assert abs(sum(run["step_time_split"].values()) - 1) < 1e-6
    # static and continuous do the same useful work; static's second cohort waits for the
    # first one's longest member, continuous refills a freed slot on the next step
    static, continuous = data["runs"]["static-16"], data["runs"]["continuous-16"]
    assert static["num_steps"] == max(outs[:16]) + max(outs[16:])
    assert continuous["num_steps"] < static["num_steps"]
    assert static["slot_utilization"] < continuous["slot_utilization"]
    assert all(v > 0 for v in data["ratios"].values())
    assert "inflight / hf-16" in data["ratios"]


def test_bench_selected_configs_and_errors(tmp_path: Path) -> None:
    _small_workload(tmp_path / "w.jsonl")
    argv = ["bench", "--model", "tiny-llama", "--limit", "3", "-q", "--workload",
            str(tmp_path / "w.jsonl"), "--out-dir", str(tmp_path / "o"), "--skip-hf"]
    assert main([*argv, "--configs", "continuous-16,hf-16"]) == 0
    data = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert set(data["runs"]) == {"continuous-16"}
    assert not (tmp_path / "o" / "bench_occupancy.png").exists()
    assert main([*argv, "--configs", "hf-16"]) == 2  # nothing left once hf is skipped
    assert main(["bench", "--workload", str(tmp_path / "missing.jsonl")]) == 2


def test_several_workloads_in_one_invocation(tmp_path: Path, capsys) -> None:
    _small_workload(tmp_path / "w.jsonl")
    status = main(["bench", "--model", "tiny-llama", "--limit", "3", "-q", "--configs",
                   "continuous-16", "--workload", str(tmp_path / "w.jsonl"), "--workload",
                   "long-tail", "--out-dir", str(tmp_path / "o")])
    assert status == 0
    first = json.loads((tmp_path / "o" / "w" / "bench.json").read_text())
    second = json.loads((tmp_path / "o" / "long_tail_workload" / "bench.json").read_text())
    assert first["workload"]["path"].endswith("w.jsonl")
    assert second["workload"]["path"].endswith("long_tail_workload.jsonl")
    out = capsys.readouterr().out
    assert "== w.jsonl" in out and "== long_tail_workload.jsonl" in out


def test_the_peer_search_keeps_each_faster_setting() -> None:
    from cli.bench.peer_run import PeerSettings, search_vllm

    def speed(s: PeerSettings) -> float:  # faster without iomp and at 128 sequences
        return 100 + 10 * (s.preload == "tcmalloc") + 5 * (s.max_num_seqs == 128)

    def run_one(s: PeerSettings):
        if s.max_num_batched_tokens == 8192:
            raise RuntimeError("refused")
        return {"useful_tokens_per_s": speed(s)}, {"r": [s.max_num_seqs or 0]}

    best, tokens = search_vllm(run_one, say=lambda _: None)
    assert best["search"]["best"] == {"preload": "tcmalloc", "max_num_seqs": 128,
                                      "max_num_batched_tokens": None, "prefix_caching": None,
                                      "multiprocessing": None}
    assert best["useful_tokens_per_s"] == 115 and tokens == {"r": [128]}
    tries = best["search"]["tries"]
    assert len(tries) == 1 + 2 + 2 + 2 + 1 + 1 and sum("error" in t for t in tries) == 1
    assert tries[-1]["settings"]["multiprocessing"] is False  # the single-process mode is tried


def test_the_single_process_peer_runs_its_engine_core_in_process(monkeypatch) -> None:
    from cli.bench.peer_run import PeerSettings, peer_environment

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("LD_PRELOAD", "/x.so")
    assert peer_environment(PeerSettings(multiprocessing=False))["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    default = peer_environment(PeerSettings())
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in default and "LD_PRELOAD" not in default


def test_peer_preloads(tmp_path: Path) -> None:
    from cli.bench.peer_run import preload_libraries

    python = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").touch()
    assert preload_libraries(python, "none") == ""
    assert preload_libraries(python, "tcmalloc+iomp").endswith("libiomp5.so")
    assert "libiomp5" not in preload_libraries(python, "tcmalloc")
    with pytest.raises(ValueError, match="preload"):
        preload_libraries(python, "jemalloc")


def test_without_the_peer_environment_vllm_is_a_clear_error(tmp_path: Path, capsys) -> None:
    _small_workload(tmp_path / "w.jsonl")
    status = main(["bench", "--model", "tiny-llama", "--limit", "2", "-q", "--configs",
                   "continuous-16", "--peer", "vllm", "--peer-python",
                   str(tmp_path / "none" / "python"), "--workload", str(tmp_path / "w.jsonl"),
                   "--out-dir", str(tmp_path / "o")])
    assert status == 1
    assert "setup_vllm.sh" in capsys.readouterr().err


def test_the_peer_memory_fraction_reaches_the_peer(tmp_path: Path, capsys) -> None:
    from cli.bench.peer_run import run_vllm

    python = tmp_path / "venv" / "bin" / "python"  # a stand-in that records its arguments
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\n")
    python.chmod(0o755)
    for fraction, expected in ((None, None), (0.85, "--memory-fraction 0.85")):
        with pytest.raises(RuntimeError, match="vLLM exited"):
            run_vllm(python=python, model_dir=tmp_path, workload=tmp_path / "w.jsonl",
                     out_dir=tmp_path, limit=None, threads=2, memory_fraction=fraction)
        args = (tmp_path / "args").read_text()
        assert (expected in args) if expected else "--memory-fraction" not in args
    with pytest.raises(SystemExit):
        main(["bench", "--peer-memory-fraction", "1.5"])
    assert "must be in (0, 1]" in capsys.readouterr().err


def test_report_helpers() -> None:
    from cli.bench.machine import cpu_description
    from cli.bench.report import agreement, ratios_of

    ref = {"a": [1, 2, 3], "b": [4, 5, 6]}
    assert agreement(ref, {"a": [1, 2, 3], "b": [4, 0, 6]}, prefix=2) == 0.5
    assert agreement(ref, {"a": [1, 2, 9], "b": [4, 5, 0]}, prefix=2) == 1.0
    assert agreement(ref, {}) is None
    runs = {n: {"useful_tokens_per_s": tps, "useful_tokens": 100, "cpu_seconds": 1.0}
            for n, tps in (("inflight", 300.0), ("vllm", 200.0), ("hf-16", 50.0))}
    ratios = ratios_of(runs, 0.5)
    assert ratios["inflight / vllm"] == 1.5
    assert ratios["vllm / hf-16"] == 4.0
    info = cpu_description("model name\t: Some CPU\nflags\t\t: fpu avx2 fma avx512f\n")
    assert info == {"model": "Some CPU", "vector_extensions": ["avx2", "fma", "avx512f"]}


def _generators_and_tokenizer() -> tuple[Any, Any, Any]:
    """The two chat-template workload generators (imported as files, as they run) and
    SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    from worker.engine.models.loader import resolve_checkpoint_dir

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import make_chat_workload
        import make_long_tail_workload
    finally:
        sys.path.pop(0)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_checkpoint_dir("smollm2-135m")))
    return make_chat_workload, make_long_tail_workload, tokenizer


def test_committed_chat_workload_matches_its_generator() -> None:
    make_chat_workload, _, tokenizer = _generators_and_tokenizer()
    requests = read_workload(REPO / "benchmarks" / "chat_workload.jsonl")
    assert requests == make_chat_workload.make_chat_workload(tokenizer)
    turns = make_chat_workload.read_turns()
    assert len(requests) == len(turns) == len(set(turns)) >= 250  # a few hundred, all different
    assert all(8 <= r.max_tokens <= 512 for r in requests)
    system = tokenizer.decode(requests[0].prompt_token_ids)
    assert make_chat_workload.SYSTEM_PROMPT in system and turns[0] in system


def test_committed_long_tail_workload_matches_its_generator() -> None:
    make_chat_workload, make_long_tail_workload, tokenizer = _generators_and_tokenizer()
    requests = read_workload(REPO / "benchmarks" / "long_tail_workload.jsonl")
    assert requests == make_long_tail_workload.make_long_tail_workload(tokenizer)
    turns = make_chat_workload.read_turns(make_long_tail_workload.TURNS_PATH)
    assert len(requests) == len(set(turns)) == 64
    assert not set(turns) & set(make_chat_workload.read_turns())  # prompts of its own
    outs = sorted(r.max_tokens for r in requests)
    assert outs[0] == 8 and outs[-1] == 512 and len(set(outs)) >= 60  # widely spread


def test_committed_workload_matches_its_generator() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import make_workload
    finally:
        sys.path.pop(0)
    requests = read_workload(DEFAULT_WORKLOAD)
    assert requests == make_workload.make_workload()
    assert len(requests) == 64
    assert all(20 <= len(r.prompt_token_ids) <= 200 for r in requests)
    assert all(8 <= r.max_tokens <= 512 for r in requests)
    u = static_utilization([r.max_tokens for r in requests], 16)
    assert abs(u - 0.31) < 0.01


def test_step_counting_helpers() -> None:
    outs = [10, 1, 1, 1, 4, 4, 4, 4]
    assert static_steps(outs, 4) == 10 + 4
    assert fcfs_steps(outs, 4) == 10  # the short ones cycle through three free slots
    assert static_utilization(outs, 4) == sum(outs) / (4 * 10 + 4 * 4)
    steps = [StepRecord(4, 2, 30, 0, 4, 32, 0.01, 0.08, 0.01, 0.1),
             StepRecord(2, 0, 0, 2, 4, 48, 0.01, 0.08, 0.01, 0.1)]
    s = summarize_steps(steps, max_num_seqs=4, block_size=16)
    assert s["slot_utilization"] == 0.75
    assert s["slot_utilization_steady"] == 1.0
    assert s["kv_waste"] == (64 - 32 + 64 - 48) / 128
    assert abs(s["scheduler_overhead"] - 0.1) < 1e-9


def test_bench_cmd_does_not_import_torch() -> None:
    code = ("import sys, cli.bench_cmd; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


_NO_MATPLOTLIB_RUN = """\
import sys
sys.modules["matplotlib"] = None  # any import of it now raises ImportError
import cli.bench.runner, cli.bench_cmd
from cli.main import main
def loaded():
    return sorted(m for m, mod in sys.modules.items()
                  if m.partition(".")[0] == "matplotlib" and mod is not None)
assert loaded() == [], loaded()
status = main(["bench", "--model", "tiny-llama", "--limit", "3", "-q", "--threads", "1",
               "--configs", "continuous-16,hf-16", "--workload", sys.argv[1],
               "--out-dir", sys.argv[2]])
print(status, loaded(), sys.modules["matplotlib"])
"""


def test_bench_without_the_plot_never_imports_matplotlib(tmp_path: Path) -> None:
    """matplotlib is the optional ``bench`` extra: importing the CLI and the harness, and a
    run that draws no occupancy plot (not both continuous-16 and static-16), work without it."""
    _small_workload(tmp_path / "w.jsonl")
    out = subprocess.run([sys.executable, "-c", _NO_MATPLOTLIB_RUN, str(tmp_path / "w.jsonl"),
                          str(tmp_path / "o")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "0 [] None"  # never tried: the placeholder is intact
    assert set(json.loads((tmp_path / "o" / "bench.json").read_text())["runs"]) == {
        "continuous-16", "hf-16"}


def test_without_matplotlib_the_run_skips_its_plot_and_says_why(tmp_path: Path, monkeypatch,
                                                      capsys) -> None:
    from cli.bench.plot import MISSING_MATPLOTLIB, plot_occupancy

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    try:
        plot_occupancy(tmp_path / "p.png", {"a": [1, 2]}, slots=2, title="t")
    except RuntimeError as exc:
        assert str(exc) == MISSING_MATPLOTLIB == (
            "plots need matplotlib: pip install 'inflight[bench]'")
    else:
        raise AssertionError("plot_occupancy drew without matplotlib")
    # a run that would draw the plot says it will not, and still writes its figures
    _small_workload(tmp_path / "w.jsonl")
    status = main(["bench", "--model", "tiny-llama", "--limit", "3", "-q", "--configs",
                   "static-16,continuous-16", "--workload", str(tmp_path / "w.jsonl"),
                   "--out-dir", str(tmp_path / "o")])
    assert status == 0
    assert MISSING_MATPLOTLIB in capsys.readouterr().err
    assert (tmp_path / "o" / "bench.json").exists()
    assert not (tmp_path / "o" / "bench_occupancy.png").exists()


def test_cli_config_names_match_the_runner() -> None:
    from cli.bench.runner import CONFIGS
    from cli.bench_cmd import _CONFIG_NAMES

    assert set(_CONFIG_NAMES) == set(CONFIGS)


def test_linear_fit_tells_a_line_from_a_curve() -> None:
    from cli.bench.linear_fit import fit_line

    line = fit_line([1000, 5000, 20000], [2.0 + 0.001 * n for n in (1000, 5000, 20000)])
    assert abs(line.slope - 0.001) < 1e-12 and abs(line.intercept - 2.0) < 1e-9
    assert abs(line.worst_ratio - 1.0) < 1e-9 and abs(line.marginal_growth - 1.0) < 1e-9
    curve = fit_line([1000, 5000, 20000], [1e-7 * n * n for n in (1000, 5000, 20000)])
    assert abs(curve.marginal_growth - 25_000 / 6_000) < 1e-9  # each line costs more later
    assert curve.worst_ratio > 1.2


def test_rss_of_a_child_process_is_sampled_over_its_run() -> None:
    from cli.bench.machine import RssSampler

    code = "import time; block = bytearray(64 << 20); time.sleep(1.0)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    with RssSampler(interval=0.05, pid=proc.pid) as rss:
        proc.wait()
    assert rss.peak >= 64 << 20  # the child's 64 MiB, not this process's memory
    assert len(rss.series) >= 5 and all(t >= 0 for t, _ in rss.series)
