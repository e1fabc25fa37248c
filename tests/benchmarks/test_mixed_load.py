"""benchmarks/mixed_load.py: its parts, and a whole tiny run on the tiny model through the
real stack (API and worker processes, Redis, PostgreSQL). No figure is asserted: the run
proves the script measures every part and writes its JSON and plot."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from benchmarks import mixed_load
from benchmarks.mixed_load_batch import Window, shifted
from benchmarks.mixed_load_plot import binned
from benchmarks.stream_timing import StreamTiming


def test_a_stream_timing_is_first_content_and_the_tokens_after_it() -> None:
    t = StreamTiming(sent=10.0, first_token=10.5, last_token=12.5, completion_tokens=5)
    assert t.ttft == pytest.approx(0.5) and t.tpot == pytest.approx(0.5)
    assert StreamTiming(sent=1.0, first_token=2.0, last_token=2.0, completion_tokens=1).tpot is None
    assert StreamTiming(sent=1.0, error="HTTP 429").ttft is None


def test_summary_counts_failures_and_leaves_them_out() -> None:
    ok = [StreamTiming(sent=0.0, first_token=0.1 * i, last_token=1.0, completion_tokens=3)
          for i in range(1, 11)]
    summary = mixed_load.latency_summary([*ok, StreamTiming(sent=0.0, error="HTTP 500")])
    assert summary["requests"] == 11 and summary["failed"] == 1
    assert summary["ttft_p50_s"] == pytest.approx(0.55)
    assert summary["ttft_p99_s"] <= 1.0 and summary["tpot_p50_s"] > 0


def test_the_batch_file_is_natural_language_chat_lines() -> None:
    turns = ["How do tides work?", "Name a fruit."]
    lines = [json.loads(x) for x in mixed_load.batch_file("m", 5, turns, max_tokens=50)
             .decode().splitlines()]
    assert [x["custom_id"] for x in lines] == [f"line-{i}" for i in range(5)]
    assert {x["url"] for x in lines} == {"/v1/chat/completions"}
    assert [x["body"]["messages"][1]["content"] for x in lines] == [*turns, *turns, turns[0]]
    assert all(x["body"]["messages"][0]["role"] == "system" for x in lines)
    assert all(8 <= x["body"]["max_tokens"] <= 50 and x["body"]["ignore_eos"] for x in lines)


def test_targets_compare_backlog_with_idle_and_batch_with_itself() -> None:
    got = mixed_load.targets({"ttft_p99_s": 0.1}, {"ttft_p99_s": 0.3},
                             {"batch_tokens_per_s": 100.0}, {"batch_tokens_per_s": 95.0})
    assert got["ttft_p99_ratio"] == pytest.approx(3.0) and not got["ttft_met"]
    assert got["batch_kept"] == pytest.approx(0.95) and got["batch_met"]
    drifting = mixed_load.targets({"ttft_p99_s": 0.1}, {"ttft_p99_s": 0.15},
                                  {"batch_tokens_per_s": 110.0}, {"batch_tokens_per_s": 90.0},
                                  {"batch_tokens_per_s": 90.0})
    assert drifting["batch_kept"] == pytest.approx(0.9) and drifting["batch_met"]  # of the mean, 100
    assert drifting["batch_kept_of"] == "windows"


def test_with_a_control_run_the_batch_is_compared_with_its_same_stretch_alone() -> None:
    mixed = {"batch_tokens_per_s": 85.0, "interactive_decode_tokens": 100, "seconds": 10.0}
    got = mixed_load.targets({"ttft_p99_s": 0.1}, {"ttft_p99_s": 0.15},
                             {"batch_tokens_per_s": 200.0}, mixed,
                             {"batch_tokens_per_s": 100.0}, {"batch_tokens_per_s": 100.0})
    assert got["batch_kept"] == pytest.approx(0.85) and not got["batch_met"]
    assert got["decode_rows_kept"] == pytest.approx(0.95)  # 85 + 10 interactive rows/s
    assert got["batch_kept_of"] == "control"
    assert got["batch_kept_of_windows"] == pytest.approx(85.0 / 150.0)


def test_a_window_moves_to_the_control_runs_timeline() -> None:
    moved = shifted(Window(105.0, 160.0), origin=100.0, to=500.0)
    assert (moved.start, moved.end) == (505.0, 560.0) and moved.seconds == 55.0


def test_decode_rows_are_binned_per_second() -> None:
    steps = [[100.5, 10, 5, 1.0], [101.5, 30, 5, 1.0], [102.5, 8, 5, 1.0]]
    assert binned(steps, origin=100.0, width=2.0) == {0: 20.0, 1: 4.0}


def test_finish_batch_is_refused_beside_the_control_run(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def ran(_args: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(mixed_load, "run", ran)
    with pytest.raises(SystemExit):
        mixed_load.main(["--finish-batch"])
    assert "--no-control" in capsys.readouterr().err


def _serving() -> bool:
    for port in (5432, 6379):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
    return True


@pytest.mark.services
@pytest.mark.slow
def test_a_tiny_run_measures_every_part(tmp_path: Path) -> None:
    if not _serving():
        pytest.skip("needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379")
    pytest.importorskip("matplotlib")
    out, plot = tmp_path / "mixed.json", tmp_path / "mixed.png"
    assert mixed_load.main([
        "--model", "tiny-llama", "--batch-lines", "200", "--batch-max-tokens", "1000",
        "--requests", "4", "--rate", "4", "--interactive-max-tokens", "8",
        "--batch-warmup", "0.5", "--batch-window", "1", "--overhead-requests", "2",
        "--threads", "1", "--worker-arg=--max-num-seqs=8",
        "--out", str(out), "--plot", str(plot)]) == 0
    fig = json.loads(out.read_text())
    for part in ("idle", "backlog"):
        assert fig[part]["requests"] == 4 and fig[part]["failed"] == 0
        assert all(r["completion_tokens"] == 8 for r in fig["requests"][part])
        assert fig[part]["parts"]["engine_steps_p50"] >= 1
    assert fig["overhead"]["requests"] == 2 and fig["overhead"]["decode_step_s"] > 0
    for window in ("batch_alone", "batch_alone_after"):
        assert fig[window]["steps"] > 0 and fig[window]["batch_decode_tokens"] > 0
    assert fig["batch_with_interactive"]["interactive_decode_tokens"] == 4 * 7
    for window in ("before", "with_interactive", "after"):  # the control run, same stretches
        assert fig["control"][window]["steps"] > 0
        assert fig["control"][window]["interactive_decode_tokens"] == 0
    assert fig["targets"]["batch_kept_of"] == "control"
    assert fig["cores_used"]["with_interactive"]["worker"] > 0
    assert set(fig["cores_used"]["control"]) == set(fig["cores_used"]["with_interactive"])
    control_times = [s[0] for s in fig["control_steps"]]  # moved onto this run's timeline
    assert control_times and min(control_times) >= fig["windows"]["alone"][0]
    assert max(control_times) < fig["windows"]["after"][1]
    assert plot.stat().st_size > 0
