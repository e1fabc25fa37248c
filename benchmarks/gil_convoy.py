"""What a thread busy in Python costs a small engine step, at several switch intervals.

    .venv/bin/python -m benchmarks.gil_convoy [--model smollm2-135m] [--threads 2]

Times the prompt step of a 150-token request (median of 5) alone, then beside a second
thread that runs Python (``--duty`` of each 10 ms, 1.0: all the time) at each interpreter
switch interval (``sys.setswitchinterval``). Every torch call of the step gives the GIL up;
taking it back waits up to one switch interval while the other thread runs Python, and a
step of a few sequences makes hundreds of such calls. The worker's own threads (writer,
intake, delta publisher) are that other thread; ``inflight worker --gil-switch-ms`` sets
the interval (docs/benchmarks.md, "interjected steps").
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from worker.engine import LLMEngine, SamplingParams

INTERVALS_S = (0.005, 0.001, 0.0005, 0.0002)


def prompt_step_ms(engine: LLMEngine, repeats: int = 5) -> float:
    """Median wall time of a 150-token prompt's step, in ms (each request then finished)."""
    times = []
    for k in range(repeats):
        engine.add_request(f"probe-{time.monotonic_ns()}-{k}", list(range(100, 250)),
                           SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
        while engine.has_unfinished_requests():
            engine.step()
    return 1000 * sorted(times)[len(times) // 2]


def busy_python(stop: threading.Event, duty: float) -> None:
    """Run Python ``duty`` of every 10 ms until ``stop``."""
    x = 0
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < 0.010 * duty:
            for i in range(100):
                x += i
        if duty < 1.0:
            time.sleep(0.010 * (1 - duty))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--duty", type=float, action="append", default=None,
                   help="share of the time the other thread runs Python (repeatable; default 1.0 and 0.3)")
    args = p.parse_args(argv)
    engine = LLMEngine(model=args.model, max_num_seqs=8, num_threads=args.threads)
    prompt_step_ms(engine, 2)  # warm up
    default_interval = sys.getswitchinterval()
    print("| other thread | " + " | ".join(f"{s * 1000:g} ms interval" for s in INTERVALS_S) + " |")
    print("|---|" + "---:|" * len(INTERVALS_S))
    for duty in [0.0, *(args.duty or [1.0, 0.3])]:
        stop = threading.Event()
        other = threading.Thread(target=busy_python, args=(stop, duty), daemon=True)
        if duty:
            other.start()
        row = []
        for interval in INTERVALS_S:
            sys.setswitchinterval(interval)
            row.append(prompt_step_ms(engine))
        stop.set()
        if duty:
            other.join()
        sys.setswitchinterval(default_interval)
        name = f"Python {duty:.0%} of the time" if duty else "none"
        print(f"| {name} | " + " | ".join(f"{ms:.1f}" for ms in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
