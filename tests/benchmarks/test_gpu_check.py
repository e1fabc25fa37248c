"""benchmarks/gpu_check.py end to end on the CPU (``--device cpu --quick``), and its parts.

The CPU run proves the script itself before any GPU sees it: every section runs (the
CUDA-only ones are skipped with their reason) and both reports are written. No figure
of it is a GPU figure, and nothing here asserts a speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpucheck.parity import compare
from benchmarks.gpucheck.pytest_runs import run_pytest
from benchmarks.gpucheck.report import FAILED, PASSED, SKIPPED, run_section
from benchmarks.gpucheck.throughput import make_gpu_workload, padded_to_cohort_max

CUDA_ONLY = {"kernel_tests", "gpu_tests"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("gpu_check")
    threads = torch.get_num_threads()
    try:  # tiny shapes gain nothing from more threads on a shared machine
        torch.set_num_threads(1)
        status = gpu_check.main([str(out), "--device", "cpu", "--quick"])
    finally:
        torch.set_num_threads(threads)
    return status, out


def test_quick_cpu_run_passes_every_section(quick_run: tuple[int, Path]) -> None:
    status, out = quick_run
    data = json.loads((out / "gpu_check.json").read_text())
    assert status == 0 and data["status"] == PASSED
    assert data["gpu_figures"] is False and data["quick"] is True
    assert data["device"]["type"] == "cpu"
    assert [s["name"] for s in data["sections"]] == list(gpu_check.SECTIONS)
    for section in data["sections"]:
        assert section["error"] is None, section["error"]
        assert isinstance(section["seconds"], float)
        if section["name"] in CUDA_ONLY:
            assert section["status"] == SKIPPED
            assert all(c["status"] == SKIPPED and "no CUDA device" in c["reason"]
                       for c in section["checks"])
        else:
            assert section["status"] == PASSED, section["checks"]
            assert all(c["status"] in (PASSED, SKIPPED) for c in section["checks"])


def test_quick_cpu_run_skips_device_specific_parts_with_a_reason(
        quick_run: tuple[int, Path]) -> None:
    data = json.loads((quick_run[1] / "gpu_check.json").read_text())
    sections = {s["name"]: s for s in data["sections"]}
    capture = [c for c in sections["decode_graphs"]["checks"] if c["status"] == SKIPPED]
    assert [c["name"] for c in capture] == ["CUDA graph capture"] and capture[0]["reason"]
    parity = [c["name"] for c in sections["parity"]["checks"]]
    assert parity == [f"{m} {d}" for m in ("tiny-llama", "llama-3.2-1b", "qwen2.5-0.5b")
                      for d in ("bfloat16", "float32")]
    runs = sections["throughput"]["figures"]["runs"]
    assert set(runs) == {"engine continuous, graphs", "engine continuous, no graphs",
                         "engine continuous, graphs, torch element-wise ops",
                         "engine static-padded", "HF static generate",
                         "HF continuous batching"}  # the engine's own padded lockstep policy
    assert all(r["useful_tokens_per_s"] > 0 for r in runs.values())
    workload = sections["throughput"]["figures"]["workload"]
    assert all(r["useful_tokens"] == workload["useful_tokens"] for r in runs.values())
    assert runs["engine continuous, graphs, torch element-wise ops"]["element_wise_ops"] == "torch"
    engine_runs = [r for name, r in runs.items() if name.startswith("engine")]
    assert all(0 < r["device_busy_fraction"] <= 1 for r in engine_runs)  # the host's forward and sampler here
    steps = sections["bandwidth"]["figures"]["decode_steps"]
    assert [r["batch"] for r in steps] == [1, 4, 8]
    torch_steps = sections["bandwidth"]["figures"]["decode_steps_torch_ops"]  # the A/B's other side
    assert [r["batch"] for r in torch_steps] == [1, 4, 8] and all(r["step_ms"] > 0 for r in torch_steps)
    assert all(g["met"] is None for g in data["goals"])  # CPU figures meet no GPU goal


def test_quick_cpu_run_writes_a_markdown_report(quick_run: tuple[int, Path]) -> None:
    text = (quick_run[1] / "gpu_check.md").read_text()
    assert text.startswith("# GPU check: PASSED")
    assert "none of its figures are GPU figures" in text
    for title in gpu_check.TITLES.values():
        assert f"## {title}: " in text
    assert ("| run | tokens/s | wall s | steps | step ms | device busy | slot util | KV waste | complete |"
            in text)


def test_a_failing_section_is_recorded_and_does_not_raise() -> None:
    def broken(rec):
        rec.check("first", True)
        raise RuntimeError("boom")

    result = run_section("broken", "Broken", broken)
    assert result["status"] == FAILED and "RuntimeError: boom" in result["error"]
    assert run_section("skipped", "Skipped", broken, skip_reason="why")["status"] == SKIPPED
    assert run_section("ok", "Ok", lambda rec: rec.check("x", True))["status"] == PASSED
    assert run_section("bad", "Bad", lambda rec: rec.check("x", False, "r"))["status"] == FAILED

    def one_part_breaks(rec):
        assert rec.attempt("part 1", lambda: 1 / 0) is None
        assert rec.attempt("part 2", lambda: 2) == 2
        rec.check("part 2 ran", True)

    result = run_section("parts", "Parts", one_part_breaks)
    assert result["status"] == FAILED and result["error"] is None
    assert [(c["name"], c["status"]) for c in result["checks"]] == [
        ("part 1", FAILED), ("part 2 ran", PASSED)]
    assert "ZeroDivisionError" in result["checks"][0]["reason"]


def test_pytest_runner_counts_outcomes_and_keeps_failures(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_skip(): pass\n")
    result = run_pytest(["test_sample.py"], cwd=tmp_path, timeout_s=60)
    assert (result.passed, result.failed, result.errors, result.skipped) == (1, 1, 0, 1)
    assert not result.ok and result.returncode == 1
    assert "test_bad" in result.failures[0] and "one is not two" in result.failures[0]
    assert result.skip_reasons == ["not here"]


def test_parity_accepts_only_near_ties() -> None:
    scores = [torch.tensor([0.0, 5.0, 4.999, 1.0]), torch.tensor([0.0, 1.0, 9.0, 1.0])]
    tie = compare([1, 2], [1, 2], scores)
    assert tie.matched == 2 and tie.verdict("float32")
    near = compare([2, 2], [1, 2], scores)  # ours took the runner-up of a 0.001 gap
    assert near.matched == 0 and near.verdict("bfloat16")
    wrong = compare([1, 3], [1, 2], scores)  # a clear loser at the second token
    assert wrong.matched == 1 and not wrong.verdict("bfloat16")


def test_workload_is_seeded_heavy_tailed_and_padding_keeps_cohorts() -> None:
    requests = make_gpu_workload(seed=3, num_requests=300, vocab_size=1000, max_output=1024)
    again = make_gpu_workload(seed=3, num_requests=300, vocab_size=1000, max_output=1024)
    assert requests == again
    outs = [r.max_tokens for r in requests]
    assert min(outs) >= 8 and max(outs) <= 1024 and max(outs) > 4 * sorted(outs)[150]
    assert all(32 <= t < 1000 for r in requests for t in r.prompt_token_ids)
    padded = padded_to_cohort_max(requests[:5], 2)
    assert [r.max_tokens for r in padded] == [max(outs[0:2])] * 2 + [max(outs[2:4])] * 2 + [outs[4]]
