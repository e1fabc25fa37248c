"""The peer system of the benchmark: vLLM for the CPU, run in its own virtual environment.

vLLM pins its own dependencies, so it never shares inflight's environment:
``benchmarks/peer/setup_vllm.sh`` installs it into ``.peer/vllm-venv`` and
``benchmarks/peer/vllm_run.py`` runs one workload there as a child process, on the same
token ids, output lengths and thread count as the engine's runs, timing only the
generation (load, compilation and warm-up excluded, as for every other system).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli.bench.workload import REPO_ROOT

DEFAULT_PEER_PYTHON = REPO_ROOT / ".peer" / "vllm-venv" / "bin" / "python"
PEER_SCRIPT = REPO_ROOT / "benchmarks" / "peer" / "vllm_run.py"
SETUP_HINT = "bash benchmarks/peer/setup_vllm.sh"


TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def preload_libraries(python: Path) -> str:
    """``LD_PRELOAD`` as vLLM's CPU guide recommends: tcmalloc and Intel's OpenMP runtime,
    each where it exists (the venv ships libiomp5; tcmalloc is Debian's package)."""
    venv_lib = Path(python).resolve().parent.parent / "lib"
    found = [p for p in (TCMALLOC, venv_lib / "libiomp5.so") if p.exists()]
    return ":".join(str(p) for p in found)


def run_vllm(*, python: Path, model_dir: Path, workload: Path, out_dir: Path,
             limit: int | None, threads: int | None, max_num_seqs: int | None = None
             ) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """Run vLLM on ``workload``; its figures (in the shape of the engine's runs) and each
    request's output token ids. The child's log goes to ``out_dir/vllm.log``."""
    if not Path(python).exists():
        raise OSError(f"no vLLM environment at {python}: run `{SETUP_HINT}` first")
    figures_path = out_dir / "vllm.json"
    tokens_path = out_dir / "vllm_tokens.jsonl"
    cmd = [str(python), str(PEER_SCRIPT), str(model_dir), str(workload),
           "--json-out", str(figures_path), "--tokens-out", str(tokens_path)]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    log_path = out_dir / "vllm.log"
    env = dict(os.environ)
    preload = preload_libraries(python)
    if preload:
        env["LD_PRELOAD"] = preload
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False,
                              stdin=subprocess.DEVNULL, env=env)
    if done.returncode != 0 or not figures_path.exists():
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise RuntimeError(f"vLLM exited with {done.returncode}; end of {log_path}:\n{tail}")
    peer = json.loads(figures_path.read_text(encoding="utf-8"))
    tokens = {}
    with open(tokens_path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            tokens[row["id"]] = row["token_ids"]
    if not peer.get("all_complete"):
        raise RuntimeError("vLLM did not produce every request's max_tokens; see " + str(log_path))
    run = {
        "kind": "peer", "system": peer["system"], "num_requests": peer["requests"],
        "useful_tokens": peer["useful_tokens"], "wall_seconds": peer["wall_s"],
        "cpu_seconds": peer["cpu_s"], "useful_tokens_per_s": peer["useful_tok_s"],
        "peak_rss_bytes": peer["peak_rss_bytes"], "load_seconds": peer["load_s"],
        "settings": peer.get("settings", {}), "num_steps": None, "mean_step_ms": None,
        "command": " ".join(cmd[1:]).replace(sys.executable, "python"),
    }
    return run, tokens
