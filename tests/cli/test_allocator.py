"""The engine commands restart themselves on tcmalloc where it is installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli import allocator
from cli.allocator import (
    ALLOCATOR_ENV,
    PRELOADED_ENV,
    PREVIOUS_PRELOAD_ENV,
    find_tcmalloc,
    restart_environment,
    restart_with_tcmalloc,
)
from cli.bench.machine import mapped_allocator

LIB = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def test_find_tcmalloc_takes_the_first_directory_holding_it(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert find_tcmalloc([str(first), str(second)]) is None
    (second / "libtcmalloc.so.4").write_bytes(b"")
    assert find_tcmalloc([str(first), str(second)]) == str(second / "libtcmalloc.so.4")
    (first / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_tcmalloc([str(first), str(second)]) == str(first / "libtcmalloc_minimal.so.4")


def test_restart_environment_preloads_tcmalloc_before_what_was_there() -> None:
    env = restart_environment({"PATH": "/bin", "LD_PRELOAD": "/opt/libx.so"}, LIB)
    assert env is not None
    assert env["LD_PRELOAD"] == f"{LIB}:/opt/libx.so"
    assert env[PRELOADED_ENV] == LIB
    assert env[PREVIOUS_PRELOAD_ENV] == "/opt/libx.so"
    assert env["PATH"] == "/bin"
    assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40
    fresh = restart_environment({}, LIB)
    assert fresh is not None and fresh["LD_PRELOAD"] == LIB and fresh[PREVIOUS_PRELOAD_ENV] == ""


@pytest.mark.parametrize("environ, library", [
    ({ALLOCATOR_ENV: "system"}, LIB),  # the user keeps glibc's malloc
    ({ALLOCATOR_ENV: " System "}, LIB),
    ({}, None),  # nothing installed
    ({"LD_PRELOAD": LIB}, LIB),  # already preloaded by the user
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, LIB),  # another allocator chosen
    ({PRELOADED_ENV: LIB}, LIB),  # this is the restarted process
])
def test_no_restart_when_not_wanted(environ: dict[str, str], library: str | None) -> None:
    assert restart_environment(environ, library) is None


def test_an_unknown_allocator_is_refused() -> None:
    with pytest.raises(ValueError, match="INFLIGHT_ALLOCATOR='mimalloc'"):
        restart_environment({ALLOCATOR_ENV: "mimalloc"}, LIB)


def test_the_restarted_process_puts_ld_preload_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRELOADED_ENV, LIB)
    monkeypatch.setenv(PREVIOUS_PRELOAD_ENV, "/opt/libx.so")
    monkeypatch.setenv("LD_PRELOAD", f"{LIB}:/opt/libx.so")
    monkeypatch.setattr(allocator.os, "execve", lambda *a: pytest.fail("restarted twice"))
    restart_with_tcmalloc()
    assert os.environ["LD_PRELOAD"] == "/opt/libx.so"
    assert PRELOADED_ENV not in os.environ and PREVIOUS_PRELOAD_ENV not in os.environ
    monkeypatch.setenv(PRELOADED_ENV, LIB)
    monkeypatch.setenv(PREVIOUS_PRELOAD_ENV, "")
    restart_with_tcmalloc()
    assert "LD_PRELOAD" not in os.environ


def test_a_failed_restart_goes_on_with_the_system_allocator(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("LD_PRELOAD", ALLOCATOR_ENV, PRELOADED_ENV, PREVIOUS_PRELOAD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: LIB)

    def refuse(*args: object) -> None:
        raise PermissionError("denied")

    monkeypatch.setattr(allocator.os, "execve", refuse)
    restart_with_tcmalloc()
    assert "not restarting on tcmalloc (denied)" in capsys.readouterr().err
    assert "LD_PRELOAD" not in os.environ


def test_mapped_allocator_reads_the_process_maps() -> None:
    assert mapped_allocator("7f00 r-xp 0 08:01 1 /usr/lib/libc.so.6\n") == "system"
    assert mapped_allocator(f"7f00 r-xp 0 08:01 1 {LIB}\n") == "tcmalloc"
    assert mapped_allocator("7f00 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n") == "jemalloc"


def test_bench_command_runs_on_tcmalloc_when_installed(tmp_path: Path) -> None:
    """End to end through the command line: the bench records the allocator its engine ran
    on, and the processes it starts do not inherit the preload."""
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(
        json.dumps({"id": f"r{i}", "prompt_token_ids": [5, 6, 7 + i], "max_tokens": 4}) + "\n"
        for i in range(3)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", ALLOCATOR_ENV, PRELOADED_ENV, PREVIOUS_PRELOAD_ENV)}
    code = ("import os, sys; from cli.main import main; status = main(); "
            "print('child LD_PRELOAD=' + os.environ.get('LD_PRELOAD', '')); sys.exit(status)")
    result = subprocess.run(
        [sys.executable, "-c", code, "bench", "--model", "tiny-llama", "--configs", "inflight",
         "--skip-hf", "--threads", "1", "-q", "--workload", str(workload),
         "--out-dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    machine = json.loads((tmp_path / "out" / "bench.json").read_text())["machine"]
    assert machine["allocator"] == ("tcmalloc" if find_tcmalloc() else "system")
    assert f"allocator {machine['allocator']}" in result.stdout
    assert "child LD_PRELOAD=\n" in result.stdout  # put back before the command ran


RSS_AFTER_FREE = """
import sys, torch
from cli.allocator import release_free_memory
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) // 1024
blocks = [torch.ones(2 ** 20) for _ in range(400)]  # 400 x 4 MiB, each written
held = rss_mb()
del blocks
kept = rss_mb()
called = release_free_memory()
print(called, held, kept, rss_mb())
"""


@pytest.mark.parametrize("preload", [False, True])
def test_freed_memory_goes_back_to_the_system(preload: bool) -> None:
    """A process that freed 1.6 GB gives it back (tcmalloc keeps freed pages otherwise), so
    a peer started next finds it free."""
    library = find_tcmalloc()
    if preload and library is None:
        pytest.skip("tcmalloc is not installed here")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = str(library)
    result = subprocess.run([sys.executable, "-c", RSS_AFTER_FREE], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    called, held, _kept, after = result.stdout.split()
    assert called == ("MallocExtension_ReleaseFreeMemory" if preload else "malloc_trim")
    assert int(held) - int(after) > 1200, result.stdout  # MB given back of the 1,600 freed
