"""The peer system of the benchmark: vLLM for the CPU, run in its own virtual environment.

vLLM pins its own dependencies, so it never shares inflight's environment:
``benchmarks/peer/setup_vllm.sh`` installs it into ``.peer/vllm-venv`` and
``benchmarks/peer/vllm_run.py`` runs one workload there as a child process, on the same
token ids, output lengths and thread count as the engine's runs, timing only the
generation (load, compilation and warm-up excluded, as for every other system).

A comparison is only fair against the peer at its best: :func:`search_vllm` tries its
preloads (its CPU guide's tcmalloc and Intel OpenMP, tcmalloc alone, none) and its batch
settings (sequences per step, batched tokens, prefix caching) one at a time from its
defaults, keeps each change that made it faster, and reports every try and the winner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cli.bench.workload import REPO_ROOT

DEFAULT_PEER_PYTHON = REPO_ROOT / ".peer" / "vllm-venv" / "bin" / "python"
PEER_SCRIPT = REPO_ROOT / "benchmarks" / "peer" / "vllm_run.py"
SETUP_HINT = "bash benchmarks/peer/setup_vllm.sh"


TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
PRELOADS = ("tcmalloc+iomp", "tcmalloc", "none")


@dataclass(frozen=True)
class PeerSettings:
    """One configuration of the peer: its ``LD_PRELOAD`` (one of PRELOADS) and the batch
    settings it is started with (None: vLLM's own default)."""

    preload: str = "tcmalloc+iomp"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool | None = None
    # False: the engine core in the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0),
    # which on 2 cores ran faster than its own process; None: vLLM's default (its own)
    multiprocessing: bool | None = None


# What the search tries, one setting at a time, from the defaults (None: vLLM's own).
SEARCH_SPACE: dict[str, tuple[Any, ...]] = {
    "preload": ("tcmalloc", "none"),
    "max_num_seqs": (64, 128),
    "max_num_batched_tokens": (2048, 8192),
    "prefix_caching": (False,),
    "multiprocessing": (False,),
}


def preload_libraries(python: Path, preload: str = "tcmalloc+iomp") -> str:
    """``LD_PRELOAD`` for ``preload``: vLLM's CPU guide recommends tcmalloc and Intel's
    OpenMP runtime, each where it exists (the venv ships libiomp5; tcmalloc is Debian's)."""
    if preload not in PRELOADS:
        raise ValueError(f"preload {preload!r}: expected one of {PRELOADS}")
    venv_lib = Path(python).resolve().parent.parent / "lib"
    wanted = {"tcmalloc+iomp": (TCMALLOC, venv_lib / "libiomp5.so"), "tcmalloc": (TCMALLOC,),
              "none": ()}[preload]
    return ":".join(str(p) for p in wanted if p.exists())


def peer_environment(settings: PeerSettings) -> dict[str, str]:
    """The peer's environment: this one without its preloads, and with vLLM's engine core
    in the calling process when ``settings.multiprocessing`` is False."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    if settings.multiprocessing is not None:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if settings.multiprocessing else "0"
    return env


def run_vllm(*, python: Path, model_dir: Path, workload: Path, out_dir: Path,
             limit: int | None, threads: int | None, settings: PeerSettings = PeerSettings(),
             memory_fraction: float | None = None
             ) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """Run vLLM on ``workload`` with ``settings``; its figures (in the shape of the
    engine's runs) and each request's output token ids. ``memory_fraction`` is the share
    of memory it may reserve (None: ``vllm_run.py``'s default). The child's log goes to
    ``out_dir/vllm.log``."""
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
    if memory_fraction is not None:
        cmd += ["--memory-fraction", str(memory_fraction)]
    if settings.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(settings.max_num_seqs)]
    if settings.max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    if settings.prefix_caching is not None:
        cmd += ["--prefix-caching", "on" if settings.prefix_caching else "off"]
    log_path = out_dir / "vllm.log"
    env = peer_environment(settings)
    preload = preload_libraries(python, settings.preload)
    if preload:
        env["LD_PRELOAD"] = preload
    figures_path.unlink(missing_ok=True)
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
        "settings": {**peer.get("settings", {}), "tried": asdict(settings)},
        "num_steps": None, "mean_step_ms": None,
        "command": " ".join(cmd[1:]).replace(sys.executable, "python"),
    }
    return run, tokens


def search_vllm(run_one: Callable[[PeerSettings], tuple[dict[str, Any], dict[str, list[int]]]],
                say: Callable[[str], None] = print
                ) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """The peer at its best: from its defaults, try each alternative of SEARCH_SPACE one
    setting at a time and keep it when the run was faster. Returns the fastest run (its
    ``search`` lists every try and says which won) and its tokens."""
    best_settings = PeerSettings()
    best, best_tokens = run_one(best_settings)
    tries = [{"settings": asdict(best_settings), "tokens_per_s": best["useful_tokens_per_s"]}]
    say(f"  vllm {asdict(best_settings)}: {best['useful_tokens_per_s']:.1f} tok/s")
    for name, values in SEARCH_SPACE.items():
        for value in values:
            settings = replace(best_settings, **{name: value})
            try:
                run, tokens = run_one(settings)
            except RuntimeError as exc:  # a setting vLLM refuses is a try, not the end
                tries.append({"settings": asdict(settings), "error": str(exc)[-300:]})
                say(f"  vllm {asdict(settings)}: failed")
                continue
            tries.append({"settings": asdict(settings), "tokens_per_s": run["useful_tokens_per_s"]})
            say(f"  vllm {asdict(settings)}: {run['useful_tokens_per_s']:.1f} tok/s")
            if run["useful_tokens_per_s"] > best["useful_tokens_per_s"]:
                best, best_tokens, best_settings = run, tokens, settings
    best["search"] = {"tries": tries, "best": asdict(best_settings)}
    return best, best_tokens
