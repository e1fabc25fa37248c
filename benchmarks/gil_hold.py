"""How long a worker's side threads wait for the interpreter while the engine steps.

    .venv/bin/python -m benchmarks.gil_hold [--seqs 128] [--seconds 15] [--threads 2]

The main thread decodes ``--seqs`` sequences of SmolLM2 (as the worker's engine loop does);
a side thread does Redis PINGs on 127.0.0.1:6379 every 2 ms (as the intake, the result
writer and the text-delta publisher do their round trips) and its round-trip times are
printed as percentiles, next to the same PINGs with the engine idle. A native kernel that
holds the GIL makes each round trip wait out the kernel call in progress; the kernels'
entry points release it (``kernels/csrc``: ``py::call_guard<py::gil_scoped_release>``).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import redis

from worker.engine import EngineArgs, LLMEngine, SamplingParams


def pings(client: redis.Redis, stop: threading.Event, out: list[float]) -> None:
    """PING until ``stop``, each round trip's seconds appended to ``out``."""
    while not stop.is_set():
        t = time.perf_counter()
        client.ping()
        out.append(time.perf_counter() - t)
        time.sleep(0.002)


def describe(name: str, seconds: list[float]) -> str:
    """p50 / p90 / p99 / max in ms."""
    q = np.percentile(seconds, [50, 90, 99]) * 1000
    return (f"{name}: {len(seconds)} pings, ms p50 {q[0]:.2f} p90 {q[1]:.2f} p99 {q[2]:.2f} "
            f"max {max(seconds) * 1000:.1f}")


def main(argv: list[str] | None = None) -> int:
    """Decode with and without the side thread; print the step time and the PINGs."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=128)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    engine = LLMEngine(EngineArgs(model="smollm2-135m", num_threads=args.threads))
    params = SamplingParams(max_tokens=2000, ignore_eos=True, temperature=0)
    for i in range(args.seqs):
        prompt = engine.tokenize(prompt=f"Item {i}: tell me a long story about the sea and")
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(5):  # the prefill
        engine.step()
    client = redis.Redis()
    client.ping()
    idle: list[float] = []
    stop = threading.Event()
    side = threading.Thread(target=pings, args=(client, stop, idle))
    side.start()
    time.sleep(3)
    stop.set()
    side.join()
    busy: list[float] = []
    stop.clear()
    side = threading.Thread(target=pings, args=(client, stop, busy))
    side.start()
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds:
        engine.step()
        steps += 1
    stop.set()
    side.join()
    step_ms = (time.perf_counter() - start) / steps * 1000
    print(describe("engine idle", idle))
    print(describe(f"engine decoding {args.seqs} sequences ({step_ms:.0f} ms/step)", busy))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
